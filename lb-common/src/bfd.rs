//! BFD (RFC 5880 asynchronous mode, RFC 5881 single hop) as both sides
//! share it: the control packet's constants, the session states and
//! diagnostics, the reception state machine of RFC 5880 §6.8.6 as one pure
//! function ([`receive`]) that `lb_xdp` runs for every control packet it
//! answers, and the timer arithmetic of transmission driven by the peer's
//! packets (§6.8.2–§6.8.4, §6.8.7).
//!
//! Where the answer comes from (ARCHITECTURE.md, "BFD"): `lbd` writes each
//! session's configuration into `LB_BFD_PEERS`; `lb_xdp` answers the
//! peer's control packets itself with `XDP_TX`, one reply per packet it
//! receives, and keeps the session's state in `LB_BFD_STATE`. So BFD lives
//! and dies with the forwarding plane (the program and the link), not with
//! `lbd`, and says so with the C bit.
//!
//! Times are microseconds on the wire and in the configuration,
//! nanoseconds (`bpf_ktime_get_ns`, `CLOCK_MONOTONIC`) in the state.

/// The UDP port of single-hop control packets (RFC 5881 §4).
pub const BFD_PORT: u16 = 3784;
/// Source ports of a session's packets (RFC 5881 §4).
pub const BFD_SRC_PORT_MIN: u16 = 49152;
/// The protocol version (RFC 5880 §4.1).
pub const BFD_VERSION: u8 = 1;
/// The mandatory section of a control packet, without authentication.
pub const BFD_CONTROL_LEN: usize = 24;
/// The only TTL or hop limit a single-hop packet may arrive with or be
/// sent with (RFC 5881 §5, without authentication).
pub const BFD_TTL: u8 = 255;

/// `bfd.SessionState` and the State field (RFC 5880 §4.1).
pub const STATE_ADMIN_DOWN: u8 = 0;
pub const STATE_DOWN: u8 = 1;
pub const STATE_INIT: u8 = 2;
pub const STATE_UP: u8 = 3;

/// Diagnostic codes (RFC 5880 §4.1) lb sets.
pub const DIAG_NONE: u8 = 0;
/// Control Detection Time Expired.
pub const DIAG_TIME_EXPIRED: u8 = 1;
/// Neighbor Signaled Session Down.
pub const DIAG_NEIGHBOR_DOWN: u8 = 3;

/// Bits of the second byte of a control packet, after the 2-bit State:
/// Poll, Final, Control Plane Independent, Authentication Present,
/// Demand, Multipoint (RFC 5880 §4.1).
pub const FLAG_P: u8 = 0x20;
pub const FLAG_F: u8 = 0x10;
pub const FLAG_C: u8 = 0x08;
pub const FLAG_A: u8 = 0x04;
pub const FLAG_D: u8 = 0x02;
pub const FLAG_M: u8 = 0x01;

/// §6.8.3: while a session is not Up, Desired Min TX is at least 1 s.
pub const SLOW_TX_US: u32 = 1_000_000;

/// Most sessions `LB_BFD_PEERS` and `LB_BFD_STATE` hold.
pub const BFD_MAX_SESSIONS: u32 = 64;

/// [`crate::BfdState::flags`]: a Poll Sequence is running: replies carry
/// P until a packet with F arrives (§6.5).
pub const BFD_ST_POLL: u8 = 1 << 0;
/// [`crate::BfdState::flags`]: the peer set the C bit in its last packet.
pub const BFD_ST_REMOTE_C: u8 = 1 << 1;

/// §6.8.6, from "If bfd.SessionState is AdminDown" on: the session's new
/// state and diagnostic after a packet that passed every check arrives
/// with State `received` while the session is in `local` (diagnostic
/// `diag`). `None`: the packet is discarded (the session is AdminDown).
pub const fn receive(local: u8, diag: u8, received: u8) -> Option<(u8, u8)> {
    if local == STATE_ADMIN_DOWN {
        return None;
    }
    if received == STATE_ADMIN_DOWN {
        return Some(if local != STATE_DOWN {
            (STATE_DOWN, DIAG_NEIGHBOR_DOWN)
        } else {
            (local, diag)
        });
    }
    Some(match (local, received) {
        (STATE_DOWN, STATE_DOWN) => (STATE_INIT, diag),
        (STATE_DOWN, STATE_INIT) => (STATE_UP, diag),
        (STATE_INIT, STATE_INIT | STATE_UP) => (STATE_UP, diag),
        (STATE_UP, STATE_DOWN) => (STATE_DOWN, DIAG_NEIGHBOR_DOWN),
        _ => (local, diag),
    })
}

/// §6.8.4: the Detection Time passed without a packet: a session in Init
/// or Up goes Down with diagnostic 1; Down and AdminDown stay.
pub const fn expire(local: u8, diag: u8) -> (u8, u8) {
    match local {
        STATE_INIT | STATE_UP => (STATE_DOWN, DIAG_TIME_EXPIRED),
        _ => (local, diag),
    }
}

/// The peer's transmit interval (§6.8.7): the larger of its Desired Min
/// TX and our Required Min RX.
pub const fn peer_interval_us(remote_desired_tx: u32, required_min_rx: u32) -> u32 {
    if remote_desired_tx > required_min_rx {
        remote_desired_tx
    } else {
        required_min_rx
    }
}

/// The Desired Min TX we advertise, in `state` (the state the reply
/// carries). We send one reply per packet of the peer, so we transmit
/// exactly as often as it does: the peer's detection time for us, our
/// Detect Mult × max(its Required Min RX, this value) (§6.8.4), must
/// cover its own interval, hence at least [`peer_interval_us`]; at
/// least the configured `desired_min_tx`; and at least 1 s while not Up
/// (§6.8.3).
pub const fn advertised_tx_us(
    state: u8,
    desired_min_tx: u32,
    required_min_rx: u32,
    remote_desired_tx: u32,
) -> u32 {
    let peer = peer_interval_us(remote_desired_tx, required_min_rx);
    let tx = if desired_min_tx > peer {
        desired_min_tx
    } else {
        peer
    };
    if state != STATE_UP && tx < SLOW_TX_US {
        SLOW_TX_US
    } else {
        tx
    }
}

/// Our Detection Time for the peer, in nanoseconds (§6.8.4): its Detect
/// Mult times its transmit interval.
pub const fn detect_ns(remote_mult: u8, remote_desired_tx: u32, required_min_rx: u32) -> u64 {
    remote_mult as u64 * peer_interval_us(remote_desired_tx, required_min_rx) as u64 * 1000
}

/// The least time between two of our replies, in nanoseconds. §6.8.7: no
/// transmission at an interval below the larger of our advertised Desired
/// Min TX and the peer's Required Min RX, less at most 25% of jitter. The
/// peer's own packets come at 75–100% of its interval (its jitter), which
/// our advertised value covers, plus the network's delay variation; the
/// limit sits at 11/16 of the interval so that a peer's packet that comes
/// a little early is still answered while a flood is not. A reply to a
/// Poll is due at once (§6.8.7: "without respect to the transmission
/// timer"), but at most 16 per interval. A peer asking for no packets
/// (Required Min RX 0) gets replies to its Polls only (`None` otherwise).
pub const fn min_reply_gap_ns(adv_tx: u32, remote_min_rx: u32, poll: bool) -> Option<u64> {
    if remote_min_rx == 0 && !poll {
        return None;
    }
    let interval = if adv_tx > remote_min_rx {
        adv_tx
    } else {
        remote_min_rx
    } as u64
        * 1000;
    Some(if poll {
        interval / 16
    } else {
        interval * 11 / 16
    })
}

/// The name of a State value, for logs and `lbctl`.
pub const fn state_name(state: u8) -> &'static str {
    match state {
        STATE_ADMIN_DOWN => "AdminDown",
        STATE_DOWN => "Down",
        STATE_INIT => "Init",
        STATE_UP => "Up",
        _ => "?",
    }
}

/// The name of a diagnostic code (RFC 5880 §4.1).
pub const fn diag_name(diag: u8) -> &'static str {
    match diag {
        0 => "no diagnostic",
        1 => "control detection time expired",
        2 => "echo function failed",
        3 => "neighbor signaled session down",
        4 => "forwarding plane reset",
        5 => "path down",
        6 => "concatenated path down",
        7 => "administratively down",
        8 => "reverse concatenated path down",
        _ => "unknown diagnostic",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u8 = STATE_ADMIN_DOWN;
    const D: u8 = STATE_DOWN;
    const I: u8 = STATE_INIT;
    const U: u8 = STATE_UP;

    /// RFC 5880 §6.8.6, written out row by row from its text (and the
    /// diagram of §6.2): (bfd.SessionState, received State) → new state
    /// and whether bfd.LocalDiag becomes 3. `None`: discarded.
    /// The new state, and whether bfd.LocalDiag becomes 3.
    type Outcome = Option<(u8, bool)>;

    const TABLE: &[(u8, u8, Outcome)] = &[
        // "If bfd.SessionState is AdminDown: Discard the packet"
        (A, A, None),
        (A, D, None),
        (A, I, None),
        (A, U, None),
        // "If received state is AdminDown: If bfd.SessionState is not
        // Down: Set bfd.LocalDiag to 3, Set bfd.SessionState to Down"
        (D, A, Some((D, false))),
        (I, A, Some((D, true))),
        (U, A, Some((D, true))),
        // "If bfd.SessionState is Down: If received State is Down: Set
        // bfd.SessionState to Init; Else if received State is Init: Set
        // bfd.SessionState to Up" (an Up from a Down session: nothing)
        (D, D, Some((I, false))),
        (D, I, Some((U, false))),
        (D, U, Some((D, false))),
        // "Else if bfd.SessionState is Init: If received State is Init or
        // Up: Set bfd.SessionState to Up"
        (I, D, Some((I, false))),
        (I, I, Some((U, false))),
        (I, U, Some((U, false))),
        // "Else (bfd.SessionState is Up): If received State is Down: Set
        // bfd.LocalDiag to 3, Set bfd.SessionState to Down"
        (U, D, Some((D, true))),
        (U, I, Some((U, false))),
        (U, U, Some((U, false))),
    ];

    #[test]
    fn reception_follows_rfc_5880_section_6_8_6() {
        for &(local, received, want) in TABLE {
            let got = receive(local, 7, received);
            let want = want.map(|(s, neighbor)| (s, if neighbor { DIAG_NEIGHBOR_DOWN } else { 7 }));
            assert_eq!(
                got,
                want,
                "{} receiving {}",
                state_name(local),
                state_name(received)
            );
        }
        assert_eq!(TABLE.len(), 16, "every pair of states");
    }

    #[test]
    fn the_detection_timer_takes_init_and_up_down_with_diagnostic_1() {
        assert_eq!(expire(U, 0), (D, DIAG_TIME_EXPIRED));
        assert_eq!(expire(I, 3), (D, DIAG_TIME_EXPIRED));
        assert_eq!(expire(D, 3), (D, 3));
        assert_eq!(expire(A, 7), (A, 7));
    }

    #[test]
    fn a_three_way_handshake_comes_up() {
        // Both sides start Down and answer what they see (§6.2).
        let (mut us, mut them) = (D, D);
        let mut steps = 0;
        while (us, them) != (U, U) {
            us = receive(us, 0, them).unwrap().0;
            them = receive(them, 0, us).unwrap().0;
            steps += 1;
            assert!(steps < 4, "stuck at {us}/{them}");
        }
    }

    #[test]
    fn advertised_tx_covers_the_peers_interval_and_is_slow_until_up() {
        // 300 ms both ways: 300 ms once Up, 1 s before.
        assert_eq!(advertised_tx_us(U, 300_000, 300_000, 300_000), 300_000);
        assert_eq!(advertised_tx_us(D, 300_000, 300_000, 300_000), SLOW_TX_US);
        assert_eq!(advertised_tx_us(I, 300_000, 300_000, 1_000_000), SLOW_TX_US);
        // A peer that sends every 500 ms: we can answer no faster.
        assert_eq!(advertised_tx_us(U, 300_000, 300_000, 500_000), 500_000);
        // Our Required Min RX slows the peer down, and so us.
        assert_eq!(advertised_tx_us(U, 100_000, 400_000, 100_000), 400_000);
        // Our own Desired Min TX is a floor.
        assert_eq!(advertised_tx_us(U, 2_000_000, 300_000, 300_000), 2_000_000);
        assert_eq!(advertised_tx_us(D, 2_000_000, 300_000, 300_000), 2_000_000);
    }

    #[test]
    fn detection_time_is_the_peers_multiplier_times_its_interval() {
        assert_eq!(detect_ns(3, 300_000, 300_000), 900_000_000);
        assert_eq!(detect_ns(3, 100_000, 300_000), 900_000_000);
        assert_eq!(detect_ns(5, 1_000_000, 300_000), 5_000_000_000);
        assert_eq!(detect_ns(255, u32::MAX, 0), 255 * u32::MAX as u64 * 1000);
    }

    #[test]
    fn replies_keep_their_distance_but_polls_are_answered() {
        // 300 ms: no reply within 206.25 ms of the last one.
        assert_eq!(min_reply_gap_ns(300_000, 300_000, false), Some(206_250_000));
        // The peer's Required Min RX counts when it is larger.
        assert_eq!(
            min_reply_gap_ns(300_000, 1_000_000, false),
            Some(687_500_000)
        );
        assert_eq!(min_reply_gap_ns(300_000, 300_000, true), Some(18_750_000));
        // A peer that wants no packets gets answers to its Polls only.
        assert_eq!(min_reply_gap_ns(300_000, 0, false), None);
        assert_eq!(min_reply_gap_ns(300_000, 0, true), Some(18_750_000));
        // The peer's packets at 75% of its interval (its largest jitter)
        // are above the limit.
        assert!(min_reply_gap_ns(300_000, 300_000, false).unwrap() < 225_000_000);
    }
}
