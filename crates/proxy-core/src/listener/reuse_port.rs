//! `SO_REUSEPORT` listeners: each worker binds its own socket on the same address, and the
//! kernel spreads new connections over them. No shared accept queue, so no thundering herd
//! and no worker left idle while another drowns (lesson L3).

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

/// Kernel accept queue length per socket (Linux caps it at `net.core.somaxconn`).
const BACKLOG: i32 = 4096;

fn bind_one(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
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
    let first = bind_one(addr)?;
    let actual = first.local_addr()?;
    let mut sockets = Vec::with_capacity(count);
    sockets.push(first);
    for _ in 1..count {
        sockets.push(bind_one(actual)?);
    }
    Ok(sockets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_another_listener_holds_is_refused() {
        let holder = bind_one("127.0.0.1:0".parse().unwrap()).unwrap();
        let taken = holder.local_addr().unwrap();
        let err = bind_per_worker(taken, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
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
