//! `lbctl trace`'s lease in the daemon: taken, renewed, replaced by a
//! newer session, given back, run out, and refused (a bad client prefix,
//! an unknown VIP, the traced program still being verified).

use super::*;
use crate::api::{TraceLeased, TraceRequest};
use crate::daemon::trace::TRACE_LEASE;
use lb_common::consts::CFG_F_TRACE;

/// The daemon's file with a second VIP of its own table size (103).
fn two() -> String {
    format!(
        "{FILE}  - address: 10.99.0.2\n    port: 80\n    protocol: tcp\n    table_size: 103\n    backends:\n      - address: 10.1.0.2\n"
    )
}

fn on(session: u32, vip: Option<&str>, client: Option<&str>) -> Request {
    Request::TraceLease(TraceRequest::On {
        session,
        vip: vip.map(id),
        client: client.map(str::to_owned),
    })
}

fn off(session: u32) -> Request {
    Request::TraceLease(TraceRequest::Off { session })
}

/// The session the datapath's filter carries, if the trace flag is set.
fn traced(r: &Rig) -> Option<u32> {
    let dp = r.daemon.reconciler.dataplane();
    let on = dp.config().unwrap().flags & CFG_F_TRACE != 0;
    on.then_some(dp.trace.session)
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_taken_renewed_replaced_given_back_and_runs_out() {
    let mut r = rig(&two());
    assert_eq!(traced(&r), None);
    let leased: TraceLeased = parse(r.ok(on(7, None, None)).await);
    assert_eq!(traced(&r), Some(7));
    assert!(
        leased.events.ends_with(lb_common::consts::MAP_TRACE_EVENTS),
        "{}",
        leased.events
    );
    assert_eq!(leased.table_size, 101);
    assert_eq!(leased.table_sizes, [(id("10.99.0.2:80/tcp"), 103)]);
    assert_eq!(leased.lease_secs, TRACE_LEASE.as_secs_f64());
    // A renewal writes no filter.
    let writes = r.daemon.reconciler.dataplane().writes;
    r.ok(on(7, None, None)).await;
    assert_eq!(r.daemon.reconciler.dataplane().writes, writes);
    // Another session's give-back is ignored; a newer session replaces.
    r.ok(off(8)).await;
    assert_eq!(traced(&r), Some(7));
    r.ok(on(8, Some(WEB), Some("192.0.2.0/24"))).await;
    assert_eq!(traced(&r), Some(8));
    r.ok(off(8)).await;
    assert_eq!(traced(&r), None);
    // A lease not renewed runs out after TRACE_LEASE, not before.
    r.ok(on(9, None, None)).await;
    r.daemon.expire_trace();
    assert_eq!(traced(&r), Some(9));
    tokio::time::advance(TRACE_LEASE - std::time::Duration::from_secs(1)).await;
    r.daemon.expire_trace();
    assert_eq!(traced(&r), Some(9));
    tokio::time::advance(std::time::Duration::from_secs(1)).await;
    r.daemon.expire_trace();
    assert_eq!(traced(&r), None);
}

#[tokio::test]
async fn a_bad_client_an_unknown_vip_or_a_program_in_verification_is_refused() {
    let mut r = rig(&two());
    let e = r
        .refused(ErrorKind::BadRequest, on(1, None, Some("192.0.2.0/99")))
        .await;
    assert!(e.starts_with("--client: "), "{e}");
    let e = r
        .refused(ErrorKind::NotFound, on(1, Some("10.99.0.9:80/tcp"), None))
        .await;
    assert!(e.contains("no VIP 10.99.0.9:80/tcp"), "{e}");
    assert_eq!(traced(&r), None);
    r.ok(on(1, Some("10.99.0.2:80/tcp"), None)).await;
    // While the traced program is verified, a new session waits; the
    // running one renews.
    r.daemon.reconciler.dataplane_mut().tracing_pending = true;
    let e = r.refused(ErrorKind::Unavailable, on(2, None, None)).await;
    assert!(e.contains("still being verified"), "{e}");
    r.ok(on(1, None, None)).await;
    assert_eq!(traced(&r), Some(1));
}
