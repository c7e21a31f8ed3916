//! The daemon's side of `lbctl trace`: one trace at a time, as a lease.
//! `lbctl` takes it and renews it every few seconds; the tick drops it
//! when it runs out (a killed `lbctl` leaves no tracing behind), and a
//! newer session replaces an older one.

use std::time::Duration;

use tracing::{info, warn};

use super::{Daemon, Result, refused};
use crate::api::ErrorKind;
use crate::{
    api::{TraceLeased, TraceRequest},
    config::Prefix,
    dataplane::Dataplane,
};

/// How long a lease lasts unless renewed.
pub const TRACE_LEASE: Duration = Duration::from_secs(10);

/// The trace that runs.
#[derive(Clone, Debug)]
pub struct Lease {
    pub session: u32,
    pub until: tokio::time::Instant,
}

impl<D: Dataplane> Daemon<D> {
    /// Takes, renews or gives back the trace lease.
    pub fn trace(&mut self, r: TraceRequest) -> Result<Option<TraceLeased>> {
        match r {
            TraceRequest::On {
                session,
                vip,
                client,
            } => {
                let client: Option<Prefix> = client
                    .map(|c| {
                        Prefix::address_or_prefix(&c).map_err(|e: String| {
                            refused(ErrorKind::BadRequest, format!("--client: {e}"))
                        })
                    })
                    .transpose()?;
                if let Some(v) = &vip
                    && !self.reconciler.vips().contains_key(v)
                {
                    return Err(refused(ErrorKind::NotFound, format!("no VIP {v}")));
                }
                let renewal = self.tracing.as_ref().is_some_and(|l| l.session == session);
                if !renewal && self.reconciler.dataplane().tracing_pending() {
                    return Err(refused(
                        ErrorKind::Unavailable,
                        "the traced program (lb_xdp_trace) is still being verified since lbd started; try again in a moment (lbctl trace waits for it)",
                    ));
                }
                if !renewal {
                    let filter = crate::trace::filter(session, vip.as_ref(), client.as_ref());
                    self.reconciler.set_trace(Some(&filter))?;
                    if self.tracing.is_some() {
                        warn!(session, "a new trace replaces the running one");
                    }
                    info!(session, ?vip, ?client, "trace started");
                }
                self.tracing = Some(Lease {
                    session,
                    until: tokio::time::Instant::now() + TRACE_LEASE,
                });
                Ok(Some(TraceLeased {
                    events: self
                        .config
                        .pin_dir()
                        .join(lb_common::consts::MAP_TRACE_EVENTS)
                        .display()
                        .to_string(),
                    table_size: self.config.layout.table_size,
                    table_sizes: self
                        .reconciler
                        .vips()
                        .iter()
                        .filter(|(_, v)| v.table_size != self.config.layout.table_size)
                        .map(|(id, v)| (*id, v.table_size))
                        .collect(),
                    lease_secs: TRACE_LEASE.as_secs_f64(),
                }))
            }
            TraceRequest::Off { session } => {
                if self.tracing.as_ref().is_some_and(|l| l.session == session) {
                    self.stop_trace();
                }
                Ok(None)
            }
        }
    }

    /// Ends the trace (the datapath stops describing packets).
    pub fn stop_trace(&mut self) {
        if let Some(lease) = self.tracing.take() {
            match self.reconciler.set_trace(None) {
                Ok(()) => info!(session = lease.session, "trace stopped"),
                Err(e) => warn!(error = %e, "clearing the trace flag failed"),
            }
        }
    }

    /// Called by the tick: a lease that ran out ends.
    pub(super) fn expire_trace(&mut self) {
        if self
            .tracing
            .as_ref()
            .is_some_and(|l| tokio::time::Instant::now() >= l.until)
        {
            self.stop_trace();
        }
    }
}
