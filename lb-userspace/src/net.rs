//! What `lbd` asks the kernel's networking tables, over rtnetlink: the
//! default route's gateway on an interface and that gateway's MAC address
//! from the neighbour table; and [`watch_gateway`], the task that looks
//! them up again periodically, off the daemon's loop.
//!
//! Every dump (routes, neighbours) is read to its end before it is
//! searched: a dump abandoned half-way leaves netlink answers with no one
//! to take them, which the netlink layer logs as warnings.

use std::{
    net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket},
    time::Duration,
};

use futures::TryStreamExt as _;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::{
        link::LinkMessage,
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState},
        route::{RouteAddress, RouteAttribute},
    },
};
use thiserror::Error;
use tokio::sync::watch;

use crate::config::Mac;

#[derive(Debug, Error)]
pub enum NetError {
    #[error("netlink: {0}")]
    Netlink(String),
    #[error("interface {0} does not exist")]
    NoInterface(String),
    #[error("no default route via {0}: set gateway_mac explicitly, or add a default route")]
    NoDefaultRoute(String),
    #[error(
        "gateway {gateway} on {iface} has no neighbour entry (not answering ARP/ND?); set gateway_mac explicitly"
    )]
    NoNeighbour { gateway: IpAddr, iface: String },
}

fn nl(e: impl std::fmt::Display) -> NetError {
    NetError::Netlink(e.to_string())
}

async fn connect() -> Result<Handle, NetError> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(nl)?;
    tokio::spawn(connection);
    Ok(handle)
}

async fn ifindex_with(handle: &Handle, name: &str) -> Result<u32, NetError> {
    Ok(link_by_name(handle, name).await?.header.index)
}

/// Interface `name`'s link message.
async fn link_by_name(handle: &Handle, name: &str) -> Result<LinkMessage, NetError> {
    let links: Vec<_> = handle
        .link()
        .get()
        .match_name(name.to_string())
        .execute()
        .try_collect()
        .await
        .map_err(|_| NetError::NoInterface(name.into()))?;
    links
        .into_iter()
        .next()
        .ok_or_else(|| NetError::NoInterface(name.into()))
}

/// How an interface runs its XDP program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttachMode {
    /// In the driver (`xdp_mode: native`).
    Driver,
    /// Generic, on the socket buffer (`xdp_mode: generic`).
    Generic,
    /// Offloaded to the NIC, or several at once: never lb's.
    Other,
}

/// The XDP program an interface runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpAttachment {
    pub program: u32,
    pub mode: XdpAttachMode,
}

/// Interface `name`'s index (a new one when the interface was deleted and
/// made again) and the XDP program attached to it, if one is.
pub async fn xdp_state(name: &str) -> Result<(u32, Option<XdpAttachment>), NetError> {
    use rtnetlink::packet_route::link::{LinkAttribute, LinkXdp, XdpAttached};
    let link = link_by_name(&connect().await?, name).await?;
    let (mut one, mut driver, mut generic, mut mode) = (None, None, None, XdpAttachMode::Other);
    for a in &link.attributes {
        let LinkAttribute::Xdp(xdp) = a else { continue };
        for x in xdp {
            match *x {
                LinkXdp::ProgId(id) if id != 0 => one = Some(id),
                LinkXdp::DrvProgId(id) if id != 0 => driver = Some(id),
                LinkXdp::SkbProgId(id) if id != 0 => generic = Some(id),
                LinkXdp::Attached(XdpAttached::Driver) => mode = XdpAttachMode::Driver,
                LinkXdp::Attached(XdpAttached::SocketBuffer) => mode = XdpAttachMode::Generic,
                _ => {}
            }
        }
    }
    // One program: its id and mode. Several at once (an offloaded one
    // beside it): no single id, but one per mode.
    let attached = one
        .map(|program| XdpAttachment { program, mode })
        .or(driver.map(|program| XdpAttachment {
            program,
            mode: XdpAttachMode::Driver,
        }))
        .or(generic.map(|program| XdpAttachment {
            program,
            mode: XdpAttachMode::Generic,
        }));
    Ok((link.header.index, attached))
}

async fn default_gateway(handle: &Handle, ifindex: u32, iface: &str) -> Result<IpAddr, NetError> {
    let v4 = RouteMessageBuilder::<std::net::Ipv4Addr>::new().build();
    let v6 = RouteMessageBuilder::<std::net::Ipv6Addr>::new().build();
    for query in [v4, v6] {
        let routes: Vec<_> = handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(nl)?;
        for route in routes {
            if route.header.destination_prefix_length != 0 {
                continue;
            }
            let mut oif = None;
            let mut gateway = None;
            for attr in &route.attributes {
                match attr {
                    RouteAttribute::Oif(i) => oif = Some(*i),
                    RouteAttribute::Gateway(RouteAddress::Inet(a)) => {
                        gateway = Some(IpAddr::V4(*a))
                    }
                    RouteAttribute::Gateway(RouteAddress::Inet6(a)) => {
                        gateway = Some(IpAddr::V6(*a))
                    }
                    _ => {}
                }
            }
            if let (Some(gw), Some(oif)) = (gateway, oif)
                && oif == ifindex
            {
                return Ok(gw);
            }
        }
    }
    Err(NetError::NoDefaultRoute(iface.into()))
}

async fn neighbour_mac(
    handle: &Handle,
    ifindex: u32,
    gateway: IpAddr,
) -> Result<Option<Mac>, NetError> {
    let neighbours: Vec<_> = handle
        .neighbours()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(nl)?;
    for n in neighbours {
        if n.header.ifindex != ifindex
            || matches!(
                n.header.state,
                NeighbourState::Failed | NeighbourState::Incomplete | NeighbourState::None
            )
        {
            continue;
        }
        let mut dst = None;
        let mut lladdr = None;
        for attr in &n.attributes {
            match attr {
                NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => {
                    dst = Some(IpAddr::V4(*a))
                }
                NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => {
                    dst = Some(IpAddr::V6(*a))
                }
                NeighbourAttribute::LinkLayerAddress(l) if l.len() == 6 => {
                    lladdr = Some(Mac([l[0], l[1], l[2], l[3], l[4], l[5]]))
                }
                _ => {}
            }
        }
        if dst == Some(gateway)
            && let Some(mac) = lladdr
        {
            return Ok(Some(mac));
        }
    }
    Ok(None)
}

/// Makes the kernel resolve `gateway` by sending it one empty UDP datagram
/// (to the discard port).
fn poke(gateway: IpAddr, ifindex: u32) {
    let (bind, to): (SocketAddr, SocketAddr) = match gateway {
        IpAddr::V4(a) => ("0.0.0.0:0".parse().expect("literal"), (a, 9).into()),
        IpAddr::V6(a) => (
            "[::]:0".parse().expect("literal"),
            SocketAddrV6::new(a, 9, 0, ifindex).into(),
        ),
    };
    if let Ok(s) = UdpSocket::bind(bind) {
        let _ = s.send_to(&[], to);
    }
}

/// The MAC address of `iface`'s default gateway, resolving it if the
/// neighbour table has no entry yet (for up to about three seconds).
pub async fn gateway_mac(iface: &str) -> Result<(IpAddr, Mac), NetError> {
    let handle = connect().await?;
    let index = ifindex_with(&handle, iface).await?;
    let gateway = default_gateway(&handle, index, iface).await?;
    for attempt in 0..30 {
        if let Some(mac) = neighbour_mac(&handle, index, gateway).await? {
            return Ok((gateway, mac));
        }
        if attempt % 10 == 0 {
            poke(gateway, index);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(NetError::NoNeighbour {
        gateway,
        iface: iface.into(),
    })
}

/// What the gateway watcher knows: the last gateway and MAC it resolved,
/// whether a lookup is under way, and the last lookup's error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatewayState {
    pub gateway: Option<IpAddr>,
    pub mac: Option<Mac>,
    /// A lookup is running now (it may take seconds when the gateway does
    /// not answer ARP/ND): the daemon goes on meanwhile.
    pub looking_up: bool,
    /// Why the last lookup failed; `None` once one succeeds again.
    pub error: Option<String>,
}

/// Looks the gateway of `iface` up every `every` on a task of its own and
/// publishes each change of [`GatewayState`]. The MAC and errors are
/// logged when they change, not on every lookup. Starts from `first`
/// (what start-up resolved).
pub fn watch_gateway(
    iface: String,
    every: Duration,
    first: (IpAddr, Mac),
) -> (watch::Receiver<GatewayState>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(GatewayState {
        gateway: Some(first.0),
        mac: Some(first.1),
        looking_up: false,
        error: None,
    });
    let task = tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            tx.send_modify(|s| s.looking_up = true);
            let result = gateway_mac(&iface).await;
            let before = tx.borrow().clone();
            let mut next = GatewayState {
                looking_up: false,
                ..before.clone()
            };
            match result {
                Ok((gateway, mac)) => {
                    if before.mac != Some(mac) || before.gateway != Some(gateway) {
                        tracing::info!(gateway = %gateway, mac = %mac, iface = %iface, "gateway changed");
                    } else if before.error.is_some() {
                        tracing::info!(gateway = %gateway, mac = %mac, iface = %iface, "gateway lookups work again");
                    }
                    next.gateway = Some(gateway);
                    next.mac = Some(mac);
                    next.error = None;
                }
                Err(e) => {
                    let e = e.to_string();
                    if before.error.as_ref() != Some(&e) {
                        tracing::warn!(iface = %iface, error = %e, "gateway lookup failed; keeping the last MAC");
                    }
                    next.error = Some(e);
                }
            }
            if tx.send(next).is_err() {
                return;
            }
        }
    });
    (rx, task)
}
