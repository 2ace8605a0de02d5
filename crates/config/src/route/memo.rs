//! Routes from a management server kept checked from one version of their table to the
//! next: a change to one route of a thousand checks that route, not the thousand.
//!
//! A route table's versions share the translation of each route whose bytes they share
//! (`xds.rs`). Each listener chain that serves the table remembers, per shared route, a
//! [`CheckedCell`]: the route as the chain's section made it (clusters not there answering
//! 503, the listener's upgrades allowed, settings for filters not in the chain dropped) and,
//! once checked, the [`RouteConfig`] it became. The next section of the chain, from the same
//! listener, table settings and ready clusters (their names and protocols, not their
//! endpoints), hands the check the cell instead of a copy of the route; the check takes the
//! route checked before when the clusters it was checked against (the config file's among
//! them) are the same, and checks the copy in the cell otherwise.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{ClusterConfig, RawRoute, RouteConfig};

/// The routes of each listener chain that takes its routes from a management server, by
/// listener name and chain (0: the listener's own, then its matched chains in order).
#[derive(Default)]
pub(crate) struct RouteMemo {
    chains: HashMap<(String, usize), ChainMemo>,
    /// Counts the sections of all listeners: a chain not sectioned in the last is gone.
    round: u64,
}

impl std::fmt::Debug for RouteMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all = || self.chains.values().flat_map(|c| c.routes.iter());
        // Routes the section changed, held as copies (the others are the tables' own).
        let copies = all()
            .filter(|(route, cell)| !Arc::ptr_eq(route, &cell.0.sectioned))
            .count();
        write!(
            f,
            "RouteMemo({} chains, {} routes, {copies} copied)",
            self.chains.len(),
            all().count()
        )
    }
}

/// What a chain's routes are sectioned from besides the routes and the table's own settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Inputs {
    /// The listener's digest: its chains, filters, upgrades.
    pub(crate) listener: u64,
    /// [`ready_stamp`] of the clusters ready.
    pub(crate) clusters: u64,
}

impl RouteMemo {
    /// Starts a section of all listeners.
    pub(crate) fn begin(&mut self) {
        self.round += 1;
    }

    /// Forgets the chains the section begun last did not ask for (their listener, or their
    /// routes from a management server, gone).
    pub(crate) fn end(&mut self) {
        let round = self.round;
        self.chains.retain(|_, chain| chain.round == round);
    }

    /// The memo of chain `chain` of listener `name`, whose routes are sectioned from
    /// `inputs` and the route table's own settings (`settings_digest`). A memo of other
    /// inputs is emptied.
    pub(crate) fn chain(
        &mut self,
        name: &str,
        chain: usize,
        inputs: Inputs,
        settings_digest: u64,
    ) -> &mut ChainMemo {
        let inputs = (inputs, settings_digest);
        let memo = self.chains.entry((name.to_owned(), chain)).or_default();
        memo.round = self.round;
        if memo.inputs != Some(inputs) {
            memo.inputs = Some(inputs);
            memo.routes.clear();
        }
        memo
    }
}

/// One chain's routes, in the table's order.
#[derive(Default)]
pub(crate) struct ChainMemo {
    /// What its routes were sectioned from besides themselves.
    inputs: Option<(Inputs, u64)>,
    /// The last section of all listeners that asked for it.
    round: u64,
    /// Each route's shared translation (held: its address names no other route while it is
    /// here) and its cell.
    routes: Vec<(Arc<RawRoute>, CheckedCell)>,
}

impl ChainMemo {
    /// The cell of each route of `routes`, in order: the one remembered for it, or one
    /// holding `section(route)`. Routes of the table no longer there are forgotten.
    pub(crate) fn cells<'a>(
        &mut self,
        routes: impl Iterator<Item = &'a Arc<RawRoute>>,
        mut section: impl FnMut(&'a RawRoute) -> Cow<'a, RawRoute>,
    ) -> Vec<CheckedCell> {
        let before = std::mem::take(&mut self.routes);
        // By address, made when a route is not where it was.
        let mut by_address: Option<HashMap<*const RawRoute, usize, foldhash::fast::RandomState>> =
            None;
        let mut cells = Vec::with_capacity(before.len());
        for (i, route) in routes.enumerate() {
            let remembered = match before.get(i) {
                Some((same, cell)) if Arc::ptr_eq(same, route) => Some(cell),
                _ => by_address
                    .get_or_insert_with(|| {
                        (before.iter().enumerate())
                            .map(|(k, (r, _))| (Arc::as_ptr(r), k))
                            .collect()
                    })
                    .get(&Arc::as_ptr(route))
                    .map(|&k| &before[k].1),
            };
            let cell = match remembered {
                Some(cell) => CheckedCell::clone(cell),
                // A route the section leaves as it is is the table's own, not a copy.
                None => CheckedCell::new(match section(route.as_ref()) {
                    Cow::Borrowed(_) => Arc::clone(route),
                    Cow::Owned(changed) => Arc::new(changed),
                }),
            };
            self.routes
                .push((Arc::clone(route), CheckedCell::clone(&cell)));
            cells.push(cell);
        }
        cells
    }
}

/// A route as a chain's section made it, and the route it was checked into.
#[derive(Clone)]
pub(crate) struct CheckedCell(Arc<RememberedRoute>);

struct RememberedRoute {
    /// The table's own route when the section changed nothing in it.
    sectioned: Arc<RawRoute>,
    checked: Mutex<Option<Checked>>,
}

struct Checked {
    /// [`clusters_stamp`] of the clusters it was checked against.
    clusters: u64,
    route: Arc<RouteConfig>,
}

impl std::fmt::Debug for CheckedCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CheckedCell")
            .field(&self.0.sectioned)
            .finish()
    }
}

impl CheckedCell {
    fn new(sectioned: Arc<RawRoute>) -> Self {
        Self(Arc::new(RememberedRoute {
            sectioned,
            checked: Mutex::new(None),
        }))
    }

    /// The route checked against clusters with this stamp before, if any.
    pub(crate) fn get(&self, clusters: u64) -> Option<Arc<RouteConfig>> {
        let checked = self
            .0
            .checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (checked.as_ref())
            .filter(|c| c.clusters == clusters)
            .map(|c| Arc::clone(&c.route))
    }

    /// The route to check, as the chain's section made it.
    pub(crate) fn sectioned(&self) -> &RawRoute {
        &self.0.sectioned
    }

    /// Remembers what the route was checked into, against clusters with this stamp.
    pub(crate) fn remember(&self, clusters: u64, route: &Arc<RouteConfig>) {
        *self
            .0
            .checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Checked {
            clusters,
            route: Arc::clone(route),
        });
    }
}

/// The clusters routes are checked against, and their stamp, made once per config when a
/// route from a memo asks for it.
pub(crate) struct Clusters<'a> {
    pub(crate) all: &'a [Arc<ClusterConfig>],
    stamp: std::cell::OnceCell<u64>,
}

impl<'a> Clusters<'a> {
    pub(crate) fn new(all: &'a [Arc<ClusterConfig>]) -> Self {
        Self {
            all,
            stamp: std::cell::OnceCell::new(),
        }
    }

    /// [`clusters_stamp`] of them, made at the first call.
    pub(crate) fn stamp(&self) -> u64 {
        *self.stamp.get_or_init(|| clusters_stamp(self.all))
    }
}

/// What a route's section reads of the clusters ready (`names`, each with whether it speaks
/// HTTP/1.1): the routes sectioned with the same stamp are sectioned the same.
pub(crate) fn ready_stamp<'a>(names: impl Iterator<Item = (&'a str, bool)>) -> u64 {
    stamp(names.map(|(name, http1)| (name, u8::from(http1))))
}

/// What a route's check reads of the clusters: their names, in order (a route holds its
/// cluster's index), and their protocols (an upgrade needs HTTP/1.1). A route checked
/// against clusters with the same stamp is checked the same.
fn clusters_stamp(clusters: &[Arc<ClusterConfig>]) -> u64 {
    stamp(clusters.iter().map(|c| (c.name.as_str(), c.protocol as u8)))
}

/// A digest of names in order, each with a byte of what is read of it.
fn stamp<'a>(names: impl Iterator<Item = (&'a str, u8)>) -> u64 {
    // Written out and hashed at once: a thousand small writes to a hasher cost more.
    let mut written = Vec::new();
    for (name, byte) in names {
        written.extend_from_slice(name.as_bytes());
        // Not in a name (a cluster's name is text).
        written.extend_from_slice(&[0xff, byte]);
    }
    crate::envoy::digest(&written)
}
