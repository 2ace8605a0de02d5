//! The route lookup of one virtual host, built once per table: the routes a request's host can match are found by
//! hash (exact hosts, then each `.suffix` of the host, then routes for any host); within each
//! group, the routes its path can match are found by one hash (exact paths) and one walk down
//! a radix tree of prefixes. Of those, the first in config order whose headers match wins:
//! the answer of trying every route in order (the tests compare the two), at a cost that grows
//! with the path's length, not with the table.

use std::ops::Range;

use foldhash::fast::RandomState;
use http::HeaderMap;

use crate::config::{HostMatch, PathMatch, RouteConfig};

/// Keys come from the config; requests only look up, so a fast hash is safe here.
type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;

pub(super) struct RouteIndex {
    exact_hosts: HashMap<Box<str>, PathIndex>,
    /// `*.example.com`, keyed `.example.com`.
    suffix_hosts: HashMap<Box<str>, PathIndex>,
    any_host: PathIndex,
}

/// The routes of one host group, by path.
#[derive(Default)]
struct PathIndex {
    exact: HashMap<Box<str>, Vec<u32>>,
    prefixes: Node,
}

/// A radix tree node: the routes whose prefix ends here, and children by label. No two
/// children's labels start with the same byte.
#[derive(Default)]
struct Node {
    /// In config order.
    routes: Vec<u32>,
    /// The first byte of each child's label, beside `children`: one short contiguous scan
    /// finds the child to follow.
    firsts: Vec<u8>,
    children: Vec<(Box<[u8]>, Node)>,
}

impl RouteIndex {
    /// The index of `routes[span]`; it answers with positions in `routes`.
    pub(super) fn new(routes: &[RouteConfig], span: Range<usize>) -> Self {
        let mut index = RouteIndex {
            exact_hosts: HashMap::default(),
            suffix_hosts: HashMap::default(),
            any_host: PathIndex::default(),
        };
        for (i, route) in routes[span.clone()].iter().enumerate() {
            let group = match &route.matcher.host {
                HostMatch::Any => &mut index.any_host,
                HostMatch::Exact(host) => {
                    index.exact_hosts.entry(host.as_str().into()).or_default()
                }
                HostMatch::Suffix(suffix) => index
                    .suffix_hosts
                    .entry(suffix.as_str().into())
                    .or_default(),
            };
            // Tables past 4 billion routes are not a concern.
            let i = (span.start + i) as u32;
            match &route.matcher.path {
                PathMatch::Exact(path) => {
                    group.exact.entry(path.as_str().into()).or_default().push(i)
                }
                PathMatch::Prefix(prefix) => group.prefixes.insert(prefix.as_bytes(), i),
            }
        }
        index
    }

    /// The index of the first route matching the request. `host` is lowercase, without
    /// its port.
    pub(super) fn position(
        &self,
        host: &str,
        path: &str,
        headers: &HeaderMap,
        routes: &[RouteConfig],
    ) -> Option<usize> {
        let search = Search {
            path,
            headers,
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
    headers: &'a HeaderMap,
    routes: &'a [RouteConfig],
}

impl Search<'_> {
    /// The first route of `candidates` (in config order) before `best` whose headers match.
    fn first_of(&self, candidates: &[u32], best: Option<u32>) -> Option<u32> {
        candidates
            .iter()
            .take_while(|&&i| best.is_none_or(|b| i < b))
            .find(|&&i| super::headers_match(&self.routes[i as usize].matcher, self.headers))
            .copied()
            .or(best)
    }
}

impl PathIndex {
    /// The first route of this group matching the request, if before `best`; else `best`.
    fn first(&self, search: &Search<'_>, mut best: Option<u32>) -> Option<u32> {
        if !self.exact.is_empty()
            && let Some(candidates) = self.exact.get(search.path)
        {
            best = search.first_of(candidates, best);
        }
        let path = search.path.as_bytes();
        let mut node = &self.prefixes;
        let mut at = 0;
        loop {
            best = search.first_of(&node.routes, best);
            let Some(&next) = path.get(at) else {
                return best;
            };
            let child = node
                .firsts
                .iter()
                .position(|&first| first == next)
                .map(|i| &node.children[i]);
            match child {
                Some((label, child)) if path[at..].starts_with(label) => {
                    at += label.len();
                    node = child;
                }
                _ => return best,
            }
        }
    }
}

impl Node {
    fn insert(&mut self, key: &[u8], route: u32) {
        if key.is_empty() {
            self.routes.push(route);
            return;
        }
        let found = self.firsts.iter().position(|&first| first == key[0]);
        let Some(at) = found else {
            let leaf = Node {
                routes: vec![route],
                ..Node::default()
            };
            self.firsts.push(key[0]);
            self.children.push((key.into(), leaf));
            return;
        };
        let (label, child) = &mut self.children[at];
        let common = label.iter().zip(key).take_while(|(a, b)| a == b).count();
        if common < label.len() {
            // Split the label where the key leaves it.
            let rest: Box<[u8]> = label[common..].into();
            let below = std::mem::take(child);
            *child = Node {
                routes: Vec::new(),
                firsts: vec![rest[0]],
                children: vec![(rest, below)],
            };
            *label = key[..common].into();
        }
        child.insert(&key[common..], route);
    }
}
