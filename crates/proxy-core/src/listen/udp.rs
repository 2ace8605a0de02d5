//! The UDP sockets of a listener's HTTP/3: one per worker on the TCP listener's port, joined
//! by `SO_REUSEPORT` as the TCP ones are, each driven by its worker's QUIC endpoint.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::{Mutex, PoisonError};

use socket2::{Domain, Protocol, Socket, Type};

use super::quic_steering::{detach_steering, steer_by_connection_id};

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
        // Sockets still open on the port (an earlier listener's, draining, or those of a
        // process this one upgrades that did not hand them over) hold places in the group:
        // the group's order would not be the workers'.
        let fresh = group_is_free(addr);
        // In worker order: the group's index of each socket is its worker's number. The
        // first one's port is the others' (a QUIC-only listener may ask for any port).
        let first = bind_one(addr)?;
        let addr = first.local_addr()?;
        let mut sockets = vec![first];
        for _ in 1..count {
            sockets.push(bind_one(addr)?);
        }
        let steer = match fresh {
            Ok(()) => Steer::Yes,
            Err(error) => Steer::No(format!("other sockets hold the port ({error})")),
        };
        Self::serve(addr, sockets, steer)
    }

    /// Takes the sockets of the process this one upgrades, in its worker order, as this
    /// process's first ones: the group stays as it is. More workers join more sockets at the
    /// end; fewer leave the last ones unused (closed with the old process).
    pub(crate) fn adopt(inherited: Vec<UdpSocket>, count: usize) -> io::Result<Self> {
        let Some(first) = inherited.first() else {
            return Err(io::Error::other("no inherited UDP socket"));
        };
        let addr = first.local_addr()?;
        // Another worker count would count the group differently from the process that
        // is draining, whose connections' packets would reach other workers.
        let steer = if inherited.len() == count {
            Steer::Yes
        } else {
            Steer::No(format!(
                "the previous process had {} workers, this one {count}",
                inherited.len()
            ))
        };
        let mut sockets = inherited;
        for socket in &sockets {
            socket.set_nonblocking(true)?;
        }
        sockets.truncate(count);
        while sockets.len() < count {
            sockets.push(bind_one(addr)?);
        }
        Self::serve(addr, sockets, steer)
    }

    fn serve(addr: SocketAddr, sockets: Vec<UdpSocket>, steer: Steer) -> io::Result<Self> {
        let count = sockets.len();
        let attached = match (steer, sockets.first()) {
            (_, None) => Err("no socket".to_owned()),
            (Steer::Yes, Some(first)) => {
                steer_by_connection_id(first, count).map_err(|error| error.to_string())
            }
            (Steer::No(why), Some(first)) => {
                // The group's program, if an earlier process attached one, would steer by
                // IDs this process does not make.
                detach_steering(first);
                Err(why)
            }
        };
        let steered = match attached {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(%addr, why, "QUIC packets are not steered by connection ID: by source address instead, without connection migration");
                false
            }
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

/// Whether packets can be steered by connection ID on the group about to be bound.
enum Steer {
    Yes,
    /// No, and why.
    No(String),
}

/// `Ok` when no socket holds `addr`'s UDP port (a plain bind, without `SO_REUSEPORT`,
/// succeeds), so the sockets bound next are the group's first.
fn group_is_free(addr: SocketAddr) -> io::Result<()> {
    let probe = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    probe.bind(&addr.into())
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
        assert!(sockets.take(3).is_none(), "no such worker");
        assert!(sockets.steered, "Linux takes the reuse-port program");
    }

    #[test]
    fn a_port_whose_group_has_other_sockets_is_not_steered() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let earlier = QuicSockets::bind(addr, 2).unwrap();
        assert!(earlier.steered);
        // Its sockets still open: a second group's order would not be its workers'.
        let later = QuicSockets::bind(addr, 2).unwrap();
        assert!(!later.steered);
    }

    #[test]
    fn sockets_handed_over_keep_steering_unless_the_worker_count_changes() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = tcp.local_addr().unwrap();
        let old = QuicSockets::bind(addr, 2).unwrap();
        let same = QuicSockets::adopt(old.handover().unwrap(), 2).unwrap();
        assert!(same.steered);
        assert_eq!(same.address, addr);
        let more = QuicSockets::adopt(old.handover().unwrap(), 3).unwrap();
        assert!(!more.steered);
        assert_eq!(more.workers(), 3);
    }
}
