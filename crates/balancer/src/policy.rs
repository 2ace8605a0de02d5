//! Which policy a [`LoadBalancer`](crate::LoadBalancer) runs, with Envoy's options and
//! defaults.

use crate::BuildError;

/// Least request compares this many random hosts unless told otherwise (Envoy's default).
pub const DEFAULT_CHOICE_COUNT: u32 = 2;
/// Envoy's default `active_request_bias`.
pub const DEFAULT_ACTIVE_REQUEST_BIAS: f64 = 1.0;
/// Envoy's default `minimum_ring_size`.
pub const DEFAULT_MINIMUM_RING_SIZE: u64 = 1024;
/// Envoy's default (and largest allowed) `maximum_ring_size`: 8M entries.
pub const MAX_RING_SIZE: u64 = 8 * 1024 * 1024;
/// Envoy's default maglev `table_size` (a prime).
pub const DEFAULT_MAGLEV_TABLE_SIZE: u64 = 65537;
/// Envoy's largest allowed maglev `table_size`.
pub const MAX_MAGLEV_TABLE_SIZE: u64 = 5_000_011;
/// Envoy's default `healthy_panic_threshold`, in percent.
pub const DEFAULT_PANIC_THRESHOLD: f64 = 50.0;

/// A load-balancing policy and its options.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum LbPolicy {
    /// Each host in turn; with unequal weights, a smooth weighted schedule (earliest deadline
    /// first, as Envoy's weighted round robin) in which a host of weight 3 appears three times
    /// per cycle, spread out.
    #[default]
    RoundRobin,
    /// Power of N choices: the least loaded of `choice_count` random hosts. With unequal
    /// weights, candidates drawn by weight and kept by Envoy's effective weight
    /// `weight / (active + 1)^bias` (see [`LeastRequestOptions`]).
    LeastRequest(LeastRequestOptions),
    /// A random host; with unequal weights, chosen in proportion to weight.
    Random,
    /// Consistent hashing on a ketama ring: a request's hash key maps to the next host hash
    /// clockwise. Removing one of N hosts moves its 1/N of the keys, plus up to another 1/N
    /// when the ring is at its minimum size (Envoy's sizing then gives each remaining host a
    /// few more entries).
    RingHash(RingHashOptions),
    /// Consistent hashing through a maglev lookup table: one lookup per pick; removing one
    /// of N hosts moves little more than its 1/N of the keys.
    Maglev(MaglevOptions),
}

impl LbPolicy {
    /// Least request with Envoy's defaults (two choices, bias 1.0).
    pub fn least_request() -> Self {
        LbPolicy::LeastRequest(LeastRequestOptions::default())
    }

    /// Ring hash with Envoy's defaults (ring of 1024 to 8M entries).
    pub fn ring_hash() -> Self {
        LbPolicy::RingHash(RingHashOptions::default())
    }

    /// Maglev with Envoy's default table size (65537).
    pub fn maglev() -> Self {
        LbPolicy::Maglev(MaglevOptions::default())
    }

    /// The policy's name as Envoy's configuration spells it (`round_robin`, `least_request`,
    /// `random`, `ring_hash`, `maglev`).
    pub fn name(&self) -> &'static str {
        match self {
            LbPolicy::RoundRobin => "round_robin",
            LbPolicy::LeastRequest(_) => "least_request",
            LbPolicy::Random => "random",
            LbPolicy::RingHash(_) => "ring_hash",
            LbPolicy::Maglev(_) => "maglev",
        }
    }

    /// Whether [`LoadBalancer::peek`](crate::LoadBalancer::peek) can tell the next picks
    /// ahead: round robin and random, as Envoy's predictive preconnect (least request
    /// depends on the loads when the pick is made, the hashing policies on the request).
    pub fn peeks(&self) -> bool {
        matches!(self, LbPolicy::RoundRobin | LbPolicy::Random)
    }

    /// Whether the policy picks by the request's hash key (ring hash, maglev); the others
    /// ignore it.
    pub fn hashes(&self) -> bool {
        matches!(self, LbPolicy::RingHash(_) | LbPolicy::Maglev(_))
    }

    /// Checks the options, as [`LoadBalancer::new`](crate::LoadBalancer::new) does.
    pub fn validate(&self) -> Result<(), BuildError> {
        match self {
            LbPolicy::RoundRobin | LbPolicy::Random => Ok(()),
            LbPolicy::LeastRequest(o) => o.validate(),
            LbPolicy::RingHash(o) => o.validate(),
            LbPolicy::Maglev(o) => o.validate(),
        }
    }
}

/// Options of [`LbPolicy::LeastRequest`] (Envoy's `LeastRequestLbConfig`).
///
/// With equal weights a pick is Envoy's P2C exactly: `choice_count` uniformly random hosts,
/// the one with the fewest active requests wins (the first drawn on a tie). With unequal
/// weights Envoy runs a per-worker earliest-deadline-first schedule over the effective
/// weights `weight / (active + 1)^active_request_bias`; a lock-free shared balancer cannot
/// keep such a mutable schedule, so this crate samples the same distribution instead:
/// `choice_count` candidates drawn in proportion to weight, one kept with probability
/// proportional to `1 / (active + 1)^bias`. With no load the split is exactly the weights;
/// more requests in flight always lower a host's share; larger `choice_count` brings the
/// split closer to Envoy's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeastRequestOptions {
    /// How many random hosts to compare; at least 2.
    pub choice_count: u32,
    /// How strongly in-flight requests lower a host's effective weight when weights differ:
    /// `weight / (active + 1)^bias`. 0 ignores load (plain weighted random); must be finite
    /// and `>= 0`.
    pub active_request_bias: f64,
}

impl Default for LeastRequestOptions {
    fn default() -> Self {
        Self {
            choice_count: DEFAULT_CHOICE_COUNT,
            active_request_bias: DEFAULT_ACTIVE_REQUEST_BIAS,
        }
    }
}

impl LeastRequestOptions {
    fn validate(&self) -> Result<(), BuildError> {
        if self.choice_count < 2 {
            return Err(BuildError::ChoiceCountTooSmall {
                choice_count: self.choice_count,
            });
        }
        let bias = self.active_request_bias;
        if !bias.is_finite() || bias < 0.0 {
            return Err(BuildError::InvalidActiveRequestBias { bias });
        }
        Ok(())
    }
}

/// Options of [`LbPolicy::RingHash`] (Envoy's `RingHashLbConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingHashOptions {
    /// The ring has at least this many entries (more entries: weights are followed more
    /// closely, at the cost of memory and a slightly longer search). At least 1.
    pub minimum_ring_size: u64,
    /// The ring never has more entries than this; at most 8M.
    pub maximum_ring_size: u64,
}

impl Default for RingHashOptions {
    fn default() -> Self {
        Self {
            minimum_ring_size: DEFAULT_MINIMUM_RING_SIZE,
            maximum_ring_size: MAX_RING_SIZE,
        }
    }
}

impl RingHashOptions {
    fn validate(&self) -> Result<(), BuildError> {
        let (minimum, maximum) = (self.minimum_ring_size, self.maximum_ring_size);
        if minimum == 0 {
            return Err(BuildError::RingSizeZero);
        }
        for size in [minimum, maximum] {
            if size > MAX_RING_SIZE {
                return Err(BuildError::RingSizeTooLarge {
                    size,
                    limit: MAX_RING_SIZE,
                });
            }
        }
        if minimum > maximum {
            return Err(BuildError::MinimumRingSizeAboveMaximum { minimum, maximum });
        }
        Ok(())
    }
}

/// Options of [`LbPolicy::Maglev`] (Envoy's `MaglevLbConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaglevOptions {
    /// Entries in the lookup table: a prime, ideally far larger than the number of hosts
    /// (the maglev paper suggests 100x) so that weights are followed closely.
    pub table_size: u64,
}

impl Default for MaglevOptions {
    fn default() -> Self {
        Self {
            table_size: DEFAULT_MAGLEV_TABLE_SIZE,
        }
    }
}

impl MaglevOptions {
    fn validate(&self) -> Result<(), BuildError> {
        let table_size = self.table_size;
        if table_size > MAX_MAGLEV_TABLE_SIZE {
            return Err(BuildError::TableSizeTooLarge {
                table_size,
                limit: MAX_MAGLEV_TABLE_SIZE,
            });
        }
        if !is_prime(table_size) {
            return Err(BuildError::TableSizeNotPrime { table_size });
        }
        Ok(())
    }
}

/// Trial division; table sizes are at most a few million, so this is instant.
fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    if n.is_multiple_of(2) {
        return n == 2;
    }
    let mut d = 3;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_envoys() {
        assert_eq!(LeastRequestOptions::default().choice_count, 2);
        assert_eq!(LeastRequestOptions::default().active_request_bias, 1.0);
        assert_eq!(RingHashOptions::default().minimum_ring_size, 1024);
        assert_eq!(RingHashOptions::default().maximum_ring_size, 8_388_608);
        assert_eq!(MaglevOptions::default().table_size, 65537);
        for policy in [
            LbPolicy::RoundRobin,
            LbPolicy::least_request(),
            LbPolicy::Random,
            LbPolicy::ring_hash(),
            LbPolicy::maglev(),
        ] {
            assert_eq!(policy.validate(), Ok(()), "{}", policy.name());
        }
    }

    #[test]
    fn rejects_a_single_choice() {
        let policy = LbPolicy::LeastRequest(LeastRequestOptions {
            choice_count: 1,
            ..Default::default()
        });
        assert_eq!(
            policy.validate(),
            Err(BuildError::ChoiceCountTooSmall { choice_count: 1 })
        );
    }

    #[test]
    fn rejects_a_negative_or_nan_bias() {
        for bias in [-0.5, f64::NAN, f64::INFINITY] {
            let policy = LbPolicy::LeastRequest(LeastRequestOptions {
                active_request_bias: bias,
                ..Default::default()
            });
            assert!(matches!(
                policy.validate(),
                Err(BuildError::InvalidActiveRequestBias { .. })
            ));
        }
    }

    #[test]
    fn rejects_bad_ring_sizes() {
        let ring = |minimum_ring_size, maximum_ring_size| {
            LbPolicy::RingHash(RingHashOptions {
                minimum_ring_size,
                maximum_ring_size,
            })
            .validate()
        };
        assert_eq!(ring(0, 10), Err(BuildError::RingSizeZero));
        assert_eq!(
            ring(100, 10),
            Err(BuildError::MinimumRingSizeAboveMaximum {
                minimum: 100,
                maximum: 10
            })
        );
        assert_eq!(
            ring(10, MAX_RING_SIZE + 1),
            Err(BuildError::RingSizeTooLarge {
                size: MAX_RING_SIZE + 1,
                limit: MAX_RING_SIZE
            })
        );
    }

    #[test]
    fn rejects_a_table_size_that_is_not_prime() {
        let maglev = |table_size| LbPolicy::Maglev(MaglevOptions { table_size }).validate();
        assert_eq!(
            maglev(65536),
            Err(BuildError::TableSizeNotPrime { table_size: 65536 })
        );
        assert_eq!(
            maglev(1),
            Err(BuildError::TableSizeNotPrime { table_size: 1 })
        );
        assert_eq!(maglev(251), Ok(()));
        assert_eq!(maglev(5_000_011), Ok(()));
        assert!(matches!(
            maglev(5_000_077),
            Err(BuildError::TableSizeTooLarge { .. })
        ));
    }

    #[test]
    fn knows_small_primes() {
        let primes: Vec<u64> = (0..30).filter(|n| is_prime(*n)).collect();
        assert_eq!(primes, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
    }
}
