//! Errors raised while building a host set or a policy. Picks never fail with an error: a pick
//! that finds no usable host returns `None`.

use std::fmt;
use std::net::SocketAddr;

/// Why a host set or a policy could not be built. Each variant names the offending value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum BuildError {
    /// A policy needs at least one host to pick from ([`RoundRobin`](crate::RoundRobin) only:
    /// a [`HostSet`](crate::HostSet) may be empty, and picks from it return `None`).
    NoHosts,
    /// A host was given weight 0; weights start at 1, as in Envoy.
    ZeroWeight { addr: SocketAddr },
    /// The same address appears twice in one host list.
    DuplicateHost { addr: SocketAddr },
    /// More hosts than a table index (`u32`) can name.
    TooManyHosts { count: usize },
    /// Least request compares at least two random hosts.
    ChoiceCountTooSmall { choice_count: u32 },
    /// `active_request_bias` must be a finite number `>= 0`.
    InvalidActiveRequestBias { bias: f64 },
    /// A ring must hold at least one entry.
    RingSizeZero,
    /// `minimum_ring_size` or `maximum_ring_size` is above Envoy's limit of 8M entries.
    RingSizeTooLarge { size: u64, limit: u64 },
    /// `minimum_ring_size` is greater than `maximum_ring_size`.
    MinimumRingSizeAboveMaximum { minimum: u64, maximum: u64 },
    /// Maglev's permutation needs a prime table size (65537 by default).
    TableSizeNotPrime { table_size: u64 },
    /// The maglev table size is above Envoy's limit (5000011).
    TableSizeTooLarge { table_size: u64, limit: u64 },
    /// The healthy panic threshold is a percentage in `0..=100`.
    PanicThresholdOutOfRange { threshold: f64 },
    /// The overprovisioning factor is a percentage of at least 1.
    OverprovisioningFactorZero,
    /// Locality-weighted balancing draws a locality before the host; a hashing policy maps
    /// a key to one host over the whole level, so the two do not combine.
    LocalityWeightedHashing { policy: &'static str },
    /// Zone-aware routing's `routing_enabled` is a percentage in `0..=100`.
    RoutingEnabledOutOfRange { percent: u32 },
    /// Slow start ramps weights, which only round robin and least request use per pick
    /// (as in Envoy).
    SlowStartPolicy { policy: &'static str },
    /// A slow-start setting out of range.
    InvalidSlowStart { reason: &'static str },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoHosts => f.write_str("a load-balancing policy needs at least one host"),
            BuildError::ZeroWeight { addr } => {
                write!(f, "host {addr} has weight 0; weights must be at least 1")
            }
            BuildError::DuplicateHost { addr } => {
                write!(f, "host {addr} appears more than once in the host list")
            }
            BuildError::TooManyHosts { count } => {
                write!(
                    f,
                    "{count} hosts is more than a host set can index ({})",
                    u32::MAX
                )
            }
            BuildError::ChoiceCountTooSmall { choice_count } => {
                write!(
                    f,
                    "least_request choice_count is {choice_count}; it must be at least 2"
                )
            }
            BuildError::InvalidActiveRequestBias { bias } => write!(
                f,
                "least_request active_request_bias is {bias}; it must be a finite number >= 0"
            ),
            BuildError::RingSizeZero => {
                f.write_str("ring_hash minimum_ring_size must be at least 1")
            }
            BuildError::RingSizeTooLarge { size, limit } => {
                write!(
                    f,
                    "ring_hash ring size {size} is above the limit of {limit} entries"
                )
            }
            BuildError::MinimumRingSizeAboveMaximum { minimum, maximum } => write!(
                f,
                "ring_hash minimum_ring_size ({minimum}) is greater than maximum_ring_size ({maximum})"
            ),
            BuildError::TableSizeNotPrime { table_size } => {
                write!(f, "maglev table_size {table_size} is not a prime number")
            }
            BuildError::TableSizeTooLarge { table_size, limit } => {
                write!(
                    f,
                    "maglev table_size {table_size} is above the limit of {limit}"
                )
            }
            BuildError::PanicThresholdOutOfRange { threshold } => write!(
                f,
                "healthy panic threshold {threshold} is not a percentage between 0 and 100"
            ),
            BuildError::OverprovisioningFactorZero => {
                f.write_str("the overprovisioning factor is 0; it must be at least 1 (percent)")
            }
            BuildError::LocalityWeightedHashing { policy } => write!(
                f,
                "locality-weighted balancing does not combine with {policy}, which hashes over every host of a priority"
            ),
            BuildError::SlowStartPolicy { policy } => write!(
                f,
                "slow start is for round_robin and least_request, not {policy}"
            ),
            BuildError::InvalidSlowStart { reason } => write!(f, "slow start: {reason}"),
            BuildError::RoutingEnabledOutOfRange { percent } => write!(
                f,
                "zone-aware routing_enabled is {percent}%; it must be within 0..=100"
            ),
        }
    }
}

impl std::error::Error for BuildError {}
