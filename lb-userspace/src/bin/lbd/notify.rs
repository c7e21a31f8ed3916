//! systemd's service protocol (`sd_notify`, `Type=notify`): `READY=1`
//! once the maps are written, the program attached and the socket bound;
//! `WATCHDOG=1` from the daemon's loop on every tick while systemd asks
//! for it (`WatchdogSec=`), so a stalled loop gets `lbd` restarted (the
//! program stays attached and the new `lbd` adopts it); `STOPPING=1` when
//! a stop begins; `STATUS=` lines for `systemctl status`. Without
//! `NOTIFY_SOCKET` (not under systemd) every call does nothing.

use std::time::Duration;

use sd_notify::NotifyState;
use tracing::debug;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        debug!(error = %e, "sd_notify failed");
    }
}

/// Start-up is complete.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A stop began (withdrawal, then `shutdown_grace`).
pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// The watchdog period systemd asks for, if any: `WATCHDOG_USEC`, for
/// this process unless `WATCHDOG_PID` names another (as libsystemd's
/// `sd_watchdog_enabled` reads them).
pub fn watchdog() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Some(pid) = std::env::var("WATCHDOG_PID").ok()
        && pid.parse::<u32>().ok() != Some(std::process::id())
    {
        return None;
    }
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// The loop is alive.
pub fn alive() {
    send(&[NotifyState::Watchdog]);
}
