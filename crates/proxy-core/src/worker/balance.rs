//! `connection_balance: exact`: every worker accepts from one shared socket and hands each
//! connection to the worker with the fewest open connections at that moment (Envoy's exact
//! balancer). For few, long-lived connections, where the kernel's spread leaves some workers
//! idle and others saturated (lesson L3).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::listen::ConnPermit;

/// A connection accepted by one worker for another.
pub(crate) struct Handoff {
    pub(crate) stream: std::net::TcpStream,
    pub(crate) peer: SocketAddr,
    /// The listener's id (kept across config generations).
    pub(crate) listener: u64,
    pub(crate) permit: ConnPermit,
}

/// Open connections per worker, and the way to each worker.
pub(crate) struct ExactBalance {
    loads: Vec<AtomicUsize>,
    senders: Vec<UnboundedSender<Handoff>>,
}

impl ExactBalance {
    pub(crate) fn new(workers: usize) -> (Arc<ExactBalance>, Vec<UnboundedReceiver<Handoff>>) {
        let (senders, receivers) = (0..workers).map(|_| unbounded_channel()).unzip();
        let balance = ExactBalance {
            loads: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            senders,
        };
        (Arc::new(balance), receivers)
    }

    /// The worker that should take the next connection, counted as opened on it. Ties go to
    /// `me`, which saves a hand-off.
    pub(crate) fn assign(&self, me: usize) -> usize {
        let mut best = me;
        // Relaxed: a momentarily stale count costs at most one connection of imbalance.
        let mut best_load = self.loads[me].load(Ordering::Relaxed);
        for (worker, load) in self.loads.iter().enumerate() {
            let load = load.load(Ordering::Relaxed);
            if load < best_load {
                best = worker;
                best_load = load;
            }
        }
        self.opened(best);
        best
    }

    pub(crate) fn opened(&self, worker: usize) {
        self.loads[worker].fetch_add(1, Ordering::Relaxed);
    }

    /// Open client connections over every worker.
    pub(crate) fn open_connections(&self) -> u64 {
        self.loads
            .iter()
            .map(|l| l.load(Ordering::Relaxed) as u64)
            .sum()
    }

    pub(crate) fn closed(&self, worker: usize) {
        self.loads[worker].fetch_sub(1, Ordering::Relaxed);
    }

    /// Sends a connection to `worker`; `false` if that worker has stopped.
    pub(crate) fn hand_off(&self, worker: usize, handoff: Handoff) -> bool {
        match self.senders[worker].send(handoff) {
            Ok(()) => true,
            Err(_) => {
                self.closed(worker);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assigns_to_the_least_loaded_worker_preferring_itself() {
        let (balance, _rx) = ExactBalance::new(3);
        assert_eq!(balance.assign(1), 1);
        assert_eq!(balance.assign(1), 0);
        assert_eq!(balance.assign(1), 2);
        assert_eq!(balance.assign(0), 0);
        balance.closed(2);
        assert_eq!(balance.assign(0), 2);
    }
}
