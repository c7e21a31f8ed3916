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

/// The watchdog period systemd asks for, if any.
pub fn watchdog() -> Option<Duration> {
    let mut usec = 0;
    sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec))
}

/// The loop is alive.
pub fn alive() {
    send(&[NotifyState::Watchdog]);
}
