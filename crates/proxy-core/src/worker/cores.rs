//! How many CPUs this process may use.

use std::num::NonZeroUsize;

/// The CPUs this process may run on: the affinity mask, further limited by a cgroup CPU quota
/// (rounded down, at least 1). This is what a container's limit means, not the host's core
/// count (lesson L8).
pub fn usable_cores() -> usize {
    std::thread::available_parallelism()
        .map(NonZeroUsize::get)
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn at_least_one_core_is_usable() {
        assert!(super::usable_cores() >= 1);
    }
}
