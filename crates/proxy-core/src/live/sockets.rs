//! Where a listener's sockets come from: bound here, or inherited from the process this one
//! upgrades (the same address keeps accepting throughout, so no connection is refused).

use std::io;
use std::net::{SocketAddr, TcpListener};

use super::generation::BoundSockets;
use crate::listen::{bind_per_worker, bind_shared, join_reuse_port};
use config::{ConnectionBalance, ListenerConfig};

/// Listening sockets handed over by a previous process, by address.
#[derive(Default)]
pub(crate) struct Sockets {
    inherited: Vec<Inherited>,
    /// HTTP/3's UDP sockets of listeners whose TCP ones were taken, by address, until their
    /// listener's HTTP/3 takes them.
    udp: Vec<(SocketAddr, Vec<std::net::UdpSocket>)>,
}

/// One listener's sockets from the previous process.
pub(crate) struct Inherited {
    pub(crate) address: SocketAddr,
    pub(crate) shared: bool,
    pub(crate) sockets: Vec<TcpListener>,
    /// HTTP/3's UDP sockets on the same address, in worker order; none without HTTP/3.
    pub(crate) udp: Vec<std::net::UdpSocket>,
}

impl Sockets {
    pub(crate) fn inherit(inherited: Vec<Inherited>) -> Self {
        Self {
            inherited,
            udp: Vec::new(),
        }
    }

    /// The UDP sockets inherited with the TCP ones on `address` (its listener serves HTTP/3),
    /// or alone there (a QUIC-only listener's); empty if none.
    pub(crate) fn take_udp(&mut self, address: SocketAddr) -> Vec<std::net::UdpSocket> {
        if let Some(at) = self.udp.iter().position(|(a, _)| *a == address) {
            return self.udp.swap_remove(at).1;
        }
        // A QUIC-only listener's: UDP sockets and no TCP one.
        match (self.inherited.iter()).position(|i| i.address == address && i.sockets.is_empty()) {
            Some(at) => self.inherited.swap_remove(at).udp,
            None => Vec::new(),
        }
    }

    /// Sockets for `listener`, one per worker: the inherited ones for its address if there
    /// are, otherwise bound now.
    pub(crate) fn bind(
        &mut self,
        listener: &ListenerConfig,
        workers: usize,
    ) -> io::Result<BoundSockets> {
        let shared = listener.connection_balance == ConnectionBalance::Exact;
        let found = self.inherited.iter().position(|i| {
            i.address == listener.address && i.shared == shared && !i.sockets.is_empty()
        });
        let sockets = match found {
            Some(at) => {
                let mut inherited = self.inherited.swap_remove(at);
                let udp = std::mem::take(&mut inherited.udp);
                if !udp.is_empty() {
                    self.udp.push((inherited.address, udp));
                }
                adopt(inherited, workers)?
            }
            None if shared => bind_shared(listener.address, workers)?,
            None => bind_per_worker(listener.address, workers)?,
        };
        BoundSockets::new(sockets, shared)
    }

    /// Inherited sockets no listener of the config wanted: closed now, so the kernel stops
    /// queueing connections on them.
    pub(crate) fn close_unused(&mut self) {
        for unused in self.inherited.drain(..) {
            tracing::warn!(address = %unused.address, "closing an inherited socket the config has no listener for");
        }
        for (address, _) in self.udp.drain(..) {
            tracing::warn!(%address, "closing inherited HTTP/3 sockets: the listener no longer serves HTTP/3");
        }
    }
}

/// Turns the previous process's sockets into one per worker of this one.
fn adopt(inherited: Inherited, workers: usize) -> io::Result<Vec<TcpListener>> {
    let mut sockets = inherited.sockets;
    for socket in &sockets {
        socket.set_nonblocking(true)?;
    }
    let Some(first) = sockets.first() else {
        return Err(io::Error::other("no inherited socket"));
    };
    if inherited.shared {
        // One accept queue: every worker gets a handle on it.
        let one = first.try_clone()?;
        sockets.truncate(1);
        while sockets.len() < workers {
            sockets.push(one.try_clone()?);
        }
        return Ok(sockets);
    }
    let address = first.local_addr()?;
    while sockets.len() < workers {
        // More workers than before: more sockets join the same SO_REUSEPORT group.
        sockets.push(join_reuse_port(address)?);
    }
    if sockets.len() > workers {
        // Fewer workers than before: the extra sockets are closed, and connections the kernel
        // had queued on them are reset. Upgrades that keep the worker count lose none.
        tracing::warn!(
            %address,
            sockets = sockets.len(),
            workers,
            "more inherited sockets than workers: the extra ones are closed"
        );
        sockets.truncate(workers);
    }
    Ok(sockets)
}
