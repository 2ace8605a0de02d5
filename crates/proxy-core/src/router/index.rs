//! The route lookup of one virtual host, built once per table. The routes a request's host
//! can match are found by hash: exact hosts, then each `.suffix` of the host, then routes for
//! any host. Within each group, the routes its path can match are found by one hash (exact
//! paths) and one walk down a radix tree of prefixes. Of those, the first in config order
//! whose headers match wins: the answer of trying every route in order (the tests compare
//! the two), at a cost that grows with the path's length, not with the table.

use std::ops::Range;
use std::sync::Arc;

use foldhash::fast::RandomState;

use super::Request;
use super::prefix_tree::{self, PrefixTree};
use config::{HostMatch, PathMatch, RouteConfig};

/// Keys come from the config; requests only look up, so a fast hash is safe here.
type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;

pub(super) struct RouteIndex {
    exact_hosts: HashMap<Box<str>, PathIndex>,
    /// `*.example.com`, keyed `.example.com`.
    suffix_hosts: HashMap<Box<str>, PathIndex>,
    any_host: PathIndex,
}

/// The routes of one host group, by path.
struct PathIndex {
    exact: HashMap<Box<str>, Vec<u32>>,
    prefixes: PrefixTree,
    /// Routes whose path is a regex, or CONNECT's: each is a candidate, checked in full.
    regexes: Vec<u32>,
    /// Routes matching whatever the path's case (`case_sensitive: false`), keyed lowercase
    /// and looked up with the path lowercased; `None` when the group has none.
    folded: Option<Box<PathIndex>>,
}

/// A [`PathIndex`] being built from routes borrowed for the while.
#[derive(Default)]
struct PathIndexBuilder<'a> {
    exact: HashMap<Box<str>, Vec<u32>>,
    prefixes: prefix_tree::Builder<'a>,
    regexes: Vec<u32>,
    folded: Option<Box<PathIndexBuilder<'a>>>,
}

impl<'a> PathIndexBuilder<'a> {
    fn insert(&mut self, path: &'a PathMatch, i: u32) {
        match path {
            PathMatch::Exact(path) => self.exact.entry(path.as_str().into()).or_default().push(i),
            // A candidate by its prefix; the separator after it is checked in full.
            PathMatch::Prefix(prefix) | PathMatch::SeparatedPrefix(prefix) => {
                self.prefixes.insert(prefix.as_bytes(), i)
            }
            PathMatch::Regex(_) | PathMatch::Connect => self.regexes.push(i),
        }
    }

    fn build(self) -> PathIndex {
        PathIndex {
            exact: self.exact,
            prefixes: self.prefixes.freeze(),
            regexes: self.regexes,
            folded: self.folded.map(|f| Box::new(f.build())),
        }
    }
}

impl RouteIndex {
    /// The index of `routes[span]`; it answers with positions in `routes`.
    pub(super) fn new(routes: &[Arc<RouteConfig>], span: Range<usize>) -> Self {
        let mut exact_hosts: HashMap<Box<str>, PathIndexBuilder> = HashMap::default();
        let mut suffix_hosts: HashMap<Box<str>, PathIndexBuilder> = HashMap::default();
        let mut any_host = PathIndexBuilder::default();
        for (i, route) in routes[span.clone()].iter().enumerate() {
            let group = match &route.matcher.host {
                HostMatch::Any => &mut any_host,
                HostMatch::Exact(host) => exact_hosts.entry(host.as_str().into()).or_default(),
                HostMatch::Suffix(suffix) => {
                    suffix_hosts.entry(suffix.as_str().into()).or_default()
                }
            };
            // Tables past 4 billion routes are not a concern.
            let i = (span.start + i) as u32;
            // A regex folds case itself, and sees the path as sent.
            if route.matcher.case_sensitive
                || matches!(route.matcher.path, PathMatch::Regex(_) | PathMatch::Connect)
            {
                group.insert(&route.matcher.path, i);
            } else {
                // Validation stored the path lowercase.
                group
                    .folded
                    .get_or_insert_with(Default::default)
                    .insert(&route.matcher.path, i);
            }
        }
        let build = |groups: HashMap<Box<str>, PathIndexBuilder<'_>>| {
            groups.into_iter().map(|(k, g)| (k, g.build())).collect()
        };
        RouteIndex {
            exact_hosts: build(exact_hosts),
            suffix_hosts: build(suffix_hosts),
            any_host: any_host.build(),
        }
    }

    /// The index of the first route matching the request. `host` is lowercase, without
    /// its port.
    pub(super) fn position(
        &self,
        host: &str,
        request: &Request<'_>,
        routes: &[Arc<RouteConfig>],
    ) -> Option<usize> {
        let search = Search {
            path: request.path,
            lowercase: std::cell::OnceCell::new(),
            request,
            routes,
        };
        // Host-specific groups first: the routes for any host usually come last (the
        // catch-all), and what is found before them bounds the search among them.
        let mut best = None;
        if !self.exact_hosts.is_empty()
            && let Some(group) = self.exact_hosts.get(host)
        {
            best = group.first(&search, best);
        }
        if !self.suffix_hosts.is_empty() {
            // Every `.suffix` of the host past its first byte: a suffix route needs at least
            // one byte before its dot.
            for (at, byte) in host.bytes().enumerate().skip(1) {
                if byte == b'.'
                    && let Some(group) = self.suffix_hosts.get(&host[at..])
                {
                    best = group.first(&search, best);
                }
            }
        }
        self.any_host.first(&search, best).map(|i| i as usize)
    }
}

/// One request, as the groups see it.
struct Search<'a> {
    path: &'a str,
    /// The path lowercased (copied only if it has capitals), made by the first group with
    /// case-insensitive routes.
    lowercase: std::cell::OnceCell<std::borrow::Cow<'a, str>>,
    request: &'a Request<'a>,
    routes: &'a [Arc<RouteConfig>],
}

impl Search<'_> {
    /// The first route of `candidates` (in config order) before `best` whose other
    /// conditions (headers, query, a regex path) hold.
    fn first_of(&self, candidates: &[u32], best: Option<u32>) -> Option<u32> {
        candidates
            .iter()
            .take_while(|&&i| best.is_none_or(|b| i < b))
            .find(|&&i| super::conditions_match(&self.routes[i as usize].matcher, self.request))
            .copied()
            .or(best)
    }
}

impl PathIndex {
    /// The first route of this group matching the request, if before `best`; else `best`.
    fn first(&self, search: &Search<'_>, best: Option<u32>) -> Option<u32> {
        let best = self.first_by(search.path, search, best);
        match &self.folded {
            None => best,
            Some(folded) => {
                let lowercase = search
                    .lowercase
                    .get_or_init(|| super::lowercase(search.path));
                folded.first_by(lowercase, search, best)
            }
        }
    }

    /// [`first`](Self::first) among this index's own routes, for `path`.
    fn first_by(&self, path: &str, search: &Search<'_>, mut best: Option<u32>) -> Option<u32> {
        if !self.exact.is_empty()
            && let Some(candidates) = self.exact.get(path)
        {
            best = search.first_of(candidates, best);
        }
        self.prefixes.walk(path.as_bytes(), |candidates| {
            best = search.first_of(candidates, best);
        });
        if !self.regexes.is_empty() {
            best = search.first_of(&self.regexes, best);
        }
        best
    }
}
