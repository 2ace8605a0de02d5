//! Round robin: each host in turn, or with unequal weights a smooth weighted schedule.
//!
//! [`RoundRobin`] is the plain index rotation Legate's proxy uses today; [`Schedule`] is the
//! table behind [`LbPolicy::RoundRobin`](crate::LbPolicy::RoundRobin).

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::BuildError;
use crate::member::Member;

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

/// The longest weighted schedule kept. Longer cycles (weights whose sum, divided by their
/// greatest common divisor, exceeds this) are scaled down to fit, which rounds each weight to
/// within half a slot of this many (4 bytes each: 1 MiB at most).
const MAX_SCHEDULE_LEN: u64 = 1 << 18;

/// A cycle of host positions, walked by an atomic cursor.
///
/// With equal weights the cycle is `0..n` and is not stored. With unequal weights it holds
/// each host `weight / gcd` times, interleaved smoothly: slots are given in order of the
/// deadlines `(k - 1/2) / weight` for the k-th slot of each host (earliest deadline first,
/// as Envoy's weighted round robin, with deadlines centred in each host's interval as in the
/// Sainte-Laguë method), so a heavy host's turns are spread over the cycle rather than
/// bunched at its start.
pub(crate) struct Schedule {
    order: Option<Box<[u32]>>,
    len: u64,
}

impl Schedule {
    pub(crate) fn build(members: &[Member]) -> Self {
        let weights: Vec<u64> = members.iter().map(|m| u64::from(m.weight)).collect();
        if weights.windows(2).all(|w| w[0] == w[1]) {
            return Self {
                order: None,
                len: weights.len() as u64,
            };
        }
        let order = smooth_cycle(&reduce(&weights));
        Self {
            len: order.len() as u64,
            order: Some(order.into_boxed_slice()),
        }
    }

    #[inline]
    pub(crate) fn pick(&self, cursor: &AtomicU64) -> usize {
        // Relaxed: the only requirement is that every pick advances the cursor.
        let turn = cursor.fetch_add(1, Ordering::Relaxed);
        let slot = (turn % self.len) as usize;
        match &self.order {
            None => slot,
            Some(order) => order[slot] as usize,
        }
    }
}

/// Divides weights by their gcd, and scales them down if their sum still exceeds
/// [`MAX_SCHEDULE_LEN`] (every host keeps at least one slot).
fn reduce(weights: &[u64]) -> Vec<u64> {
    let g = weights.iter().copied().fold(0, gcd).max(1);
    let mut reduced: Vec<u64> = weights.iter().map(|w| w / g).collect();
    let sum: u64 = reduced.iter().sum();
    if sum > MAX_SCHEDULE_LEN {
        let scale = MAX_SCHEDULE_LEN as f64 / sum as f64;
        for w in &mut reduced {
            *w = ((*w as f64 * scale).round() as u64).max(1);
        }
    }
    reduced
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// One host's next slot in the schedule: deadline `(2k - 1) / (2 * weight)`.
#[derive(PartialEq, Eq)]
struct Deadline {
    k: u64,
    weight: u64,
    position: u32,
}

impl Ord for Deadline {
    /// `BinaryHeap` is a max-heap, so the *earliest* deadline compares greatest; ties go to
    /// the earlier host in the list.
    fn cmp(&self, other: &Self) -> CmpOrdering {
        let mine = u128::from(2 * self.k - 1) * u128::from(other.weight);
        let theirs = u128::from(2 * other.k - 1) * u128::from(self.weight);
        theirs
            .cmp(&mine)
            .then_with(|| other.position.cmp(&self.position))
    }
}

impl PartialOrd for Deadline {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

/// The smooth cycle for these (reduced) weights: `sum(weights)` slots, `weights[i]` of them
/// for host `i`.
fn smooth_cycle(weights: &[u64]) -> Vec<u32> {
    let len: u64 = weights.iter().sum();
    let mut heap: BinaryHeap<Deadline> = weights
        .iter()
        .enumerate()
        .map(|(position, &weight)| Deadline {
            k: 1,
            weight,
            position: position as u32,
        })
        .collect();
    let mut order = Vec::with_capacity(len as usize);
    while let Some(next) = heap.pop() {
        order.push(next.position);
        // Every deadline with k <= weight is at most 1 and comes before any with k > weight,
        // so the first `len` slots are exactly `weight` of each host: the cycle.
        if next.k < next.weight {
            heap.push(Deadline {
                k: next.k + 1,
                ..next
            });
        }
    }
    order
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

    #[test]
    fn weighted_cycle_is_smooth() {
        // Host 0 has weight 5, hosts 1 and 2 weight 1: host 0's turns are spread out
        // rather than five in a row.
        assert_eq!(smooth_cycle(&[5, 1, 1]), [0, 0, 0, 1, 2, 0, 0]);
        assert_eq!(smooth_cycle(&[2, 1]), [0, 1, 0]);
        assert_eq!(smooth_cycle(&[1, 3]), [1, 0, 1, 1]);
    }

    #[test]
    fn weighted_cycle_gives_each_host_its_weight() {
        let weights = [7, 1, 3, 12, 5];
        let cycle = smooth_cycle(&weights);
        for (host, &w) in weights.iter().enumerate() {
            let count = cycle.iter().filter(|&&p| p as usize == host).count();
            assert_eq!(count as u64, w);
        }
        // No host waits more than twice its ideal spacing between turns (a host of weight 1
        // appears once per cycle).
        let len = cycle.len();
        for (host, &w) in weights.iter().enumerate() {
            let turns: Vec<usize> = (0..2 * len)
                .filter(|&i| cycle[i % len] as usize == host)
                .collect();
            let max_gap = turns.windows(2).map(|t| t[1] - t[0]).max().unwrap();
            assert!(
                max_gap <= 2 * len.div_ceil(w as usize),
                "host {host}: gap {max_gap}"
            );
        }
    }

    #[test]
    fn reduce_divides_by_the_gcd_and_caps_the_cycle() {
        assert_eq!(reduce(&[10, 20, 30]), [1, 2, 3]);
        let huge = reduce(&[u64::from(u32::MAX), 1, 3]);
        assert!(huge.iter().sum::<u64>() <= MAX_SCHEDULE_LEN + 3);
        assert_eq!(huge[1], 1);
    }
}
