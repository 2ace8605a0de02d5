//! Maglev (Eisenbud et al., NSDI 2016): a lookup table of prime size `M` in which each host
//! owns entries in proportion to its weight; a request goes to `table[hash_key % M]`, one
//! memory access. Removing one of N hosts moves little more than its own 1/N of the keys.
//!
//! The table is built as Envoy builds it: hosts are sorted by address string; host `a` walks
//! the permutation `(offset + skip * j) % M` with `offset = xxHash64(a, seed 0) % M` and
//! `skip = xxHash64(a, seed 1) % (M - 1) + 1`; in each round every host whose normalized
//! weight has caught up with its target claims its next free entry, until the table is full.

use crate::hash::xxh64;
use crate::member::Member;
use crate::policy::MaglevOptions;

pub(crate) struct Table {
    /// Member position per entry.
    entries: Box<[u32]>,
    size: u64,
}

struct Builder {
    position: u32,
    offset: u64,
    skip: u64,
    weight: f64,
    target: f64,
    next: u64,
}

const EMPTY: u32 = u32::MAX;

impl Table {
    pub(crate) fn build(members: &[Member], options: &MaglevOptions) -> Self {
        let size = options.table_size;
        let total: f64 = members.iter().map(|m| f64::from(m.weight)).sum();
        let mut keyed: Vec<(String, usize)> = members
            .iter()
            .enumerate()
            .map(|(position, m)| (m.host.addr().to_string(), position))
            .collect();
        keyed.sort();
        let mut builders: Vec<Builder> = keyed
            .iter()
            .map(|(key, position)| Builder {
                position: *position as u32,
                offset: xxh64(key.as_bytes(), 0) % size,
                skip: xxh64(key.as_bytes(), 1) % (size - 1) + 1,
                weight: f64::from(members[*position].weight) / total,
                target: 0.0,
                next: 0,
            })
            .collect();
        let max_weight = builders.iter().map(|b| b.weight).fold(0.0, f64::max);

        let mut entries = vec![EMPTY; size as usize];
        let mut filled = 0u64;
        let mut round = 1u64;
        while filled < size && !builders.is_empty() {
            for b in &mut builders {
                if filled == size {
                    break;
                }
                // A host of the largest weight claims an entry every round; one of a third of
                // that weight, every third round.
                if (round as f64) * b.weight < b.target {
                    continue;
                }
                b.target += max_weight;
                let mut slot = (b.offset + b.skip * b.next) % size;
                while entries[slot as usize] != EMPTY {
                    b.next += 1;
                    slot = (b.offset + b.skip * b.next) % size;
                }
                entries[slot as usize] = b.position;
                b.next += 1;
                filled += 1;
            }
            round += 1;
        }
        Self {
            entries: entries.into_boxed_slice(),
            size,
        }
    }

    #[inline]
    pub(crate) fn pick(&self, hash: u64) -> usize {
        // Envoy indexes with `hash % table_size` too, so a key lands where Envoy's would.
        let slot = (hash % self.size) as usize;
        self.entries.get(slot).map_or(0, |&p| p as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(weights: &[u32]) -> Vec<Member> {
        crate::member::test_members(weights, 3)
    }

    fn shares(table: &Table, n: usize) -> Vec<usize> {
        let mut counts = vec![0; n];
        for &p in table.entries.iter() {
            counts[p as usize] += 1;
        }
        counts
    }

    #[test]
    fn fills_every_entry_evenly() {
        let table = Table::build(&members(&[1; 7]), &MaglevOptions { table_size: 65537 });
        let counts = shares(&table, 7);
        assert_eq!(counts.iter().sum::<usize>(), 65537);
        // Equal weights: every host owns floor or ceil of M / N entries.
        for c in counts {
            assert!((9362..=9363).contains(&c), "{c}");
        }
    }

    #[test]
    fn entries_follow_the_weights() {
        let table = Table::build(&members(&[1, 2, 5]), &MaglevOptions { table_size: 65537 });
        let counts = shares(&table, 3);
        let expected = [65537.0 / 8.0, 65537.0 * 2.0 / 8.0, 65537.0 * 5.0 / 8.0];
        for (c, e) in counts.iter().zip(expected) {
            assert!((*c as f64 - e).abs() / e < 0.01, "{counts:?}");
        }
    }

    #[test]
    fn more_hosts_than_entries_still_fills_the_table() {
        let table = Table::build(&members(&[1; 20]), &MaglevOptions { table_size: 13 });
        assert!(table.entries.iter().all(|&p| p != EMPTY));
    }
}
