//! Plain round robin: each host in turn.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::BuildError;

/// Picks hosts `0, 1, .., n-1, 0, ..` in turn.
///
/// The cursor is an atomic so the policy may be shared between threads; used from one thread
/// (as Legate's workers do) the increment is uncontended.
#[derive(Debug)]
pub struct RoundRobin {
    hosts: usize,
    next: AtomicUsize,
}

impl RoundRobin {
    /// A round robin over `hosts` hosts.
    pub fn new(hosts: usize) -> Result<Self, BuildError> {
        if hosts == 0 {
            return Err(BuildError::NoHosts);
        }
        Ok(Self {
            hosts,
            next: AtomicUsize::new(0),
        })
    }

    /// Starts the rotation at `offset` (modulo the host count), so that several instances
    /// (one per worker) do not all send their first request to the same host.
    pub fn with_offset(hosts: usize, offset: usize) -> Result<Self, BuildError> {
        let rr = Self::new(hosts)?;
        rr.next.store(offset % hosts, Ordering::Relaxed);
        Ok(rr)
    }

    /// The number of hosts this policy picks from.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// The index of the next host.
    #[inline]
    pub fn pick(&self) -> usize {
        // Relaxed: the only requirement is that every pick advances the cursor.
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        n % self.hosts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_an_empty_host_set() {
        assert_eq!(RoundRobin::new(0).unwrap_err(), BuildError::NoHosts);
    }

    #[test]
    fn visits_every_host_equally() {
        let rr = RoundRobin::new(3).unwrap();
        let mut seen = [0usize; 3];
        for _ in 0..300 {
            seen[rr.pick()] += 1;
        }
        assert_eq!(seen, [100, 100, 100]);
    }

    #[test]
    fn offset_shifts_the_first_pick() {
        let rr = RoundRobin::with_offset(4, 6).unwrap();
        assert_eq!(rr.pick(), 2);
        assert_eq!(rr.pick(), 3);
        assert_eq!(rr.pick(), 0);
    }

    #[test]
    fn is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<RoundRobin>();
    }
}
