//! Errors raised while building a policy.

use std::fmt;

/// Why a policy could not be built for a host set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BuildError {
    /// A policy needs at least one host to pick from.
    NoHosts,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoHosts => f.write_str("a load-balancing policy needs at least one host"),
        }
    }
}

impl std::error::Error for BuildError {}
