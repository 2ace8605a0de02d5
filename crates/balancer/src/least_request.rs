//! Least request: power of N choices.
//!
//! With equal weights this is Envoy's algorithm exactly: draw `choice_count` hosts uniformly
//! at random (with replacement) and keep the one with the fewest active requests, the first
//! drawn on a tie. A host with the most active requests in the set never gets a new one until
//! it has drained to the level of another.
//!
//! With unequal weights Envoy switches to a per-worker earliest-deadline-first schedule whose
//! weights are recomputed at each pick as `weight / (active + 1)^active_request_bias`, so
//! that hosts get traffic in proportion to that effective weight. A mutable schedule would
//! need a lock on a shared balancer, so this crate samples the same distribution instead
//! (sampling-importance-resampling): `choice_count` candidates are drawn in proportion to
//! weight (an alias table, O(1) per draw), then one of them is kept with probability
//! proportional to `1 / (active + 1)^bias`. With no load the split is exactly the weights;
//! more requests in flight always lower a host's share, more sharply the larger the bias;
//! bias 0 ignores load (weighted random, as Envoy's bias 0 is weighted round robin). As
//! `choice_count` grows the split tends to Envoy's `weight / (active + 1)^bias` exactly; with
//! the default 2 it lies between that and the plain weights.

use crate::member::Member;
use crate::policy::LeastRequestOptions;
use crate::random::Alias;
use crate::rng;

pub(crate) struct Chooser {
    choice_count: u32,
    bias: Bias,
    /// Present when weights differ.
    alias: Option<Alias>,
}

#[derive(Clone, Copy)]
enum Bias {
    /// Ignore load (weighted random).
    Zero,
    /// `1 / (active + 1)`, without `powf`.
    One,
    /// `(active + 1)^-bias`.
    Other(f64),
}

impl Chooser {
    pub(crate) fn build(members: &[Member], options: &LeastRequestOptions) -> Self {
        let equal = members.windows(2).all(|m| m[0].weight == m[1].weight);
        let bias = match options.active_request_bias {
            0.0 => Bias::Zero,
            1.0 => Bias::One,
            b => Bias::Other(b),
        };
        Self {
            choice_count: options.choice_count,
            bias,
            alias: (!equal).then(|| Alias::build(members)),
        }
    }

    /// The position of the chosen member.
    #[inline]
    pub(crate) fn pick(&self, members: &[Member]) -> usize {
        let n = members.len();
        if n <= 1 {
            return 0;
        }
        match &self.alias {
            None => self.pick_unweighted(members),
            Some(alias) => self.pick_weighted(members, alias),
        }
    }

    #[inline]
    fn pick_unweighted(&self, members: &[Member]) -> usize {
        let n = members.len();
        // One 64-bit draw gives the first two choices (32 bits each; n fits in u32).
        let bits = rng::next_u64();
        let mut best = rng::scale32(bits as u32, n);
        let mut best_active = members[best].host.active_requests();
        let second = rng::scale32((bits >> 32) as u32, n);
        let active = members[second].host.active_requests();
        if active < best_active {
            best = second;
            best_active = active;
        }
        for _ in 2..self.choice_count {
            let candidate = rng::below(n);
            let active = members[candidate].host.active_requests();
            if active < best_active {
                best = candidate;
                best_active = active;
            }
        }
        best
    }

    fn pick_weighted(&self, members: &[Member], alias: &Alias) -> usize {
        let mut chosen = alias.sample(rng::next_u64());
        if let Bias::Zero = self.bias {
            return chosen;
        }
        // Weighted reservoir of one: candidate j replaces the choice with probability
        // s_j / (s_1 + .. + s_j), which keeps each candidate with probability s_j / sum(s).
        let mut total = self.score(members[chosen].host.active_requests());
        for _ in 1..self.choice_count {
            let candidate = alias.sample(rng::next_u64());
            let score = self.score(members[candidate].host.active_requests());
            total += score;
            if rng::unit_f64() * total < score {
                chosen = candidate;
            }
        }
        chosen
    }

    /// `1 / (active + 1)^bias`: the candidate's effective weight divided by its weight (the
    /// weight is already in the odds of being drawn).
    #[inline]
    fn score(&self, active: u64) -> f64 {
        let load = active as f64 + 1.0;
        match self.bias {
            Bias::Zero => 1.0,
            Bias::One => 1.0 / load,
            Bias::Other(bias) => load.powf(-bias),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(weights: &[u32]) -> Vec<Member> {
        crate::member::test_members(weights, 0)
    }

    #[test]
    fn scores_follow_the_bias() {
        let m = members(&[1, 2]);
        let one = Chooser::build(&m, &LeastRequestOptions::default());
        assert_eq!(one.score(0), 1.0);
        assert_eq!(one.score(3), 0.25);
        let two = Chooser::build(
            &m,
            &LeastRequestOptions {
                active_request_bias: 2.0,
                ..Default::default()
            },
        );
        assert_eq!(two.score(1), 0.25);
        let zero = Chooser::build(
            &m,
            &LeastRequestOptions {
                active_request_bias: 0.0,
                ..Default::default()
            },
        );
        assert_eq!(zero.score(100), 1.0);
    }

    #[test]
    fn a_single_member_is_always_chosen() {
        let m = members(&[3]);
        let chooser = Chooser::build(&m, &LeastRequestOptions::default());
        assert_eq!(chooser.pick(&m), 0);
    }
}
