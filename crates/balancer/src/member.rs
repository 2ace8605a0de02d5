//! A host as the policies' tables see it: what `balancer.rs` builds them from.

use std::sync::Arc;

use crate::host::Host;

/// Members over hosts `10.0.NET.1:80`, `10.0.NET.2:80`, ... with the given weights, for the
/// policies' unit tests.
#[cfg(test)]
pub(crate) fn test_members(weights: &[u32], net: u8) -> Vec<Member> {
    use crate::host::{HostSet, HostSpec};
    let specs: Vec<HostSpec> = weights
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            HostSpec::new(format!("10.0.{net}.{}:80", i + 1).parse().unwrap()).with_weight(w)
        })
        .collect();
    let snapshot = HostSet::new(specs).unwrap().snapshot();
    snapshot
        .entries()
        .iter()
        .enumerate()
        .map(|(index, e)| Member {
            host: Arc::clone(&e.host),
            index,
            weight: e.spec.weight,
            priority: e.spec.priority,
        })
        .collect()
}

/// A host as a policy table sees it.
pub(crate) struct Member {
    pub(crate) host: Arc<Host>,
    /// Index in the snapshot.
    pub(crate) index: usize,
    pub(crate) weight: u32,
    pub(crate) priority: u32,
}
