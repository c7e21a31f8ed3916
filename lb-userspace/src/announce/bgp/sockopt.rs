//! Socket calls a BGP session needs that no safe wrapper offers: the TCP
//! MD5 signature key for the peer (RFC 2385, `TCP_MD5SIG`), the minimum
//! TTL or hop limit of what it receives (GTSM, RFC 5082: `IP_MINTTL`,
//! `IPV6_MINHOPCOUNT`), and how much of what we sent the peer's TCP has
//! not acknowledged yet (`SIOCOUTQ`). The TTL we send with is set through
//! socket2.
//!
//! The library's one other `unsafe` is the Maglev builder's AVX-512
//! module; each call here is one `setsockopt(2)` or `ioctl(2)` on a socket
//! we own, with a value whose layout is the kernel's.
#![allow(unsafe_code)]

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::AsRawFd,
};

/// `TCP_MD5SIG_MAXKEYLEN` (include/uapi/linux/tcp.h).
pub use crate::config::announce::bgp::MD5_MAX_KEY;

/// `struct tcp_md5sig` (include/uapi/linux/tcp.h).
#[repr(C)]
struct TcpMd5Sig {
    addr: libc::sockaddr_storage,
    flags: u8,
    prefix_len: u8,
    key_len: u16,
    ifindex: libc::c_int,
    key: [u8; MD5_MAX_KEY],
}

const _: () = assert!(std::mem::size_of::<TcpMd5Sig>() == 216);

fn setsockopt<T>(
    fd: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: `value` is a live `T` of the size passed; the kernel copies
    // it and keeps no pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Signs every segment of connections to `peer` with `key` (RFC 2385).
pub fn set_md5_key(fd: &impl AsRawFd, peer: SocketAddr, key: &[u8]) -> io::Result<()> {
    if key.is_empty() || key.len() > MD5_MAX_KEY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a TCP MD5 key is 1-{MD5_MAX_KEY} bytes, not {}", key.len()),
        ));
    }
    let sock: socket2::SockAddr = peer.into();
    // SAFETY: all-zero is a valid `tcp_md5sig` (and sockaddr_storage).
    let mut sig: TcpMd5Sig = unsafe { std::mem::zeroed() };
    // SAFETY: `sock` holds a sockaddr of `sock.len()` bytes, which fits a
    // sockaddr_storage.
    unsafe {
        std::ptr::copy_nonoverlapping(
            sock.as_ptr().cast::<u8>(),
            (&mut sig.addr as *mut libc::sockaddr_storage).cast::<u8>(),
            sock.len() as usize,
        );
    }
    sig.key_len = key.len() as u16;
    sig.key[..key.len()].copy_from_slice(key);
    setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_MD5SIG, &sig)
}

/// GTSM for a peer at most `hops` routers away: send with TTL (hop limit)
/// 255 and accept only what arrives with at least `256 - hops`.
pub fn set_ttl_security(socket: &socket2::Socket, family: IpAddr, hops: u8) -> io::Result<()> {
    let min = libc::c_int::from(255 - hops.saturating_sub(1));
    match family {
        IpAddr::V4(_) => {
            socket.set_ttl_v4(255)?;
            setsockopt(socket, libc::IPPROTO_IP, libc::IP_MINTTL, &min)
        }
        IpAddr::V6(_) => {
            socket.set_unicast_hops_v6(255)?;
            setsockopt(socket, libc::IPPROTO_IPV6, libc::IPV6_MINHOPCOUNT, &min)
        }
    }
}

/// Bytes written to `fd` that the peer's TCP has not acknowledged yet
/// (or not yet sent): `SIOCOUTQ` (tcp(7)). Zero means the peer's kernel
/// holds everything we wrote.
pub fn unacknowledged(fd: &impl AsRawFd) -> io::Result<u32> {
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int through the pointer, which points
    // at a live `c_int`.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut queued) };
    if rc == 0 {
        Ok(u32::try_from(queued).unwrap_or(0))
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    //! Against the kernel's TCP on loopback: a listener that signs with a
    //! key accepts a client with the same key and never hears one with
    //! another (its SYNs are dropped, RFC 2385 §2).

    use std::{
        net::{Ipv4Addr, TcpListener},
        time::Duration,
    };

    use socket2::{Domain, Socket, Type};

    use super::*;

    /// Connects from a socket signed with `key` (none: unsigned) to
    /// `to` within `wait`.
    fn connect(to: SocketAddr, key: Option<&[u8]>, wait: Duration) -> io::Result<Socket> {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
        if let Some(key) = key {
            set_md5_key(&s, to, key)?;
        }
        s.connect_timeout(&to.into(), wait)?;
        Ok(s)
    }

    #[test]
    fn only_a_client_with_the_key_gets_through() {
        let key = b"lb's shared secret";
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let at = listener.local_addr().unwrap();
        // The listener's key is for the client's address (any port).
        set_md5_key(&listener, SocketAddr::new(at.ip(), 0), key).expect("TCP_MD5SIG");
        // Wrong or missing keys first: a dropped SYN is a timeout, and a
        // short one is enough on loopback (the right key below shows the
        // listener answers at all).
        let short = Duration::from_millis(500);
        for other in [Some(&b"another secret"[..]), None] {
            let e = connect(at, other, short).expect_err("no answer without the key");
            assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{other:?}: {e}");
        }
        connect(at, Some(key), Duration::from_secs(10)).expect("the same key connects");
        let (_, from) = listener.accept().expect("accepted");
        assert_eq!(from.ip(), at.ip());
    }

    #[test]
    fn a_key_is_1_to_80_bytes() {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let peer = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 179);
        for len in [0, MD5_MAX_KEY + 1] {
            let e = set_md5_key(&s, peer, &vec![7; len]).expect_err("refused");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{len}");
            assert!(e.to_string().contains("1-80 bytes"), "{e}");
        }
        for len in [1, MD5_MAX_KEY] {
            set_md5_key(&s, peer, &vec![7; len]).unwrap_or_else(|e| panic!("{len}: {e}"));
        }
    }
}
