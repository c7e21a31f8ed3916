//! BGP-4 messages on the wire, as far as an originate-only speaker needs
//! them: our OPEN, KEEPALIVE, UPDATEs announcing and withdrawing host
//! routes, NOTIFICATIONs; and the framing and checking of what the peer
//! sends.
//!
//! The encoding and the parsing of OPEN and UPDATE bodies are
//! `netgauze-bgp-pkt`'s (Apache-2.0, NetGauze project): it was chosen over
//! writing our own codec because it builds on rustc 1.95 with a handful of
//! small dependencies, has no `unsafe` code, bounds-checks every read
//! (it is fuzzed), and maps its parse errors to the NOTIFICATION codes of
//! RFC 4271 §6. `zettabgp`, the other candidate, was rejected: it reads
//! its OPEN header through a raw-pointer cast and indexes slices without
//! checks, so a malformed message could panic it.
//!
//! What is ours: the framing (marker, length and type checks with the
//! exact RFC 4271 §6.1 subcodes and data, done before a byte reaches the
//! parser), NOTIFICATIONs (21 bytes plus data, read and written without
//! the crate so that any code from a peer is reported, not refused), the
//! check for missing well-known attributes (RFC 4271 §6.3) and the
//! choice of attributes. The attributes are the same on every balancer —
//! ORIGIN IGP, AS_PATH `[local_as]` for eBGP or empty for iBGP, LOCAL_PREF
//! 100 for iBGP only, no MED — so that a router merges the balancers'
//! routes into one ECMP route; only the next hop differs.

use std::{
    collections::HashMap,
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
};

use ipnet::{Ipv4Net, Ipv6Net};
use netgauze_bgp_pkt::{
    BgpMessage,
    capabilities::{
        BgpCapability, FourOctetAsCapability, GracefulRestartAddressFamily,
        GracefulRestartCapability, MultiProtocolExtensionsCapability,
    },
    community::Community,
    nlri::{Ipv4Unicast, Ipv4UnicastAddress, Ipv6Unicast, Ipv6UnicastAddress},
    notification::BgpNotificationMessage,
    open::{BgpOpenMessage, BgpOpenMessageParameter},
    path_attribute::{
        As2PathSegment, As4Path, As4PathSegment, AsPath, AsPathSegmentType, Communities,
        LocalPreference, MpReach, MpUnreach, MultiExitDiscriminator, NextHop, Origin,
        PathAttribute, PathAttributeValue,
    },
    update::BgpUpdateMessage,
    wire::deserializer::BgpParsingContext,
};
use netgauze_iana::address_family::AddressType;
use netgauze_parse_utils::{WritablePdu as _, reader::SliceReader, traits::ParseFromWithOneInput};
use thiserror::Error;

use crate::config::announce::bgp::{AS_TRANS, ShutdownAttributes};

mod strict;

/// The GRACEFUL_SHUTDOWN well-known community 65535:0 (RFC 8326).
pub const GRACEFUL_SHUTDOWN: u32 = 0xffff_0000;

/// Every message starts with 16 bytes of ones.
pub const MARKER: [u8; 16] = [0xff; 16];
/// Marker, 2-byte length, 1-byte type.
pub const HEADER_LEN: usize = 19;
/// Largest message without the extended-message capability (RFC 8654),
/// which we do not offer.
pub const MAX_MESSAGE_LEN: usize = 4096;

pub const TYPE_OPEN: u8 = 1;
pub const TYPE_UPDATE: u8 = 2;
pub const TYPE_NOTIFICATION: u8 = 3;
pub const TYPE_KEEPALIVE: u8 = 4;
pub const TYPE_ROUTE_REFRESH: u8 = 5;

/// NOTIFICATION error codes (RFC 4271 §4.5).
pub const MESSAGE_HEADER_ERROR: u8 = 1;
pub const OPEN_MESSAGE_ERROR: u8 = 2;
pub const UPDATE_MESSAGE_ERROR: u8 = 3;
pub const HOLD_TIMER_EXPIRED: u8 = 4;
pub const FSM_ERROR: u8 = 5;
pub const CEASE: u8 = 6;

/// Host routes per UPDATE: 700 × 5 bytes of IPv4 NLRI, or 200 × 17 bytes
/// of IPv6 NLRI, stay well inside 4096 bytes with every attribute.
pub const V4_PER_UPDATE: usize = 700;
pub const V6_PER_UPDATE: usize = 200;

#[derive(Debug, Error)]
pub enum WireError {
    #[error("encoding a BGP message: {0}")]
    Encode(String),
    #[error("{0} is not a unicast host route")]
    NotUnicast(String),
}

/// A NOTIFICATION: error code, subcode, data (RFC 4271 §4.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    pub code: u8,
    pub subcode: u8,
    pub data: Vec<u8>,
}

impl Notification {
    pub fn new(code: u8, subcode: u8, data: impl Into<Vec<u8>>) -> Self {
        Self {
            code,
            subcode,
            data: data.into(),
        }
    }

    /// Cease / Administrative Shutdown (RFC 4486): we are going away.
    pub fn cease() -> Self {
        Self::new(CEASE, 2, [])
    }

    pub fn hold_timer_expired() -> Self {
        Self::new(HOLD_TIMER_EXPIRED, 0, [])
    }

    /// A message of `msg_type` that the FSM does not expect in `state`
    /// (RFC 6608: subcode 1 OpenSent, 2 OpenConfirm, 3 Established; the
    /// data is the message type).
    pub fn unexpected(subcode: u8, msg_type: u8) -> Self {
        Self::new(FSM_ERROR, subcode, [msg_type])
    }

    /// The peer's AS is not the configured one; the data is the OPEN's
    /// 2-octet "My Autonomous System" field.
    pub fn bad_peer_as(my_as_field: u16) -> Self {
        Self::new(OPEN_MESSAGE_ERROR, 2, my_as_field.to_be_bytes())
    }

    pub fn bad_bgp_identifier(id: Ipv4Addr) -> Self {
        Self::new(OPEN_MESSAGE_ERROR, 3, id.octets())
    }

    /// The message, header included.
    pub fn encode(&self) -> Vec<u8> {
        let data = &self.data[..self.data.len().min(MAX_MESSAGE_LEN - HEADER_LEN - 2)];
        let len = HEADER_LEN + 2 + data.len();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&MARKER);
        // `len` ≤ 4096 by the truncation above.
        out.extend_from_slice(&(len as u16).to_be_bytes());
        out.push(TYPE_NOTIFICATION);
        out.push(self.code);
        out.push(self.subcode);
        out.extend_from_slice(data);
        out
    }

    /// The notification netgauze chose for one of its parse errors.
    fn from_netgauze(n: BgpNotificationMessage) -> Self {
        let bytes = encode(&BgpMessage::Notification(n)).unwrap_or_default();
        match (bytes.get(HEADER_LEN), bytes.get(HEADER_LEN + 1)) {
            (Some(&code), Some(&subcode)) => Self::new(code, subcode, &bytes[HEADER_LEN + 2..]),
            // Cannot happen for the notifications netgauze builds; if it
            // did, "unspecific" is still a correct answer.
            _ => Self::new(MESSAGE_HEADER_ERROR, 0, []),
        }
    }
}

impl fmt::Display for Notification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} ({})",
            self.code,
            self.subcode,
            describe(self.code, self.subcode)
        )
    }
}

/// NOTIFICATION error codes: name, and subcode names by number (RFC
/// 4271 §4.5, RFC 4486 and later for Cease, RFC 7313 for code 7).
const ERROR_NAMES: &[(u8, &str, &[&str])] = &[
    (
        MESSAGE_HEADER_ERROR,
        "message header error",
        &[
            "",
            "connection not synchronized",
            "bad message length",
            "bad message type",
        ],
    ),
    (
        OPEN_MESSAGE_ERROR,
        "OPEN message error",
        &[
            "",
            "unsupported version number",
            "bad peer AS",
            "bad BGP identifier",
            "unsupported optional parameter",
            "",
            "unacceptable hold time",
            "unsupported capability",
            "",
            "",
            "",
            "role mismatch",
        ],
    ),
    (
        UPDATE_MESSAGE_ERROR,
        "UPDATE message error",
        &[
            "",
            "malformed attribute list",
            "unrecognized well-known attribute",
            "missing well-known attribute",
            "attribute flags error",
            "attribute length error",
            "invalid ORIGIN attribute",
            "",
            "invalid NEXT_HOP attribute",
            "optional attribute error",
            "invalid network field",
            "malformed AS_PATH",
        ],
    ),
    (HOLD_TIMER_EXPIRED, "hold timer expired", &[]),
    (
        FSM_ERROR,
        "finite state machine error",
        &[
            "",
            "unexpected message in OpenSent",
            "unexpected message in OpenConfirm",
            "unexpected message in Established",
        ],
    ),
    (
        CEASE,
        "Cease",
        &[
            "",
            "maximum number of prefixes reached",
            "administrative shutdown",
            "peer de-configured",
            "administrative reset",
            "connection rejected",
            "other configuration change",
            "connection collision resolution",
            "out of resources",
            "hard reset",
            "BFD down",
        ],
    ),
    (
        7,
        "ROUTE-REFRESH message error",
        &["", "invalid message length"],
    ),
];

/// The RFC names of a NOTIFICATION's code and subcode.
pub fn describe(code: u8, subcode: u8) -> String {
    let Some((_, name, subs)) = ERROR_NAMES.iter().find(|(c, _, _)| *c == code) else {
        return format!("unknown error code {code}, subcode {subcode}");
    };
    match subs.get(usize::from(subcode)) {
        Some(sub) if !sub.is_empty() => format!("{name}: {sub}"),
        _ if subcode == 0 => name.to_string(),
        _ => format!("{name}: subcode {subcode}"),
    }
}

fn encode(message: &BgpMessage) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(message.len());
    message
        .write(&mut out)
        .map_err(|e| WireError::Encode(e.to_string()))?;
    if out.len() > MAX_MESSAGE_LEN {
        return Err(WireError::Encode(format!(
            "{} bytes, more than {MAX_MESSAGE_LEN}",
            out.len()
        )));
    }
    Ok(out)
}

pub fn keepalive() -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_LEN);
    out.extend_from_slice(&MARKER);
    out.extend_from_slice(&(HEADER_LEN as u16).to_be_bytes());
    out.push(TYPE_KEEPALIVE);
    out
}

/// What our OPEN says about graceful restart (RFC 4724 §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GracefulRestartOffer {
    /// Restart State (R): this is the first session after `lbd` restarted.
    pub restarting: bool,
    /// Restart Time, seconds (at most 4095).
    pub restart_time: u16,
    /// Forwarding State (F) for IPv4 and IPv6 unicast: the XDP program
    /// kept forwarding through the restart.
    pub forwarding: bool,
}

/// Our OPEN: version 4, `local_as` (AS_TRANS in the 2-octet field when it
/// does not fit), `hold_time`, `router_id`, and one capabilities parameter:
/// multiprotocol IPv4 unicast, IPv6 unicast (RFC 4760), route refresh
/// (RFC 2918: a router that changes its import policy asks for our routes
/// again instead of resetting the session), 4-octet AS (RFC 6793), and
/// graceful restart (RFC 4724) if offered.
pub fn open(
    local_as: u32,
    hold_time: u16,
    router_id: Ipv4Addr,
    gr: Option<GracefulRestartOffer>,
) -> Result<Vec<u8>, WireError> {
    let my_as = u16::try_from(local_as).unwrap_or(AS_TRANS as u16);
    let mut capabilities = vec![
        BgpCapability::MultiProtocolExtensions(MultiProtocolExtensionsCapability::new(
            AddressType::Ipv4Unicast,
        )),
        BgpCapability::MultiProtocolExtensions(MultiProtocolExtensionsCapability::new(
            AddressType::Ipv6Unicast,
        )),
        BgpCapability::RouteRefresh,
        BgpCapability::FourOctetAs(FourOctetAsCapability::new(local_as)),
    ];
    if let Some(gr) = gr {
        capabilities.push(BgpCapability::GracefulRestartCapability(
            GracefulRestartCapability::new(
                gr.restarting,
                false,
                gr.restart_time.min(4095),
                [AddressType::Ipv4Unicast, AddressType::Ipv6Unicast]
                    .map(|t| GracefulRestartAddressFamily::new(gr.forwarding, t)),
            ),
        ));
    }
    encode(&BgpMessage::Open(BgpOpenMessage::new(
        my_as,
        hold_time,
        router_id,
        [BgpOpenMessageParameter::new_capabilities(capabilities)],
    )))
}

/// The attributes every announcement carries, apart from the next hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteAttrs {
    pub local_as: u32,
    /// External peer: AS_PATH `[local_as]`; internal: empty AS_PATH and
    /// LOCAL_PREF 100.
    pub ebgp: bool,
    /// Both sides sent the 4-octet AS capability: AS numbers in AS_PATH
    /// take 4 octets. Otherwise 2, with AS_TRANS plus an AS4_PATH when
    /// `local_as` needs 4.
    pub asn4: bool,
    /// A graceful shutdown is under way (RFC 8326): the GRACEFUL_SHUTDOWN
    /// community, and these attributes (LOCAL_PREF for internal peers
    /// only, MED, prepends for external ones only).
    pub shutdown: Option<ShutdownAttributes>,
}

fn attr(
    optional: bool,
    transitive: bool,
    extended_length: bool,
    value: PathAttributeValue,
) -> Result<PathAttribute, WireError> {
    PathAttribute::from(optional, transitive, false, extended_length, value)
        .map_err(|(_, e)| WireError::Encode(format!("path attribute flags: {e:?}")))
}

impl RouteAttrs {
    /// ORIGIN, AS_PATH, then in type-code order NEXT_HOP (of `middle`),
    /// MED, LOCAL_PREF and COMMUNITIES as needed, the rest of `middle`
    /// (MP_REACH_NLRI) and AS4_PATH.
    fn attributes(&self, middle: Vec<PathAttribute>) -> Result<Vec<PathAttribute>, WireError> {
        let mut out = vec![attr(
            false,
            true,
            false,
            PathAttributeValue::Origin(Origin::IGP),
        )?];
        let needs_as4_path = self.ebgp && !self.asn4 && self.local_as > u32::from(u16::MAX);
        let times = 1 + usize::from(self.shutdown.map_or(0, |s| s.prepend));
        let path4 = vec![self.local_as; times];
        let path2 = vec![u16::try_from(self.local_as).unwrap_or(AS_TRANS as u16); times];
        let as_path = match (self.ebgp, self.asn4) {
            (false, true) => AsPath::As4PathSegments(Box::new([])),
            (false, false) => AsPath::As2PathSegments(Box::new([])),
            (true, true) => AsPath::As4PathSegments(Box::new([As4PathSegment::new(
                AsPathSegmentType::AsSequence,
                path4.clone(),
            )])),
            (true, false) => AsPath::As2PathSegments(Box::new([As2PathSegment::new(
                AsPathSegmentType::AsSequence,
                path2,
            )])),
        };
        out.push(attr(
            false,
            true,
            false,
            PathAttributeValue::AsPath(as_path),
        )?);
        let (before_local_pref, after): (Vec<_>, Vec<_>) = middle
            .into_iter()
            .partition(|a| matches!(a.value(), PathAttributeValue::NextHop(_)));
        out.extend(before_local_pref);
        if let Some(med) = self.shutdown.and_then(|s| s.med) {
            out.push(attr(
                true,
                false,
                false,
                PathAttributeValue::MultiExitDiscriminator(MultiExitDiscriminator::new(med)),
            )?);
        }
        if !self.ebgp {
            let pref = self.shutdown.and_then(|s| s.local_pref).unwrap_or(100);
            out.push(attr(
                false,
                true,
                false,
                PathAttributeValue::LocalPreference(LocalPreference::new(pref)),
            )?);
        }
        if self.shutdown.is_some() {
            out.push(attr(
                true,
                true,
                false,
                PathAttributeValue::Communities(Communities::new([Community::new(
                    GRACEFUL_SHUTDOWN,
                )])),
            )?);
        }
        out.extend(after);
        if needs_as4_path {
            out.push(attr(
                true,
                true,
                false,
                PathAttributeValue::As4Path(As4Path::new([As4PathSegment::new(
                    AsPathSegmentType::AsSequence,
                    path4,
                )])),
            )?);
        }
        Ok(out)
    }
}

fn v4_nlri(prefixes: &[Ipv4Addr]) -> Result<Vec<Ipv4UnicastAddress>, WireError> {
    prefixes
        .iter()
        .map(|&a| {
            Ipv4Unicast::from_net(Ipv4Net::from(a))
                .map(Ipv4UnicastAddress::new_no_path_id)
                .map_err(|_| WireError::NotUnicast(format!("{a}/32")))
        })
        .collect()
}

fn v6_nlri(prefixes: &[Ipv6Addr]) -> Result<Vec<Ipv6UnicastAddress>, WireError> {
    prefixes
        .iter()
        .map(|&a| {
            Ipv6Unicast::from_net(Ipv6Net::from(a))
                .map(|n| Ipv6UnicastAddress::new(None, n))
                .map_err(|_| WireError::NotUnicast(format!("{a}/128")))
        })
        .collect()
}

fn update(
    withdrawn: Vec<Ipv4UnicastAddress>,
    attributes: Vec<PathAttribute>,
    nlri: Vec<Ipv4UnicastAddress>,
) -> Result<Vec<u8>, WireError> {
    encode(&BgpMessage::Update(BgpUpdateMessage::new(
        withdrawn, attributes, nlri,
    )))
}

/// UPDATEs announcing `prefixes` as /32s with NEXT_HOP `next_hop`.
pub fn announce_v4(
    attrs: &RouteAttrs,
    next_hop: Ipv4Addr,
    prefixes: &[Ipv4Addr],
) -> Result<Vec<Vec<u8>>, WireError> {
    prefixes
        .chunks(V4_PER_UPDATE)
        .map(|chunk| {
            let next_hop = attr(
                false,
                true,
                false,
                PathAttributeValue::NextHop(NextHop::new(next_hop)),
            )?;
            update(vec![], attrs.attributes(vec![next_hop])?, v4_nlri(chunk)?)
        })
        .collect()
}

/// UPDATEs withdrawing `prefixes` (/32s).
pub fn withdraw_v4(prefixes: &[Ipv4Addr]) -> Result<Vec<Vec<u8>>, WireError> {
    prefixes
        .chunks(V4_PER_UPDATE)
        .map(|chunk| update(v4_nlri(chunk)?, vec![], vec![]))
        .collect()
}

/// UPDATEs announcing `prefixes` as /128s in MP_REACH_NLRI with the
/// global next hop `next_hop`.
pub fn announce_v6(
    attrs: &RouteAttrs,
    next_hop: Ipv6Addr,
    prefixes: &[Ipv6Addr],
) -> Result<Vec<Vec<u8>>, WireError> {
    prefixes
        .chunks(V6_PER_UPDATE)
        .map(|chunk| {
            let reach = attr(
                true,
                false,
                true,
                PathAttributeValue::MpReach(MpReach::Ipv6Unicast {
                    next_hop_global: next_hop,
                    next_hop_local: None,
                    nlri: v6_nlri(chunk)?.into(),
                }),
            )?;
            update(vec![], attrs.attributes(vec![reach])?, vec![])
        })
        .collect()
}

/// UPDATEs withdrawing `prefixes` (/128s) in MP_UNREACH_NLRI.
pub fn withdraw_v6(prefixes: &[Ipv6Addr]) -> Result<Vec<Vec<u8>>, WireError> {
    prefixes
        .chunks(V6_PER_UPDATE)
        .map(|chunk| {
            let unreach = attr(
                true,
                false,
                true,
                PathAttributeValue::MpUnreach(MpUnreach::Ipv6Unicast {
                    nlri: v6_nlri(chunk)?.into(),
                }),
            )?;
            update(vec![], vec![unreach], vec![])
        })
        .collect()
}

/// End-of-RIB for IPv4 unicast (RFC 4724 §2): an UPDATE with nothing in
/// it.
pub fn end_of_rib_v4() -> Vec<u8> {
    let mut out = MARKER.to_vec();
    out.extend_from_slice(&23u16.to_be_bytes());
    out.extend_from_slice(&[TYPE_UPDATE, 0, 0, 0, 0]);
    out
}

/// End-of-RIB for IPv6 unicast: an UPDATE whose only attribute is an
/// empty MP_UNREACH_NLRI for AFI 2, SAFI 1.
pub fn end_of_rib_v6() -> Vec<u8> {
    let mut out = MARKER.to_vec();
    out.extend_from_slice(&29u16.to_be_bytes());
    out.extend_from_slice(&[TYPE_UPDATE, 0, 0, 0, 6, 0x80, 15, 3, 0, 2, 1]);
    out
}

/// A message from the peer.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Open(BgpOpenMessage),
    /// Parsed and checked, then ignored: we take no routes.
    Update,
    /// An UPDATE whose attributes are malformed (or missing, or unknown
    /// and well-known), handled as RFC 7606's "treat-as-withdraw": the
    /// peer's routes in it are withdrawn, which for a speaker that keeps
    /// none means ignored. The session goes on.
    UpdateIgnored(String),
    Notification(Notification),
    Keepalive,
    RouteRefresh,
}

impl Message {
    pub fn type_code(&self) -> u8 {
        match self {
            Self::Open(_) => TYPE_OPEN,
            Self::Update | Self::UpdateIgnored(_) => TYPE_UPDATE,
            Self::Notification(_) => TYPE_NOTIFICATION,
            Self::Keepalive => TYPE_KEEPALIVE,
            Self::RouteRefresh => TYPE_ROUTE_REFRESH,
        }
    }
}

/// Why the peer's bytes cannot be used; the session ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed {
    /// What to send before closing (never in answer to a NOTIFICATION).
    pub reply: Option<Notification>,
    pub detail: String,
}

/// Splits the peer's byte stream into messages and checks each one.
pub struct Decoder {
    buf: Vec<u8>,
    ctx: BgpParsingContext,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    pub fn new() -> Self {
        Self {
            buf: Vec::new(),
            // 2-octet AS numbers until both OPENs carry the capability;
            // no ADD-PATH, no multiple labels (not negotiated). Malformed
            // capabilities (we use only two, checked in the session) and
            // non-unicast NLRI (we ignore routes) do not end the session;
            // malformed path attributes do (RFC 4271 §6.3).
            ctx: BgpParsingContext::new(
                false,
                HashMap::new(),
                HashMap::new(),
                false,
                false,
                false,
                true,
            ),
        }
    }

    /// Whether AS numbers in the peer's AS_PATHs take 4 octets.
    pub fn set_asn4(&mut self, asn4: bool) {
        self.ctx.set_asn4(asn4);
    }

    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete message, `None` until one has fully arrived.
    pub fn next_message(&mut self) -> Result<Option<Message>, Malformed> {
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let header_error = |subcode: u8, data: Vec<u8>, detail: String| Malformed {
            reply: Some(Notification::new(MESSAGE_HEADER_ERROR, subcode, data)),
            detail,
        };
        if self.buf[..16] != MARKER {
            return Err(header_error(
                1,
                vec![],
                "message marker is not all ones".into(),
            ));
        }
        let len_bytes = [self.buf[16], self.buf[17]];
        let len = usize::from(u16::from_be_bytes(len_bytes));
        let msg_type = self.buf[18];
        let min_len = match msg_type {
            TYPE_OPEN => 29,
            TYPE_UPDATE => 23,
            TYPE_NOTIFICATION => 21,
            TYPE_KEEPALIVE => HEADER_LEN,
            TYPE_ROUTE_REFRESH => 23,
            other => {
                return Err(header_error(
                    3,
                    vec![other],
                    format!("unknown message type {other}"),
                ));
            }
        };
        let exact = matches!(msg_type, TYPE_KEEPALIVE | TYPE_ROUTE_REFRESH);
        if len < min_len || len > MAX_MESSAGE_LEN || (exact && len != min_len) {
            let mut e = header_error(
                2,
                len_bytes.to_vec(),
                format!("bad length {len} for a message of type {msg_type}"),
            );
            // RFC 4271 §6.4: an error in a NOTIFICATION is not answered
            // with one.
            if msg_type == TYPE_NOTIFICATION {
                e.reply = None;
            }
            return Err(e);
        }
        if self.buf.len() < len {
            return Ok(None);
        }
        let frame: Vec<u8> = self.buf.drain(..len).collect();
        let body = &frame[HEADER_LEN..];
        match msg_type {
            TYPE_KEEPALIVE => Ok(Some(Message::Keepalive)),
            TYPE_ROUTE_REFRESH => Ok(Some(Message::RouteRefresh)),
            // Read raw: any code the peer sends is reported as it is.
            TYPE_NOTIFICATION => Ok(Some(Message::Notification(Notification::new(
                body[0],
                body[1],
                &body[2..],
            )))),
            _ => self.parse(&frame),
        }
    }

    fn parse(&mut self, frame: &[u8]) -> Result<Option<Message>, Malformed> {
        let is_update = frame[18] == TYPE_UPDATE;
        if is_update {
            check_update_lengths(&frame[HEADER_LEN..])?;
            strict::check_update(&frame[HEADER_LEN..])?;
        } else {
            strict::check_open(&frame[HEADER_LEN..])?;
        }
        let parsed = BgpMessage::parse(&mut SliceReader::new(frame), &mut self.ctx);
        // Errors tolerated by the context pile up in it: drop them.
        let _ = self.ctx.reset_parsing_errors();
        match parsed {
            Ok(BgpMessage::Open(open)) => Ok(Some(Message::Open(open))),
            Ok(BgpMessage::Update(update)) => Ok(Some(match check_well_known(&update) {
                Ok(()) => Message::Update,
                Err(missing) => Message::UpdateIgnored(missing.detail),
            })),
            // RFC 7606: the lengths are sound, so the error is in the
            // attributes: treat-as-withdraw.
            Err(e) if is_update => Ok(Some(Message::UpdateIgnored(e.to_string()))),
            Ok(other) => Err(Malformed {
                reply: Some(Notification::new(MESSAGE_HEADER_ERROR, 0, [])),
                detail: format!(
                    "parser returned a {:?} for an OPEN or UPDATE",
                    other.get_type()
                ),
            }),
            Err(e) => Err(Malformed {
                detail: e.to_string(),
                reply: Some(Notification::from_netgauze(e.into())),
            }),
        }
    }
}

/// RFC 7606 §4/§5.3: the Withdrawn Routes Length and Total Path
/// Attribute Length must fit the message, or the NLRI cannot be located
/// and no error handling but a session reset is safe (UPDATE Message
/// Error, Malformed Attribute List). Every other UPDATE error is an
/// attribute's, handled as treat-as-withdraw.
fn check_update_lengths(body: &[u8]) -> Result<(), Malformed> {
    let len = |at: usize| -> Option<usize> {
        Some(usize::from(u16::from_be_bytes([
            *body.get(at)?,
            *body.get(at + 1)?,
        ])))
    };
    let fits = len(0).and_then(|withdrawn| {
        let attrs = len(2 + withdrawn)?;
        (4 + withdrawn + attrs <= body.len()).then_some(())
    });
    fits.ok_or_else(|| Malformed {
        reply: Some(Notification::new(UPDATE_MESSAGE_ERROR, 1, [])),
        detail: "UPDATE whose withdrawn-routes or path-attribute length overruns the message"
            .into(),
    })
}

/// RFC 4271 §6.3: an UPDATE that carries routes must have ORIGIN and
/// AS_PATH, and NEXT_HOP for classic IPv4 NLRI (RFC 7606 §3.d: without
/// them, treat-as-withdraw).
fn check_well_known(update: &BgpUpdateMessage) -> Result<(), Malformed> {
    // RFC 4271 §6.3: a well-known attribute (optional bit clear) that is
    // not one we know (RFC 7606 §3: treat-as-withdraw).
    if let Some(code) = update
        .path_attributes()
        .iter()
        .find_map(|a| match a.value() {
            PathAttributeValue::UnknownAttribute(u) if !a.optional() => Some(u.code()),
            _ => None,
        })
    {
        return Err(Malformed {
            reply: Some(Notification::new(UPDATE_MESSAGE_ERROR, 2, [code])),
            detail: format!("UPDATE with an unrecognized well-known attribute (type {code})"),
        });
    }
    let has =
        |f: fn(&PathAttributeValue) -> bool| update.path_attributes().iter().any(|a| f(a.value()));
    let reaches = has(|v| matches!(v, PathAttributeValue::MpReach(_)));
    if update.nlri().is_empty() && !reaches {
        return Ok(());
    }
    let mut required: Vec<(u8, &str, bool)> = vec![
        (
            1,
            "ORIGIN",
            has(|v| matches!(v, PathAttributeValue::Origin(_))),
        ),
        (
            2,
            "AS_PATH",
            has(|v| matches!(v, PathAttributeValue::AsPath(_))),
        ),
    ];
    if !update.nlri().is_empty() {
        required.push((
            3,
            "NEXT_HOP",
            has(|v| matches!(v, PathAttributeValue::NextHop(_))),
        ));
    }
    match required.into_iter().find(|(_, _, present)| !present) {
        None => Ok(()),
        Some((code, name, _)) => Err(Malformed {
            reply: Some(Notification::new(UPDATE_MESSAGE_ERROR, 3, [code])),
            detail: format!("UPDATE with routes but no {name} attribute"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: u16, msg_type: u8) -> Vec<u8> {
        let mut v = vec![0xff; 16];
        v.extend_from_slice(&len.to_be_bytes());
        v.push(msg_type);
        v
    }

    /// Builds a message from its body: header with the right length.
    fn message(msg_type: u8, body: &[u8]) -> Vec<u8> {
        let mut v = header((HEADER_LEN + body.len()) as u16, msg_type);
        v.extend_from_slice(body);
        v
    }

    fn decode_all(bytes: &[u8]) -> Result<Vec<Message>, Malformed> {
        let mut d = Decoder::new();
        d.extend(bytes);
        let mut out = Vec::new();
        while let Some(m) = d.next_message()? {
            out.push(m);
        }
        Ok(out)
    }

    fn reply_of(bytes: &[u8]) -> Notification {
        decode_all(bytes)
            .expect_err("malformed")
            .reply
            .expect("a NOTIFICATION to send")
    }

    #[test]
    fn keepalive_is_marker_and_19_4() {
        let mut want = vec![0xff; 16];
        want.extend_from_slice(&[0x00, 0x13, 0x04]);
        assert_eq!(keepalive(), want);
        assert_eq!(decode_all(&want).expect("valid"), vec![Message::Keepalive]);
    }

    #[test]
    fn open_matches_the_rfc_layout() {
        let got = open(65001, 90, Ipv4Addr::new(10, 0, 0, 11), None).expect("encodes");
        #[rustfmt::skip]
        let body = [
            4,                      // version
            0xfd, 0xe9,             // my AS 65001
            0x00, 0x5a,             // hold time 90
            10, 0, 0, 11,           // BGP identifier
            22,                     // optional parameters length
            2, 20,                  // parameter: capabilities, 20 bytes
            1, 4, 0, 1, 0, 1,       // multiprotocol IPv4 unicast
            1, 4, 0, 2, 0, 1,       // multiprotocol IPv6 unicast
            2, 0,                   // route refresh (RFC 2918)
            65, 4, 0, 0, 0xfd, 0xe9, // 4-octet AS 65001
        ];
        assert_eq!(got, message(TYPE_OPEN, &body));
    }

    #[test]
    fn graceful_restart_is_capability_64_with_r_f_and_the_time() {
        let gr = GracefulRestartOffer {
            restarting: true,
            restart_time: 120,
            forwarding: true,
        };
        let got = open(65001, 90, Ipv4Addr::new(10, 0, 0, 11), Some(gr)).expect("encodes");
        #[rustfmt::skip]
        let body = [
            4, 0xfd, 0xe9, 0x00, 0x5a, 10, 0, 0, 11,
            34,                     // optional parameters length
            2, 32,                  // capabilities, 32 bytes
            1, 4, 0, 1, 0, 1,
            1, 4, 0, 2, 0, 1,
            2, 0,
            65, 4, 0, 0, 0xfd, 0xe9,
            64, 10,                 // graceful restart, 10 bytes
            0x80, 120,              // R, restart time 120
            0, 1, 1, 0x80,          // IPv4 unicast, F
            0, 2, 1, 0x80,          // IPv6 unicast, F
        ];
        assert_eq!(got, message(TYPE_OPEN, &body));
        // A fresh start: no R, no F.
        let fresh = GracefulRestartOffer {
            restarting: false,
            forwarding: false,
            ..gr
        };
        let got = open(65001, 90, Ipv4Addr::new(10, 0, 0, 11), Some(fresh)).unwrap();
        assert_eq!(&got[got.len() - 10..], &[0, 120, 0, 1, 1, 0, 0, 2, 1, 0]);
    }

    #[test]
    fn end_of_rib_markers_are_rfc_4724s() {
        assert_eq!(end_of_rib_v4(), message(TYPE_UPDATE, &[0, 0, 0, 0]));
        assert_eq!(
            end_of_rib_v6(),
            message(TYPE_UPDATE, &[0, 0, 0, 6, 0x80, 15, 3, 0, 2, 1])
        );
        for m in [end_of_rib_v4(), end_of_rib_v6()] {
            assert_eq!(decode_all(&m).expect("valid"), vec![Message::Update]);
        }
    }

    #[test]
    fn graceful_shutdown_adds_the_community_med_and_prepends() {
        let attrs = RouteAttrs {
            shutdown: Some(ShutdownAttributes {
                local_pref: Some(0),
                med: Some(50),
                prepend: 2,
            }),
            ..EBGP4
        };
        let got = announce_v4(
            &attrs,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1)],
        )
        .expect("encodes");
        #[rustfmt::skip]
        let body = [
            0, 0, 0, 42,
            0x40, 1, 1, 0,                                  // ORIGIN IGP
            0x40, 2, 14, 2, 3, 0, 0, 0xfd, 0xe9, 0, 0, 0xfd, 0xe9, 0, 0, 0xfd, 0xe9,
            0x40, 3, 4, 10, 98, 0, 2,                       // NEXT_HOP
            0x80, 4, 4, 0, 0, 0, 50,                        // MED 50
            0xc0, 8, 4, 0xff, 0xff, 0, 0,                   // GRACEFUL_SHUTDOWN
            32, 10, 99, 0, 1,
        ];
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
        // Internal: LOCAL_PREF as configured, no prepends.
        let ibgp = RouteAttrs {
            ebgp: false,
            ..attrs
        };
        let got = announce_v4(
            &ibgp,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1)],
        )
        .unwrap()
        .remove(0);
        let body = &got[HEADER_LEN..];
        let lp = [0x40, 5, 4, 0, 0, 0, 0];
        assert!(body.windows(7).any(|w| w == lp), "LOCAL_PREF 0 in {body:?}");
        assert!(body.windows(3).any(|w| w == [0x40, 2, 0]), "empty AS_PATH");
    }

    #[test]
    fn open_with_a_4_octet_as_puts_as_trans_in_the_2_octet_field() {
        let got = open(4_200_000_001, 3, Ipv4Addr::new(192, 0, 2, 1), None).expect("encodes");
        assert_eq!(&got[20..22], &[0x5b, 0xa0], "AS_TRANS 23456");
        assert_eq!(&got[22..24], &[0, 3], "hold time");
        assert_eq!(
            &got[got.len() - 6..],
            &[65, 4, 0xfa, 0x56, 0xea, 0x01],
            "4-octet AS capability carries 4200000001"
        );
        // And it parses back as an OPEN with that AS.
        match decode_all(&got).expect("valid").as_slice() {
            [Message::Open(o)] => {
                assert_eq!(o.my_asn4(), 4_200_000_001);
                assert_eq!(o.hold_time(), 3);
            }
            other => panic!("{other:?}"),
        }
    }

    const EBGP4: RouteAttrs = RouteAttrs {
        local_as: 65001,
        ebgp: true,
        asn4: true,
        shutdown: None,
    };

    #[test]
    fn ipv4_announcement_matches_the_rfc_layout() {
        let got = announce_v4(
            &EBGP4,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1), Ipv4Addr::new(10, 99, 0, 2)],
        )
        .expect("encodes");
        #[rustfmt::skip]
        let body = [
            0, 0,                               // withdrawn routes length
            0, 20,                              // path attributes length
            0x40, 1, 1, 0,                      // ORIGIN IGP
            0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xe9, // AS_PATH: AS_SEQUENCE [65001]
            0x40, 3, 4, 10, 98, 0, 2,           // NEXT_HOP
            32, 10, 99, 0, 1,                   // NLRI 10.99.0.1/32
            32, 10, 99, 0, 2,                   // NLRI 10.99.0.2/32
        ];
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
    }

    #[test]
    fn ibgp_announcement_has_an_empty_as_path_and_local_pref() {
        let ibgp = RouteAttrs {
            ebgp: false,
            ..EBGP4
        };
        let got = announce_v4(
            &ibgp,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1)],
        )
        .expect("encodes");
        #[rustfmt::skip]
        let body = [
            0, 0, 0, 21,
            0x40, 1, 1, 0,                      // ORIGIN IGP
            0x40, 2, 0,                         // AS_PATH empty
            0x40, 3, 4, 10, 98, 0, 2,           // NEXT_HOP
            0x40, 5, 4, 0, 0, 0, 100,           // LOCAL_PREF 100
            32, 10, 99, 0, 1,
        ];
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
    }

    #[test]
    fn two_octet_peers_get_as_trans_and_as4_path() {
        let attrs = RouteAttrs {
            local_as: 4_200_000_001,
            ebgp: true,
            asn4: false,
            shutdown: None,
        };
        let got = announce_v4(
            &attrs,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1)],
        )
        .expect("encodes");
        #[rustfmt::skip]
        let body = [
            0, 0, 0, 27,
            0x40, 1, 1, 0,
            0x40, 2, 4, 2, 1, 0x5b, 0xa0,               // AS_PATH [AS_TRANS]
            0x40, 3, 4, 10, 98, 0, 2,
            0xc0, 17, 6, 2, 1, 0xfa, 0x56, 0xea, 0x01,  // AS4_PATH [4200000001]
            32, 10, 99, 0, 1,
        ];
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
    }

    #[test]
    fn ipv4_withdrawal_matches_the_rfc_layout() {
        let got = withdraw_v4(&[Ipv4Addr::new(10, 99, 0, 1)]).expect("encodes");
        let body = [0, 5, 32, 10, 99, 0, 1, 0, 0];
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
    }

    #[test]
    fn ipv6_announcement_uses_mp_reach_nlri() {
        let nh: Ipv6Addr = "fd00:98::2".parse().unwrap();
        let vip: Ipv6Addr = "fd00:99::1".parse().unwrap();
        let got = announce_v6(&EBGP4, nh, &[vip]).expect("encodes");
        let mut body = vec![
            0, 0, // withdrawn routes length
            0, 55, // path attributes length
            0x40, 1, 1, 0, // ORIGIN
            0x40, 2, 6, 2, 1, 0, 0, 0xfd, 0xe9, // AS_PATH
            0x90, 14, 0, 38, // MP_REACH_NLRI: optional, extended length, 38 bytes
            0, 2, 1,  // AFI IPv6, SAFI unicast
            16, // next hop length
        ];
        body.extend_from_slice(&nh.octets());
        body.push(0); // reserved
        body.push(128);
        body.extend_from_slice(&vip.octets());
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
    }

    #[test]
    fn ipv6_withdrawal_uses_mp_unreach_nlri() {
        let vip: Ipv6Addr = "fd00:99::1".parse().unwrap();
        let got = withdraw_v6(&[vip]).expect("encodes");
        let mut body = vec![0, 0, 0, 24, 0x90, 15, 0, 20, 0, 2, 1, 128];
        body.extend_from_slice(&vip.octets());
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
    }

    #[test]
    fn big_sets_are_split_into_messages_of_at_most_4096_bytes() {
        let v4: Vec<Ipv4Addr> = (0..2000u32)
            .map(|i| Ipv4Addr::from(0x0a63_0000 + i))
            .collect();
        let v6: Vec<Ipv6Addr> = (0..500u128)
            .map(|i| Ipv6Addr::from(0xfd00_0099_u128 << 96 | (i + 1)))
            .collect();
        for (what, msgs, count) in [
            (
                "v4 announce",
                announce_v4(&EBGP4, Ipv4Addr::new(10, 0, 0, 1), &v4),
                3,
            ),
            ("v4 withdraw", withdraw_v4(&v4), 3),
            (
                "v6 announce",
                announce_v6(&EBGP4, "fd00::1".parse().unwrap(), &v6),
                3,
            ),
            ("v6 withdraw", withdraw_v6(&v6), 3),
        ] {
            let msgs = msgs.expect(what);
            assert_eq!(msgs.len(), count, "{what}");
            for m in &msgs {
                assert!(m.len() <= MAX_MESSAGE_LEN, "{what}: {} bytes", m.len());
                let mut d = Decoder::new();
                d.set_asn4(true);
                d.extend(m);
                assert_eq!(d.next_message(), Ok(Some(Message::Update)), "{what}");
            }
        }
    }

    #[test]
    fn messages_split_across_reads_are_reassembled() {
        let mut d = Decoder::new();
        let mut stream = keepalive();
        stream.extend(open(65000, 3, Ipv4Addr::new(10, 0, 0, 1), None).unwrap());
        stream.extend(keepalive());
        let mut got = Vec::new();
        for byte in stream {
            d.extend(&[byte]);
            while let Some(m) = d.next_message().expect("valid") {
                got.push(m.type_code());
            }
        }
        assert_eq!(got, [TYPE_KEEPALIVE, TYPE_OPEN, TYPE_KEEPALIVE]);
    }

    #[test]
    fn notifications_round_trip_with_any_code() {
        let n = Notification::cease();
        let bytes = n.encode();
        let mut want = vec![0xff; 16];
        want.extend_from_slice(&[0, 21, 3, 6, 2]);
        assert_eq!(bytes, want);
        assert_eq!(n.to_string(), "6/2 (Cease: administrative shutdown)");
        // A code no RFC defines is still reported, not refused.
        let odd = Notification::new(42, 7, [1, 2, 3]);
        assert_eq!(
            decode_all(&odd.encode()).expect("valid"),
            vec![Message::Notification(odd)]
        );
    }

    #[test]
    fn header_errors_get_rfc_4271_subcodes_and_data() {
        let mut bad_marker = keepalive();
        bad_marker[3] = 0;
        assert_eq!(reply_of(&bad_marker), Notification::new(1, 1, []));

        assert_eq!(
            reply_of(&header(18, TYPE_KEEPALIVE)),
            Notification::new(1, 2, [0, 18])
        );
        assert_eq!(
            reply_of(&header(20, TYPE_KEEPALIVE)),
            Notification::new(1, 2, [0, 20])
        );
        assert_eq!(
            reply_of(&header(4097, TYPE_UPDATE)),
            Notification::new(1, 2, [0x10, 0x01])
        );
        assert_eq!(
            reply_of(&header(28, TYPE_OPEN)),
            Notification::new(1, 2, [0, 28])
        );
        assert_eq!(reply_of(&header(19, 9)), Notification::new(1, 3, [9]));
        // A broken NOTIFICATION is not answered with one (RFC 4271 §6.4).
        let broken = decode_all(&header(20, TYPE_NOTIFICATION)).expect_err("too short");
        assert_eq!(broken.reply, None);
    }

    /// Every length limit at its exact bound: the largest message passes
    /// and one byte more does not; an UPDATE whose attributes fill the
    /// message exactly passes, one byte short of its stated length resets.
    #[test]
    fn lengths_are_checked_at_their_exact_bounds() {
        // 4096 bytes: 4077 of body = 2 + withdrawn (one /32 and 1017 /24
        // prefixes: 5 + 4068 bytes) + 2.
        let mut withdrawn = vec![32, 10, 0, 0, 1];
        for i in 0..1017u32 {
            withdrawn.extend_from_slice(&[24, 10, (i >> 8) as u8, i as u8]);
        }
        let mut body = (withdrawn.len() as u16).to_be_bytes().to_vec();
        body.extend_from_slice(&withdrawn);
        body.extend_from_slice(&[0, 0]);
        let largest = message(TYPE_UPDATE, &body);
        assert_eq!(largest.len(), MAX_MESSAGE_LEN);
        assert_eq!(
            decode_all(&largest).expect("4096 bytes is allowed").len(),
            1
        );
        assert_eq!(
            reply_of(&header(4097, TYPE_UPDATE)),
            Notification::new(1, 2, [0x10, 0x01])
        );
        // ORIGIN IGP, exactly as long as the attributes length says.
        let exact = message(TYPE_UPDATE, &[0, 0, 0, 4, 0x40, 1, 1, 0]);
        assert_eq!(decode_all(&exact).expect("lengths that fit").len(), 1);
        for short_by in 1..=2u8 {
            let over = message(TYPE_UPDATE, &[0, 0, 0, 4 + short_by, 0x40, 1, 1, 0]);
            assert_eq!(reply_of(&over), Notification::new(3, 1, []), "{short_by}");
            let withdrawn_over = message(TYPE_UPDATE, &[0, 5 + short_by, 32, 10, 0, 0, 1, 0, 0]);
            assert_eq!(
                reply_of(&withdrawn_over),
                Notification::new(3, 1, []),
                "{short_by}"
            );
        }
    }

    #[test]
    fn open_errors_get_open_message_error_codes() {
        let good = open(65000, 3, Ipv4Addr::new(10, 0, 0, 1), None).unwrap();
        let mut version = good.clone();
        version[19] = 3;
        assert_eq!(reply_of(&version).code, OPEN_MESSAGE_ERROR);
        assert_eq!(reply_of(&version).subcode, 1);

        let mut hold = good.clone();
        hold[22..24].copy_from_slice(&[0, 2]);
        assert_eq!(reply_of(&hold), Notification::new(2, 6, [0, 2]));

        let mut id = good.clone();
        id[24..28].copy_from_slice(&[0, 0, 0, 0]);
        assert_eq!((reply_of(&id).code, reply_of(&id).subcode), (2, 3));

        // Optional parameters length pointing past the message.
        let mut params = good;
        params[28] = 200;
        assert_eq!(reply_of(&params).code, OPEN_MESSAGE_ERROR);
    }

    #[test]
    fn update_errors_get_update_message_error_codes() {
        // Withdrawn routes length larger than the message.
        let overflow = message(TYPE_UPDATE, &[0, 50, 0, 0]);
        assert_eq!(reply_of(&overflow), Notification::new(3, 1, []));

        // Attributes past the message: the NLRI cannot be found, reset.
        let attrs_overflow = message(TYPE_UPDATE, &[0, 0, 0, 40, 0x40, 1, 1, 0]);
        assert_eq!(reply_of(&attrs_overflow), Notification::new(3, 1, []));

        // Attribute errors are treat-as-withdraw (RFC 7606): the UPDATE is
        // ignored and the session goes on. ORIGIN 7 does not exist.
        let bad_origin = message(
            TYPE_UPDATE,
            &[
                0, 0, 0, 14, 0x40, 1, 1, 7, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1, 32, 10, 99, 0, 1,
            ],
        );
        // Routes without NEXT_HOP.
        let no_next_hop = message(
            TYPE_UPDATE,
            &[0, 0, 0, 7, 0x40, 1, 1, 0, 0x40, 2, 0, 32, 10, 99, 0, 1],
        );
        // COMMUNITIES (optional transitive, type 8) of 3 bytes: not a
        // multiple of 4.
        let short_communities = message(
            TYPE_UPDATE,
            &[
                0, 0, 0, 20, 0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1, 0xc0, 8, 3, 1, 2,
                3, 32, 10, 99, 0, 1,
            ],
        );
        // A well-known attribute (optional bit clear) of a type nobody
        // defined (99).
        let unknown_well_known = message(
            TYPE_UPDATE,
            &[
                0, 0, 0, 19, 0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1, 0x40, 99, 2, 0, 0,
                32, 10, 99, 0, 1,
            ],
        );
        for (what, m) in [
            ("ORIGIN 7", &bad_origin),
            ("no NEXT_HOP", &no_next_hop),
            ("3-byte COMMUNITIES", &short_communities),
            ("unknown well-known attribute", &unknown_well_known),
        ] {
            let mut d = Decoder::new();
            d.set_asn4(true);
            d.extend(m);
            // A KEEPALIVE after it is read as usual: the stream is intact.
            d.extend(&keepalive());
            match d.next_message() {
                Ok(Some(Message::UpdateIgnored(why))) => assert!(!why.is_empty(), "{what}"),
                other => panic!("{what}: {other:?}"),
            }
            assert_eq!(d.next_message(), Ok(Some(Message::Keepalive)), "{what}");
        }

        // A peer's ordinary UPDATE (and an End-of-RIB) is accepted.
        let routes = announce_v4(
            &EBGP4,
            Ipv4Addr::new(10, 0, 0, 1),
            &[Ipv4Addr::new(10, 1, 0, 0)],
        )
        .unwrap();
        let mut d = Decoder::new();
        d.set_asn4(true);
        d.extend(&routes[0]);
        d.extend(&message(TYPE_UPDATE, &[0, 0, 0, 0]));
        assert_eq!(d.next_message(), Ok(Some(Message::Update)));
        assert_eq!(d.next_message(), Ok(Some(Message::Update)));
        assert_eq!(d.next_message(), Ok(None));
    }

    #[test]
    fn malformed_input_never_panics() {
        // Every truncation and every single-byte corruption of valid
        // messages either decodes or yields a NOTIFICATION.
        let mut samples = vec![
            open(65001, 90, Ipv4Addr::new(10, 0, 0, 11), None).unwrap(),
            keepalive(),
            Notification::cease().encode(),
        ];
        samples.extend(
            announce_v4(
                &EBGP4,
                Ipv4Addr::new(10, 0, 0, 1),
                &[Ipv4Addr::new(10, 99, 0, 1)],
            )
            .unwrap(),
        );
        samples.extend(
            announce_v6(
                &EBGP4,
                "fd00::1".parse().unwrap(),
                &["fd00:99::1".parse().unwrap()],
            )
            .unwrap(),
        );
        samples.extend(withdraw_v6(&["fd00:99::1".parse().unwrap()]).unwrap());
        for sample in &samples {
            for cut in 0..sample.len() {
                let mut d = Decoder::new();
                d.extend(&sample[..cut]);
                let _ = d.next_message();
            }
            for at in HEADER_LEN..sample.len() {
                for value in [0u8, 1, 0x7f, 0x80, 0xff] {
                    let mut m = sample.clone();
                    m[at] = value;
                    if let Err(e) = decode_all(&m) {
                        assert!(e.reply.is_some(), "no reply for {m:?}: {}", e.detail);
                    }
                }
            }
        }
    }

    #[test]
    fn descriptions_name_code_and_subcode() {
        assert_eq!(describe(4, 0), "hold timer expired");
        assert_eq!(describe(1, 2), "message header error: bad message length");
        assert_eq!(describe(3, 99), "UPDATE message error: subcode 99");
        assert_eq!(describe(99, 1), "unknown error code 99, subcode 1");
        // Subcode 0 of a code with named subcodes is the code alone; a
        // gap in the names (OPEN subcode 5 is deprecated) is a number.
        assert_eq!(describe(6, 0), "Cease");
        assert_eq!(describe(2, 5), "OPEN message error: subcode 5");
        assert_eq!(
            describe(7, 1),
            "ROUTE-REFRESH message error: invalid message length"
        );
    }

    /// RFC 4271 §4.5: a NOTIFICATION is a message like any other, at most
    /// 4096 bytes; data that would not fit is cut at 4075 (4096 less the
    /// header and the two code bytes), not sent whole.
    #[test]
    fn a_notification_is_cut_to_4096_bytes() {
        let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
        for (len, kept) in [(5000, 4075), (4076, 4075), (4075, 4075), (213, 213)] {
            let bytes = Notification::new(6, 0, &data[..len]).encode();
            assert_eq!(bytes.len(), HEADER_LEN + 2 + kept, "{len}");
            assert_eq!(
                &bytes[16..21],
                &[((19 + 2 + kept) >> 8) as u8, (19 + 2 + kept) as u8, 3, 6, 0]
            );
            assert_eq!(&bytes[21..], &data[..kept], "{len}");
            let back = decode_all(&bytes).expect("a valid message");
            assert_eq!(
                back,
                vec![Message::Notification(Notification::new(
                    6,
                    0,
                    &data[..kept]
                ))]
            );
        }
    }

    /// The encoder's own limit at its exact bound: an UPDATE of 4096
    /// bytes (one /32 and 1017 /24s withdrawn: 23 + 5 + 4068) is sent,
    /// one of 4100 (a /24 more) is refused.
    #[test]
    fn the_encoder_allows_4096_bytes_and_no_more() {
        let prefix = |len: u8, i: u32| {
            let net = Ipv4Net::new(Ipv4Addr::from(0x0a00_0000 | i << 8), len).unwrap();
            Ipv4UnicastAddress::new_no_path_id(Ipv4Unicast::from_net(net).unwrap())
        };
        let mut withdrawn = vec![prefix(32, 1 << 16)];
        withdrawn.extend((0..1017).map(|i| prefix(24, i)));
        let largest = update(withdrawn.clone(), vec![], vec![]).expect("4096 bytes");
        assert_eq!(largest.len(), MAX_MESSAGE_LEN);
        withdrawn.push(prefix(24, 2000));
        let e = update(withdrawn, vec![], vec![]).expect_err("4100 bytes");
        assert!(e.to_string().contains("4100 bytes"), "{e}");
    }

    /// AS4_PATH (type 17) only where the 2-octet AS_PATH had to say
    /// AS_TRANS: on an external 2-octet session with an AS above 65535.
    /// AS 65535 fits, and an internal session's AS_PATH is empty.
    #[test]
    fn as4_path_only_when_as_trans_stood_in() {
        let two_octet = RouteAttrs {
            local_as: 65535,
            asn4: false,
            ..EBGP4
        };
        let got = announce_v4(
            &two_octet,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1)],
        )
        .unwrap();
        #[rustfmt::skip]
        let body = [
            0, 0, 0, 18,
            0x40, 1, 1, 0,                      // ORIGIN IGP
            0x40, 2, 4, 2, 1, 0xff, 0xff,       // AS_PATH: AS_SEQUENCE [65535]
            0x40, 3, 4, 10, 98, 0, 2,           // NEXT_HOP
            32, 10, 99, 0, 1,
        ];
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
        let internal = RouteAttrs {
            local_as: 4_200_000_001,
            ebgp: false,
            asn4: false,
            shutdown: None,
        };
        let got = announce_v4(
            &internal,
            Ipv4Addr::new(10, 98, 0, 2),
            &[Ipv4Addr::new(10, 99, 0, 1)],
        )
        .unwrap();
        #[rustfmt::skip]
        let body = [
            0, 0, 0, 21,
            0x40, 1, 1, 0,
            0x40, 2, 0,                         // AS_PATH empty
            0x40, 3, 4, 10, 98, 0, 2,
            0x40, 5, 4, 0, 0, 0, 100,           // LOCAL_PREF 100
            32, 10, 99, 0, 1,
        ];
        assert_eq!(got, vec![message(TYPE_UPDATE, &body)]);
    }

    /// ROUTE-REFRESH (RFC 2918): 23 bytes exactly, read and reported.
    #[test]
    fn route_refresh_is_read_at_its_one_length() {
        let refresh = message(TYPE_ROUTE_REFRESH, &[0, 1, 0, 1]);
        assert_eq!(decode_all(&refresh), Ok(vec![Message::RouteRefresh]));
        assert_eq!(
            reply_of(&message(TYPE_ROUTE_REFRESH, &[0, 1, 0, 1, 0])),
            Notification::new(1, 2, [0, 24])
        );
    }

    /// RFC 4271 §6.3 on a peer's UPDATEs: an unknown *optional*
    /// attribute is fine (only unknown well-known ones are not); routes
    /// in MP_REACH_NLRI need ORIGIN and AS_PATH but not NEXT_HOP.
    #[test]
    fn well_known_attributes_are_required_where_the_rfc_says() {
        let decode = |body: &[u8]| {
            let mut d = Decoder::new();
            d.set_asn4(true);
            d.extend(&message(TYPE_UPDATE, body));
            d.next_message().expect("not a reset").expect("whole")
        };
        #[rustfmt::skip]
        let unknown_optional = [
            0, 0, 0, 19,
            0x40, 1, 1, 0, 0x40, 2, 0, 0x40, 3, 4, 10, 0, 0, 1,
            0xc0, 99, 2, 0, 0,                  // optional transitive, type 99
            32, 10, 99, 0, 1,
        ];
        assert_eq!(decode(&unknown_optional), Message::Update);
        // MP_REACH_NLRI for fd00:99::1/128, next hop fd00::1.
        let mut reach = vec![0x90, 14, 0, 38, 0, 2, 1, 16, 0xfd];
        reach.extend_from_slice(&[0; 14]);
        reach.extend_from_slice(&[1, 0, 128, 0xfd, 0, 0, 0x99]);
        reach.extend_from_slice(&[0; 11]);
        reach.push(1);
        let with = |head: &[u8]| {
            let attrs = [head, &reach[..]].concat();
            let mut b = vec![0, 0];
            b.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
            b.extend_from_slice(&attrs);
            b
        };
        assert_eq!(decode(&with(&[0x40, 1, 1, 0, 0x40, 2, 0])), Message::Update);
        for (what, head) in [
            ("no ORIGIN", &[0x40, 2, 0][..]),
            ("no AS_PATH", &[0x40, 1, 1, 0][..]),
        ] {
            match decode(&with(head)) {
                Message::UpdateIgnored(why) => assert!(why.contains(&what[3..]), "{why}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }
}
