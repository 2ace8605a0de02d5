//! `SO_REUSEPORT` listeners: each worker binds its own socket on the same address, and the
//! kernel spreads new connections over them. No shared accept queue, so no thundering herd
//! and no worker left idle while another drowns (lesson L3).

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// Kernel accept queue length per socket (Linux caps it at `net.core.somaxconn`).
const BACKLOG: i32 = 4096;

fn bind_one(addr: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(BACKLOG)?;
    Ok(socket.into())
}

/// `SO_REUSEPORT` would let this process silently share a port with another listener (say, a
/// second copy of the proxy started by mistake), splitting its traffic. A plain bind first
/// fails with `EADDRINUSE` in that case, as an operator expects.
fn refuse_if_taken(addr: SocketAddr) -> io::Result<()> {
    let probe = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // SO_REUSEADDR so that connections left in TIME_WAIT by a previous run do not count.
    probe.set_reuse_address(true)?;
    probe.bind(&addr.into())
}

/// Binds `count` sockets on `addr`. With port 0 the first socket picks the port and the others
/// join it, so tests can use ephemeral ports.
pub(crate) fn bind_per_worker(
    addr: SocketAddr,
    count: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    if addr.port() != 0 {
        refuse_if_taken(addr)?;
    }
    let first = bind_one(addr, true)?;
    let actual = first.local_addr()?;
    let mut sockets = Vec::with_capacity(count);
    sockets.push(first);
    for _ in 1..count {
        sockets.push(bind_one(actual, true)?);
    }
    Ok(sockets)
}

/// One more socket in the `SO_REUSEPORT` group already listening on `addr`.
pub(crate) fn join_reuse_port(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    bind_one(addr, true)
}

/// One socket for every worker to accept from (`exact` balancing), without `SO_REUSEPORT`.
pub(crate) fn bind_shared(
    addr: SocketAddr,
    count: usize,
) -> io::Result<Vec<std::net::TcpListener>> {
    let one = bind_one(addr, false)?;
    let mut shared = Vec::with_capacity(count);
    for _ in 1..count {
        shared.push(one.try_clone()?);
    }
    shared.push(one);
    Ok(shared)
}

/// Whether this system lets a socket set `SO_REUSEPORT` (Linux >= 3.9 and the BSDs do).
pub(crate) fn reuse_port_supported() -> bool {
    Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
        .and_then(|s| s.set_reuse_port(true))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_listener_holds_is_refused() {
        let holder = bind_one("127.0.0.1:0".parse().unwrap(), true).unwrap();
        let taken = holder.local_addr().unwrap();
        let err = bind_per_worker(taken, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn a_shared_socket_is_one_socket_for_every_worker() {
        let sockets = bind_shared("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let addrs: Vec<_> = sockets.iter().map(|s| s.local_addr().unwrap()).collect();
        assert_eq!(addrs.len(), 3);
        assert!(addrs.iter().all(|a| *a == addrs[0]));
        assert!(reuse_port_supported(), "Linux supports SO_REUSEPORT");
    }

    #[test]
    fn workers_share_one_ephemeral_port() {
        let sockets = bind_per_worker("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let ports: Vec<u16> = sockets
            .iter()
            .map(|s| s.local_addr().unwrap().port())
            .collect();
        assert_eq!(ports.len(), 3);
        assert!(ports.iter().all(|p| *p == ports[0] && *p != 0));
    }
}
