//! `lbctl backend drain VIP ADDR --wait`: after the drain, follows the
//! backend's live flows once a second until it is `drained` (exit 0), its
//! `drain_timeout` runs out (the flows left are cut: exit 1), or it stops
//! draining (undrained, removed: exit 1). With `-o json`, JSON Lines:
//! the drain's answer, then the backend (`vip list`'s entry, `null` once
//! removed) each time its live flows change, and at the end.

use std::{net::IpAddr, path::Path, time::Duration};

use anyhow::Result;
use lb::{
    api::{self, BackendInfo, BackendState, Request, VipInfo, VipRequest},
    config::VipId,
};

/// How a wait ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Drained,
    /// drain_timeout ran out with this many live flows.
    TimedOut(Option<u64>),
    NotDraining,
}

/// Whether the wait is over, and how, for the backend as `lbd` shows it.
fn end_of(b: Option<&BackendInfo>) -> Option<End> {
    let Some(b) = b else {
        return Some(End::NotDraining);
    };
    match b.state {
        Some(BackendState::Drained) => Some(End::Drained),
        Some(BackendState::Draining) if !b.usable => Some(End::TimedOut(b.live_flows)),
        Some(BackendState::Draining) => None,
        _ => Some(End::NotDraining),
    }
}

/// The backend `address` of `vip` as `lbd vip list` shows it.
fn backend(socket: &Path, vip: VipId, address: IpAddr) -> Result<Option<BackendInfo>> {
    let vips: Vec<VipInfo> =
        serde_json::from_value(api::call(socket, &Request::Vip(VipRequest::List))?)?;
    Ok(vips
        .into_iter()
        .find(|v| v.vip == vip)
        .and_then(|v| v.backends.into_iter().find(|b| b.address == address)))
}

/// Waits (see the module docs); returns the exit code.
pub fn wait_drained(socket: &Path, vip: VipId, address: IpAddr, json: bool) -> Result<i32> {
    let mut shown = None;
    loop {
        let b = backend(socket, vip, address)?;
        if let Some(end) = end_of(b.as_ref()) {
            if json {
                println!("{}", serde_json::to_string(&b)?);
            } else {
                match &end {
                    End::Drained => println!("{address} is drained: no live flows"),
                    End::TimedOut(n) => println!(
                        "drain_timeout ran out with {} live flows on {address}: cut",
                        crate::print::flows(*n)
                    ),
                    End::NotDraining => println!("{address} of {vip} is no longer draining"),
                }
            }
            return Ok(i32::from(end != End::Drained));
        }
        let flows = b.as_ref().and_then(|b| b.live_flows);
        if flows != shown {
            if json {
                println!("{}", serde_json::to_string(&b)?);
            } else {
                println!("{} live flows", crate::print::flows(flows));
            }
            shown = flows;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: BackendState, usable: bool, live_flows: Option<u64>) -> BackendInfo {
        BackendInfo {
            address: "10.1.0.1".parse().unwrap(),
            weight: 1,
            state: Some(state),
            usable,
            handle: 1,
            live_flows,
        }
    }

    #[test]
    fn the_wait_ends_drained_timed_out_or_not_draining() {
        let draining = info(BackendState::Draining, true, Some(3));
        assert_eq!(end_of(Some(&draining)), None);
        let drained = info(BackendState::Drained, true, Some(0));
        assert_eq!(end_of(Some(&drained)), Some(End::Drained));
        let cut = info(BackendState::Draining, false, Some(2));
        assert_eq!(end_of(Some(&cut)), Some(End::TimedOut(Some(2))));
        let back = info(BackendState::Active, true, Some(2));
        assert_eq!(end_of(Some(&back)), Some(End::NotDraining));
        assert_eq!(end_of(None), Some(End::NotDraining));
    }
}
