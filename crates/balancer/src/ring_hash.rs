//! Ring hash (ketama): hosts are hashed onto a ring many times each, in proportion to their
//! weights, and a request goes to the first host hash at or after its own hash key, wrapping
//! around. Removing one of N hosts moves the keys that were on its arcs (1/N), and, when
//! `minimum_ring_size / N` rounds up differently for N - 1 hosts, the keys on the few
//! entries each remaining host gains: between 1/N and 2/N in all.
//!
//! The ring is built as Envoy builds it: weights are normalized to sum to 1; the scale is
//! chosen so the lightest host gets a whole number of entries with the ring at least
//! `minimum_ring_size`, capped at `maximum_ring_size`; host `addr`'s entries are the
//! xxHash64 (seed 0) of `"{addr}_0"`, `"{addr}_1"`, .. . Hosts are laid out in address order,
//! so the ring depends only on the set of (address, weight) pairs and not on list order.

use std::fmt::Write as _;

use crate::hash::xxh64;
use crate::member::Member;
use crate::policy::RingHashOptions;

pub(crate) struct Ring {
    /// Sorted entry hashes, searched by binary search.
    hashes: Box<[u64]>,
    /// `owners[i]` is the member position of entry `i`.
    owners: Box<[u32]>,
}

impl Ring {
    pub(crate) fn build(members: &[Member], options: &RingHashOptions) -> Self {
        let mut order: Vec<(String, usize)> = members
            .iter()
            .enumerate()
            .map(|(position, m)| (m.host.addr().to_string(), position))
            .collect();
        order.sort();

        let total: f64 = members.iter().map(|m| f64::from(m.weight)).sum();
        let min_weight = members
            .iter()
            .map(|m| f64::from(m.weight) / total)
            .fold(1.0, f64::min);
        let scale = ((min_weight * options.minimum_ring_size as f64).ceil() / min_weight)
            .min(options.maximum_ring_size as f64);

        let mut entries: Vec<(u64, u32)> = Vec::with_capacity(scale.ceil() as usize + 1);
        let mut key = String::new();
        let mut target = 0.0;
        let mut current = 0u64;
        for (addr, position) in &order {
            let weight = f64::from(members[*position].weight) / total;
            // Running totals across hosts, so fractional shares add up instead of each
            // host's being rounded on its own.
            target += scale * weight;
            let mut i = 0u64;
            while (current as f64) < target {
                key.clear();
                // Writing to a String cannot fail.
                let _ = write!(key, "{addr}_{i}");
                entries.push((xxh64(key.as_bytes(), 0), *position as u32));
                i += 1;
                current += 1;
            }
        }
        // Stable: equal hashes keep address order, so the ring is deterministic.
        entries.sort_by_key(|&(hash, _)| hash);
        let (hashes, owners): (Vec<u64>, Vec<u32>) = entries.into_iter().unzip();
        Self {
            hashes: hashes.into_boxed_slice(),
            owners: owners.into_boxed_slice(),
        }
    }

    /// The member owning the first entry at or after `hash`, wrapping to the first entry.
    #[inline]
    pub(crate) fn pick(&self, hash: u64) -> usize {
        let i = self.hashes.partition_point(|&h| h < hash);
        let i = if i == self.hashes.len() { 0 } else { i };
        self.owners.get(i).map_or(0, |&p| p as usize)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.hashes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(weights: &[u32]) -> Vec<Member> {
        crate::member::test_members(weights, 2)
    }

    #[test]
    fn ring_size_follows_envoys_formula() {
        let options = RingHashOptions::default();
        // Equal weights: 1024 / 3 rounded up per host.
        assert_eq!(Ring::build(&members(&[1, 1, 1]), &options).len(), 3 * 342);
        // 250 hosts: 1024 / 250 rounded up gives each host five entries.
        assert_eq!(Ring::build(&members(&[1; 250]), &options).len(), 250 * 5);
        // Weights 1 and 3: the light host gets ceil(0.25 * 1024) = 256, the heavy one 768.
        assert_eq!(Ring::build(&members(&[1, 3]), &options).len(), 1024);
        let capped = RingHashOptions {
            minimum_ring_size: 1024,
            maximum_ring_size: 100,
        };
        assert_eq!(Ring::build(&members(&[1, 1]), &capped).len(), 100);
    }

    #[test]
    fn entries_are_the_xxhash_of_address_and_index() {
        let m = members(&[1]);
        let ring = Ring::build(
            &m,
            &RingHashOptions {
                minimum_ring_size: 2,
                maximum_ring_size: 2,
            },
        );
        let mut expected = [xxh64(b"10.0.2.1:80_0", 0), xxh64(b"10.0.2.1:80_1", 0)];
        expected.sort();
        assert_eq!(&*ring.hashes, &expected);
    }

    #[test]
    fn a_key_goes_to_the_next_entry_clockwise() {
        let ring = Ring {
            hashes: vec![10, 20, 30].into_boxed_slice(),
            owners: vec![0, 1, 2].into_boxed_slice(),
        };
        assert_eq!(ring.pick(5), 0);
        assert_eq!(ring.pick(10), 0);
        assert_eq!(ring.pick(11), 1);
        assert_eq!(ring.pick(30), 2);
        assert_eq!(ring.pick(31), 0);
    }
}
