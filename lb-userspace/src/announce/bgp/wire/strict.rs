//! The checks of a peer's OPEN and UPDATE that reset the session and that
//! netgauze's parser, tolerant where lb lets it be, does not make:
//!
//! - RFC 7606 §5.3 and §3(g): a malformed NLRI (a prefix longer than its
//!   family, one cut short) in Withdrawn Routes or NLRI (3/10, Invalid
//!   Network Field) or inside MP_REACH_NLRI / MP_UNREACH_NLRI (3/9,
//!   Optional Attribute Error, RFC 4760 §7), an MP attribute too short to
//!   hold its AFI and SAFI (3/9), and MP_REACH_NLRI or MP_UNREACH_NLRI
//!   more than once (3/1, Malformed Attribute List). The NLRI cannot be
//!   trusted then, so "treat-as-withdraw" is not an option;
//! - RFC 4271 §6.2: an optional parameter or capability that overruns
//!   what holds it, or a capability lb reads whose length is not its
//!   RFC's (4-octet AS: 4, multiprotocol: 4, graceful restart: 2 + 4n):
//!   2/0, OPEN Message Error, unspecific.
//!
//! Both run on a message whose framing and top-level lengths were
//! checked (`super::Decoder`); every offset here is bounded by the slice.

use super::{Malformed, Notification, OPEN_MESSAGE_ERROR, UPDATE_MESSAGE_ERROR};

const MP_REACH_NLRI: u8 = 14;
const MP_UNREACH_NLRI: u8 = 15;
const ATTR_EXTENDED_LENGTH: u8 = 0x10;

fn reset(code: u8, subcode: u8, detail: String) -> Malformed {
    Malformed {
        reply: Some(Notification::new(code, subcode, [])),
        detail,
    }
}

/// Prefixes (length byte, then the bytes it needs) filling `bytes`
/// exactly, none longer than `max_len` bits.
fn check_prefixes(bytes: &[u8], max_len: u8) -> Result<(), String> {
    let mut at = 0;
    while at < bytes.len() {
        let len = bytes[at];
        if len > max_len {
            return Err(format!("a prefix length of {len} (at most {max_len})"));
        }
        let need = usize::from(len).div_ceil(8);
        if at + 1 + need > bytes.len() {
            return Err(format!("a /{len} prefix cut short"));
        }
        at += 1 + need;
    }
    Ok(())
}

/// The longest prefix of unicast AFI `afi` (SAFI 1), if lb reads it.
fn max_len(afi: u16, safi: u8) -> Option<u8> {
    match (afi, safi) {
        (1, 1) => Some(32),
        (2, 1) => Some(128),
        _ => None,
    }
}

/// The UPDATE body's NLRI checks (see the module docs). The Withdrawn
/// Routes and Path Attribute lengths fit the body (checked before).
pub fn check_update(body: &[u8]) -> Result<(), Malformed> {
    let field = |e: String| reset(UPDATE_MESSAGE_ERROR, 10, format!("UPDATE with {e}"));
    let withdrawn = usize::from(u16::from_be_bytes([body[0], body[1]]));
    check_prefixes(&body[2..2 + withdrawn], 32)
        .map_err(|e| field(format!("{e} in Withdrawn Routes")))?;
    let at = 2 + withdrawn;
    let attrs_len = usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
    let attrs = &body[at + 2..at + 2 + attrs_len];
    check_prefixes(&body[at + 2 + attrs_len..], 32).map_err(|e| field(format!("{e} in NLRI")))?;
    check_mp_attributes(attrs)
}

/// Walks the path attributes for MP_REACH_NLRI and MP_UNREACH_NLRI. An
/// attribute that overruns the list ends the walk: that is an attribute
/// error, which the parser reports as treat-as-withdraw.
fn check_mp_attributes(mut attrs: &[u8]) -> Result<(), Malformed> {
    let optional = |e: String| reset(UPDATE_MESSAGE_ERROR, 9, e);
    let (mut reach, mut unreach) = (0, 0);
    while attrs.len() >= 3 {
        let (flags, kind) = (attrs[0], attrs[1]);
        let (len, head) = if flags & ATTR_EXTENDED_LENGTH != 0 {
            if attrs.len() < 4 {
                break;
            }
            (usize::from(u16::from_be_bytes([attrs[2], attrs[3]])), 4)
        } else {
            (usize::from(attrs[2]), 3)
        };
        if head + len > attrs.len() {
            break;
        }
        let value = &attrs[head..head + len];
        attrs = &attrs[head + len..];
        match kind {
            MP_REACH_NLRI => {
                reach += 1;
                check_mp_reach(value).map_err(optional)?;
            }
            MP_UNREACH_NLRI => {
                unreach += 1;
                check_mp_unreach(value).map_err(optional)?;
            }
            _ => {}
        }
        if reach > 1 || unreach > 1 {
            return Err(reset(
                UPDATE_MESSAGE_ERROR,
                1,
                "UPDATE with MP_REACH_NLRI or MP_UNREACH_NLRI more than once (RFC 7606 §3(g))"
                    .into(),
            ));
        }
    }
    Ok(())
}

fn check_mp_reach(v: &[u8]) -> Result<(), String> {
    if v.len() < 5 {
        return Err(format!("MP_REACH_NLRI of {} bytes", v.len()));
    }
    let (afi, safi, nh_len) = (u16::from_be_bytes([v[0], v[1]]), v[2], usize::from(v[3]));
    if 4 + nh_len + 1 > v.len() {
        return Err(format!(
            "MP_REACH_NLRI whose next hop ({nh_len} bytes) overruns it"
        ));
    }
    match max_len(afi, safi) {
        Some(max) => {
            check_prefixes(&v[4 + nh_len + 1..], max).map_err(|e| format!("MP_REACH_NLRI with {e}"))
        }
        None => Ok(()),
    }
}

fn check_mp_unreach(v: &[u8]) -> Result<(), String> {
    if v.len() < 3 {
        return Err(format!("MP_UNREACH_NLRI of {} bytes", v.len()));
    }
    let (afi, safi) = (u16::from_be_bytes([v[0], v[1]]), v[2]);
    match max_len(afi, safi) {
        Some(max) => check_prefixes(&v[3..], max).map_err(|e| format!("MP_UNREACH_NLRI with {e}")),
        None => Ok(()),
    }
}

/// The OPEN body's optional parameters and the capabilities lb reads
/// (see the module docs). The body holds at least the 10 fixed bytes.
pub fn check_open(body: &[u8]) -> Result<(), Malformed> {
    let bad = |e: String| reset(OPEN_MESSAGE_ERROR, 0, format!("OPEN with {e}"));
    let opt_len = usize::from(body[9]);
    let Some(mut params) = body.get(10..10 + opt_len) else {
        // The parser answers this one (its length against the message).
        return Ok(());
    };
    while !params.is_empty() {
        if params.len() < 2 || 2 + usize::from(params[1]) > params.len() {
            return Err(bad(
                "an optional parameter that overruns the parameters".into()
            ));
        }
        let (kind, len) = (params[0], usize::from(params[1]));
        if kind == 2 {
            check_capabilities(&params[2..2 + len]).map_err(bad)?;
        }
        params = &params[2 + len..];
    }
    Ok(())
}

fn check_capabilities(mut caps: &[u8]) -> Result<(), String> {
    while !caps.is_empty() {
        if caps.len() < 2 || 2 + usize::from(caps[1]) > caps.len() {
            return Err("a capability that overruns its parameter".into());
        }
        let (code, len) = (caps[0], usize::from(caps[1]));
        let fits = match code {
            1 | 65 => len == 4,
            // 2 bytes of flags and time, then 4 per family.
            64 => len % 4 == 2,
            _ => true,
        };
        if !fits {
            return Err(format!("capability {code} of {len} bytes"));
        }
        caps = &caps[2 + len..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(r: Result<(), Malformed>) -> (u8, u8) {
        let n = r.expect_err("malformed").reply.expect("a NOTIFICATION");
        (n.code, n.subcode)
    }

    /// An UPDATE body: withdrawn routes, attributes, NLRI.
    fn update(withdrawn: &[u8], attrs: &[u8], nlri: &[u8]) -> Vec<u8> {
        let mut b = (withdrawn.len() as u16).to_be_bytes().to_vec();
        b.extend_from_slice(withdrawn);
        b.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
        b.extend_from_slice(attrs);
        b.extend_from_slice(nlri);
        b
    }

    const ORIGIN_PATH_NH: [u8; 14] = [0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1];

    #[test]
    fn malformed_nlri_resets_the_session() {
        // A /33, and a /24 with two of its three bytes.
        assert_eq!(
            reply(check_update(&update(
                &[],
                &ORIGIN_PATH_NH,
                &[33, 10, 0, 0, 0, 1]
            ))),
            (3, 10)
        );
        assert_eq!(
            reply(check_update(&update(&[], &ORIGIN_PATH_NH, &[24, 10, 0]))),
            (3, 10)
        );
        assert_eq!(
            reply(check_update(&update(&[40, 1, 2, 3, 4, 5], &[], &[]))),
            (3, 10)
        );
        // Well formed: /32, /0, and an empty update (End-of-RIB).
        assert!(check_update(&update(&[0], &ORIGIN_PATH_NH, &[32, 10, 99, 0, 1])).is_ok());
        assert!(check_update(&update(&[], &[], &[])).is_ok());
    }

    #[test]
    fn malformed_mp_attributes_reset_the_session() {
        let unreach = |v: &[u8]| {
            let mut a = vec![0x80, 15, v.len() as u8];
            a.extend_from_slice(v);
            a
        };
        let reach = |v: &[u8]| {
            let mut a = vec![0x80, 14, v.len() as u8];
            a.extend_from_slice(v);
            a
        };
        // A 1-byte MP_UNREACH_NLRI.
        assert_eq!(
            reply(check_update(&update(&[], &unreach(&[0]), &[]))),
            (3, 9)
        );
        // An IPv6 prefix length of 200.
        let mut v6 = vec![0, 2, 1, 200];
        v6.extend_from_slice(&[0; 25]);
        assert_eq!(
            reply(check_update(&update(&[], &unreach(&v6), &[]))),
            (3, 9)
        );
        // MP_REACH whose next hop overruns it; one with a /129.
        assert_eq!(
            reply(check_update(&update(
                &[],
                &reach(&[0, 2, 1, 16, 0, 0]),
                &[]
            ))),
            (3, 9)
        );
        let mut r = vec![0, 2, 1, 16];
        r.extend_from_slice(&[0xfd; 16]);
        r.extend_from_slice(&[0, 129]);
        r.extend_from_slice(&[0; 17]);
        assert_eq!(reply(check_update(&update(&[], &reach(&r), &[]))), (3, 9));
        // MP_REACH_NLRI twice.
        let mut good = vec![0, 2, 1, 16];
        good.extend_from_slice(&[0xfd; 16]);
        good.extend_from_slice(&[0, 128]);
        good.extend_from_slice(&[0xfd; 16]);
        let mut twice = ORIGIN_PATH_NH[..7].to_vec();
        twice.extend(reach(&good));
        twice.extend(reach(&good));
        assert_eq!(reply(check_update(&update(&[], &twice, &[]))), (3, 1));
        let mut once = ORIGIN_PATH_NH[..7].to_vec();
        once.extend(reach(&good));
        assert!(check_update(&update(&[], &once, &[])).is_ok());
        // End-of-RIB for IPv6, and an AFI lb does not read.
        assert!(check_update(&update(&[], &unreach(&[0, 2, 1]), &[])).is_ok());
        assert!(check_update(&update(&[], &unreach(&[0, 25, 70, 99]), &[])).is_ok());
    }

    /// MP_REACH_NLRI / MP_UNREACH_NLRI with the extended-length flag
    /// (0x90: optional, extended length) and a 2-byte length.
    fn extended(kind: u8, v: &[u8]) -> Vec<u8> {
        let mut a = vec![0x90, kind];
        a.extend_from_slice(&(v.len() as u16).to_be_bytes());
        a.extend_from_slice(v);
        a
    }

    /// The edges of the MP attribute checks, each on both sides: the
    /// IPv4 unicast family's /32 limit inside MP_REACH_NLRI, the smallest
    /// MP_REACH_NLRI (AFI, SAFI, a next hop of 0 bytes, the reserved
    /// byte), extended-length attributes, a list that ends inside an
    /// attribute's header, and MP_UNREACH_NLRI twice.
    #[test]
    fn mp_attributes_are_checked_at_their_edges() {
        let attrs = |parts: &[&[u8]]| update(&[], &parts.concat(), &[]);
        let short = |kind: u8, v: &[u8]| {
            let mut a = vec![0x80, kind, v.len() as u8];
            a.extend_from_slice(v);
            a
        };
        // IPv4 unicast in MP_REACH_NLRI: a /33 is malformed, a /32 is not.
        let v4_reach = |len: u8| {
            let mut v = vec![0, 1, 1, 4, 10, 0, 0, 1, 0, len];
            v.extend_from_slice(&[10; 5][..usize::from(len).div_ceil(8)]);
            short(14, &v)
        };
        assert_eq!(reply(check_update(&attrs(&[&v4_reach(33)]))), (3, 9));
        assert!(check_update(&attrs(&[&v4_reach(32)])).is_ok());
        // 5 bytes is the smallest MP_REACH_NLRI, 4 and 3 are too short.
        assert!(check_update(&attrs(&[&short(14, &[0, 2, 1, 0, 0])])).is_ok());
        for v in [&[0, 2, 1, 0][..], &[0, 2, 1]] {
            assert_eq!(
                reply(check_update(&attrs(&[&short(14, v)]))),
                (3, 9),
                "{v:?}"
            );
        }
        // A next hop of 16 bytes that fills MP_REACH_NLRI but for its
        // reserved byte overruns it; with the reserved byte it fits.
        let mut nh16 = vec![0, 2, 1, 16];
        nh16.extend_from_slice(&[0xfd; 16]);
        assert_eq!(reply(check_update(&attrs(&[&short(14, &nh16)]))), (3, 9));
        nh16.push(0);
        assert!(check_update(&attrs(&[&short(14, &nh16)])).is_ok());
        // The reserved byte is ignored (RFC 4760 §3), not read as a
        // prefix length: 0xff before a /128.
        let mut reserved = nh16[..20].to_vec();
        reserved.extend_from_slice(&[0xff, 128]);
        reserved.extend_from_slice(&[0xfd; 16]);
        assert!(check_update(&attrs(&[&short(14, &reserved)])).is_ok());
        // A 0-byte MP_UNREACH_NLRI, alone or last.
        assert_eq!(reply(check_update(&attrs(&[&short(15, &[])]))), (3, 9));
        assert_eq!(
            reply(check_update(&attrs(&[
                &ORIGIN_PATH_NH[..7],
                &short(15, &[])
            ]))),
            (3, 9)
        );
        // Extended length: read with its 2-byte length, checked alike.
        assert_eq!(
            reply(check_update(&attrs(&[&extended(15, &[0, 2, 1, 129])]))),
            (3, 9)
        );
        assert_eq!(reply(check_update(&attrs(&[&extended(15, &[])]))), (3, 9));
        let mut withdraw = vec![0, 2, 1, 128];
        withdraw.extend_from_slice(&[0xfd; 16]);
        assert!(check_update(&attrs(&[&extended(15, &withdraw)])).is_ok());
        assert!(check_update(&attrs(&[&extended(14, &nh16)])).is_ok());
        // An extended-length attribute longer than the list ends the walk
        // (the parser reports it), as does a list that ends within an
        // extended header: neither is read past its end.
        assert!(check_update(&attrs(&[&[0x90, 15, 1, 0, 0, 2, 1]])).is_ok());
        assert!(check_update(&attrs(&[&ORIGIN_PATH_NH[..7], &[0x90, 15, 0]])).is_ok());
        assert!(check_update(&attrs(&[&ORIGIN_PATH_NH[..7], &[0x80, 15]])).is_ok());
        // MP_UNREACH_NLRI twice, and once beside one MP_REACH_NLRI.
        let eor6 = short(15, &[0, 2, 1]);
        assert_eq!(reply(check_update(&attrs(&[&eor6, &eor6]))), (3, 1));
        assert!(check_update(&attrs(&[&eor6, &short(14, &nh16)])).is_ok());
    }

    /// An OPEN body with these optional parameters.
    fn open(params: &[u8]) -> Vec<u8> {
        let mut b = vec![4, 0xfd, 0xe8, 0, 3, 10, 0, 0, 1, params.len() as u8];
        b.extend_from_slice(params);
        b
    }

    #[test]
    fn malformed_capabilities_get_open_message_error_unspecific() {
        // A capability of 6 bytes in a 4-byte parameter.
        assert_eq!(reply(check_open(&open(&[2, 4, 65, 6, 0, 0]))), (2, 0));
        // A 3-byte 4-octet-AS capability.
        assert_eq!(reply(check_open(&open(&[2, 5, 65, 3, 0, 0, 1]))), (2, 0));
        // A parameter longer than the parameters.
        assert_eq!(
            reply(check_open(&open(&[2, 9, 65, 4, 0, 0, 0xfd, 0xe8]))),
            (2, 0)
        );
        // Graceful restart of 3 bytes.
        assert_eq!(reply(check_open(&open(&[2, 5, 64, 3, 0, 0, 0]))), (2, 0));
        // Well formed: 4-octet AS, multiprotocol, GR with one family,
        // route refresh, an unknown capability.
        let good = [
            2, 24, 65, 4, 0, 0, 0xfd, 0xe8, 1, 4, 0, 1, 0, 1, 64, 6, 0, 120, 0, 1, 1, 0x80, 2, 0,
            99, 0,
        ];
        assert!(check_open(&open(&good)).is_ok());
        assert!(check_open(&open(&[])).is_ok());
    }

    /// The OPEN checks at their edges: an empty capabilities parameter,
    /// a parameter of 1 byte, a parameter that is not capabilities (not
    /// read), graceful restart with no family (2 bytes) and with 5 (22),
    /// and the multiprotocol capability (code 1) of 3 and 5 bytes.
    #[test]
    fn open_parameters_are_checked_at_their_edges() {
        assert!(check_open(&open(&[2, 0])).is_ok());
        assert_eq!(reply(check_open(&open(&[2]))), (2, 0));
        assert_eq!(reply(check_open(&open(&[2, 2, 65]))), (2, 0));
        assert!(check_open(&open(&[1, 3, 65, 9, 0])).is_ok());
        assert!(check_open(&open(&[2, 4, 64, 2, 0, 120])).is_ok());
        let mut gr5 = vec![2, 24, 64, 22, 0, 120];
        gr5.extend_from_slice(&[0, 1, 1, 0x80].repeat(5));
        assert!(check_open(&open(&gr5)).is_ok());
        for len in [3, 5] {
            let mut mp = vec![2, 2 + len, 1, len];
            mp.extend_from_slice(&vec![0; usize::from(len)]);
            assert_eq!(reply(check_open(&open(&mp))), (2, 0), "{len}");
        }
        // Two capability parameters: the second is checked too.
        assert_eq!(
            reply(check_open(&open(&[2, 2, 2, 0, 2, 3, 65, 1, 0]))),
            (2, 0)
        );
    }
}
