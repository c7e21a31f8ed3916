//! What `lbd` asks the kernel's networking tables, over rtnetlink: the
//! default route's gateway on an interface and that gateway's MAC address
//! from the neighbour table.

use std::{
    net::{IpAddr, SocketAddr, SocketAddrV6, UdpSocket},
    time::Duration,
};

use futures::TryStreamExt as _;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::{
        neighbour::{NeighbourAddress, NeighbourAttribute, NeighbourState},
        route::{RouteAddress, RouteAttribute},
    },
};
use thiserror::Error;

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

/// The index of interface `name`.
pub async fn ifindex(name: &str) -> Result<u32, NetError> {
    let handle = connect().await?;
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(Some(link)) => Ok(link.header.index),
        Ok(None) | Err(_) => Err(NetError::NoInterface(name.into())),
    }
}

async fn default_gateway(handle: &Handle, ifindex: u32, iface: &str) -> Result<IpAddr, NetError> {
    let v4 = RouteMessageBuilder::<std::net::Ipv4Addr>::new().build();
    let v6 = RouteMessageBuilder::<std::net::Ipv6Addr>::new().build();
    for query in [v4, v6] {
        let mut routes = handle.route().get(query).execute();
        while let Some(route) = routes.try_next().await.map_err(nl)? {
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
    let mut neighbours = handle.neighbours().get().execute();
    while let Some(n) = neighbours.try_next().await.map_err(nl)? {
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
    let index = ifindex(iface).await?;
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
