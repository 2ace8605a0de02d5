//! The UDP sockets of a listener's HTTP/3: one per worker on the TCP listener's port, joined
//! by `SO_REUSEPORT` as the TCP ones are, each driven by its worker's QUIC endpoint.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Mutex, PoisonError};

use socket2::{Domain, Protocol, Socket, Type};

use super::quic_steering::steer_by_connection_id;

/// A listener's UDP sockets, each taken by its worker when it starts serving HTTP/3 on them.
/// Kept across generations while the listener keeps HTTP/3; dropped when it stops.
pub(crate) struct QuicSockets {
    pub(crate) address: SocketAddr,
    /// Whether packets are steered to workers by connection ID (quic_steering.rs): where the
    /// kernel refuses the program, by source address, and connections cannot migrate.
    pub(crate) steered: bool,
    workers: usize,
    per_worker: Mutex<Vec<Option<UdpSocket>>>,
    /// A duplicate of each, in worker order, to hand to a new binary in an upgrade: the
    /// group keeps its sockets, and so the order the steering program counts them in.
    handover: Vec<UdpSocket>,
}

impl QuicSockets {
    /// Binds `count` sockets on `addr` (the TCP listener's address, its port chosen).
    pub(crate) fn bind(addr: SocketAddr, count: usize) -> io::Result<Self> {
        // In worker order: the group's index of each socket is its worker's number.
        let sockets = (0..count)
            .map(|_| bind_one(addr))
            .collect::<io::Result<Vec<_>>>()?;
        Self::serve(addr, sockets)
    }

    /// Takes the sockets of the process this one upgrades, in its worker order, as this
    /// process's first ones: the group stays as it is. More workers join more sockets at the
    /// end; fewer leave the last ones unused (closed with the old process).
    pub(crate) fn adopt(inherited: Vec<UdpSocket>, count: usize) -> io::Result<Self> {
        let Some(first) = inherited.first() else {
            return Err(io::Error::other("no inherited UDP socket"));
        };
        let addr = first.local_addr()?;
        let mut sockets = inherited;
        for socket in &sockets {
            socket.set_nonblocking(true)?;
        }
        sockets.truncate(count);
        while sockets.len() < count {
            sockets.push(bind_one(addr)?);
        }
        Self::serve(addr, sockets)
    }

    fn serve(addr: SocketAddr, sockets: Vec<UdpSocket>) -> io::Result<Self> {
        let count = sockets.len();
        let steered = match sockets.first().map(|s| steer_by_connection_id(s, count)) {
            Some(Ok(())) => true,
            Some(Err(error)) => {
                tracing::warn!(%addr, %error, "QUIC packets cannot be steered by connection ID: by source address instead, without connection migration");
                false
            }
            None => false,
        };
        let handover = sockets
            .iter()
            .map(UdpSocket::try_clone)
            .collect::<io::Result<_>>()?;
        Ok(Self {
            address: addr,
            steered,
            workers: count,
            per_worker: Mutex::new(sockets.into_iter().map(Some).collect()),
            handover,
        })
    }

    /// Duplicates of the sockets, in worker order, for handing to a new binary.
    pub(crate) fn handover(&self) -> io::Result<Vec<UdpSocket>> {
        self.handover.iter().map(UdpSocket::try_clone).collect()
    }

    /// How many sockets (workers) the group has.
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// Worker `worker`'s socket; `None` once taken.
    pub(crate) fn take(&self, worker: usize) -> Option<UdpSocket> {
        self.per_worker
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(worker)?
            .take()
    }
}

fn bind_one(addr: SocketAddr) -> io::Result<UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_gets_a_socket_on_the_port() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let sockets = QuicSockets::bind(addr, 3).unwrap();
        for worker in 0..3 {
            let socket = sockets.take(worker).unwrap();
            assert_eq!(socket.local_addr().unwrap(), addr);
        }
        assert!(sockets.take(1).is_none(), "taken once");
        assert!(sockets.steered, "Linux takes the reuse-port program");
        assert!(sockets.take(3).is_none(), "no such worker");
    }
}
