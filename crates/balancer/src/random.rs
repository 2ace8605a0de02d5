//! Random: a host drawn at random from the per-thread generator.
//!
//! With equal weights this is Envoy's random policy. Envoy's ignores unequal weights; this
//! one draws in proportion to weight (Vose's alias table: one random number, one table
//! lookup per pick, whatever the number of hosts), so that every policy of this crate honours
//! weights.

use crate::member::Member;
use crate::rng;

pub(crate) enum Chooser {
    Uniform,
    Weighted(Alias),
}

impl Chooser {
    pub(crate) fn build(members: &[Member]) -> Self {
        if members.windows(2).all(|m| m[0].weight == m[1].weight) {
            Chooser::Uniform
        } else {
            Chooser::Weighted(Alias::build(members))
        }
    }

    #[inline]
    pub(crate) fn pick(&self, n: usize) -> usize {
        match self {
            Chooser::Uniform => rng::below(n),
            Chooser::Weighted(alias) => alias.sample(rng::next_u64()),
        }
    }
}

/// Walker's alias method, built with Vose's algorithm: column `i` is kept with probability
/// `threshold / 2^32`, otherwise its alias is taken.
pub(crate) struct Alias {
    columns: Box<[(u32, u32)]>,
}

impl Alias {
    pub(crate) fn build(members: &[Member]) -> Self {
        let weights: Vec<f64> = members.iter().map(|m| f64::from(m.weight)).collect();
        Self::from_weights(&weights)
    }

    /// A table over positive `weights` (their sum must be above 0).
    pub(crate) fn from_weights(weights: &[f64]) -> Self {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        // Each column holds mass 1; weights are scaled so they sum to n.
        let mut mass: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut columns = vec![(u32::MAX, 0u32); n];
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| mass[i] < 1.0);
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            columns[s] = (to_threshold(mass[s]), l as u32);
            mass[l] -= 1.0 - mass[s];
            if mass[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Whatever is left has mass 1 up to rounding: always kept.
        for i in small.into_iter().chain(large) {
            columns[i] = (u32::MAX, i as u32);
        }
        Self {
            columns: columns.into_boxed_slice(),
        }
    }

    /// A position drawn in proportion to weight, from 64 random bits.
    #[inline]
    pub(crate) fn sample(&self, bits: u64) -> usize {
        let column = rng::scale32((bits >> 32) as u32, self.columns.len());
        let (threshold, alias) = self.columns[column];
        if (bits as u32) < threshold {
            column
        } else {
            alias as usize
        }
    }
}

fn to_threshold(p: f64) -> u32 {
    (p * 4_294_967_296.0).clamp(0.0, f64::from(u32::MAX)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(weights: &[u32]) -> Vec<Member> {
        crate::member::test_members(weights, 1)
    }

    /// The exact probability of each position, by walking all 2^8 columns x coin outcomes on
    /// a coarse grid.
    fn probabilities(alias: &Alias, n: usize) -> Vec<f64> {
        let mut p = vec![0.0; n];
        for (column, &(threshold, other)) in alias.columns.iter().enumerate() {
            let keep = f64::from(threshold) / 4_294_967_296.0;
            p[column] += keep / n as f64;
            p[other as usize] += (1.0 - keep) / n as f64;
        }
        p
    }

    #[test]
    fn alias_table_reproduces_the_weights() {
        let weights = [1, 2, 3, 10, 4];
        let alias = Alias::build(&members(&weights));
        let p = probabilities(&alias, weights.len());
        let total: u32 = weights.iter().sum();
        for (i, &w) in weights.iter().enumerate() {
            let expected = f64::from(w) / f64::from(total);
            assert!(
                (p[i] - expected).abs() < 1e-6,
                "{i}: {} vs {expected}",
                p[i]
            );
        }
    }

    #[test]
    fn sample_keeps_or_aliases_by_the_low_bits() {
        let alias = Alias::build(&members(&[1, 3]));
        // Column 0 has mass 0.5: kept below the threshold, aliased to 1 above.
        assert_eq!(alias.sample(0), 0);
        assert_eq!(alias.sample(u64::from(u32::MAX)), 1);
    }
}
