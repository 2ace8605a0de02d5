//! Weighted traffic splits (Envoy's `weighted_clusters`): one of a few targets chosen by
//! weight, at random or by a request's hash key so that one key always lands on one target.

use crate::rng;

/// Targets `0..n` with weights, chosen in proportion to them.
///
/// ```
/// let split = balancer::WeightedSplit::new(&[95, 5]).expect("weights above zero");
/// assert!(split.pick(None) < 2);
/// // The same key picks the same target, in every process: the hash is unseeded.
/// let key = balancer::hash_key(b"user-42");
/// assert_eq!(split.pick(Some(key)), split.pick(Some(key)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedSplit {
    /// Running sums of the weights: target `i` takes `[ends[i-1], ends[i])`.
    ends: Box<[u64]>,
}

impl WeightedSplit {
    /// A split over `weights.len()` targets; `None` when there is none or a weight is zero.
    pub fn new(weights: &[u32]) -> Option<Self> {
        if weights.is_empty() || weights.contains(&0) {
            return None;
        }
        let ends = weights
            .iter()
            .scan(0u64, |sum, &w| {
                *sum += u64::from(w);
                Some(*sum)
            })
            .collect();
        Some(Self { ends })
    }

    /// The sum of the weights.
    pub fn total(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// A target's index by a number a request brings (Envoy's `random_value_specifier`): the
    /// target whose share of `0..total()` holds `value % total()`.
    ///
    /// ```
    /// let split = balancer::WeightedSplit::new(&[95, 5]).expect("weights above zero");
    /// assert_eq!(split.pick_value(94), 0);
    /// assert_eq!(split.pick_value(95), 1);
    /// assert_eq!(split.pick_value(100), 0);
    /// ```
    pub fn pick_value(&self, value: u64) -> usize {
        let at = value % self.total().max(1);
        self.ends.iter().position(|&end| at < end).unwrap_or(0)
    }

    /// A target's index: by `key` (a [`hash_key`](crate::hash_key)) when given, so one key
    /// keeps its target while the weights stay; otherwise at random.
    pub fn pick(&self, key: Option<u64>) -> usize {
        let bits = key.map_or_else(rng::next_u64, mix);
        let at = rng::scale(bits, self.total() as usize) as u64;
        // A handful of targets: a scan beats a binary search.
        self.ends.iter().position(|&end| at < end).unwrap_or(0)
    }
}

/// Spreads a hash's bits before scaling: a key hash taken modulo a host count elsewhere must
/// not decide the split too (splitmix64's finaliser).
fn mix(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_no_targets_and_zero_weights() {
        assert!(WeightedSplit::new(&[]).is_none());
        assert!(WeightedSplit::new(&[1, 0]).is_none());
        assert_eq!(WeightedSplit::new(&[3, 4]).map(|s| s.total()), Some(7));
    }

    #[test]
    fn random_picks_follow_the_weights() {
        let split = WeightedSplit::new(&[70, 20, 10]).unwrap();
        // A fixed sequence: with a fresh seed each run, 1 run in 1,000 would land in the tail.
        rng::seed_this_thread(0x5eed);
        let mut counts = [0u32; 3];
        let n = 100_000;
        for _ in 0..n {
            counts[split.pick(None)] += 1;
        }
        // Chi-square with 2 degrees of freedom; 13.8 is the 0.1% tail.
        let expected = [0.7, 0.2, 0.1].map(|p| p * f64::from(n));
        let chi2: f64 = counts
            .iter()
            .zip(expected)
            .map(|(&c, e)| (f64::from(c) - e).powi(2) / e)
            .sum();
        assert!(chi2 < 13.8, "{counts:?} chi2 {chi2}");
    }

    #[test]
    fn keyed_picks_are_stable_and_still_follow_the_weights() {
        let split = WeightedSplit::new(&[50, 50]).unwrap();
        let mut counts = [0u32; 2];
        for user in 0..10_000u32 {
            let key = crate::hash_key(format!("user-{user}").as_bytes());
            let first = split.pick(Some(key));
            assert_eq!(split.pick(Some(key)), first);
            counts[first] += 1;
        }
        // 50/50 over 10,000 keys: 3.29 sigma is 164.
        assert!((counts[0] as i64 - 5000).abs() < 165, "{counts:?}");
    }
}
