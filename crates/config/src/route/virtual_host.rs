//! A listener's routes, grouped by the hosts they serve (Envoy's `RouteConfiguration`).

use std::ops::Range;
use std::sync::Arc;

use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use crate::{RetryPolicy, RouteConfig, RouteFilters};

/// The virtual hosts of a listener and their routes. A request is served by the one virtual
/// host its `host` picks (see [`Domain`]), and then by the first of that host's routes that
/// matches; it never falls through to another virtual host.
#[derive(Debug, Clone)]
pub struct RouteConfiguration {
    /// Every route of every virtual host, host after host in config order. A route is known
    /// by its index here (filters keep their per-route settings by it). Shared: the config
    /// and the route table built from it hold the same routes, and a route unchanged by an
    /// update from a management server is the same one in the next config.
    pub routes: Arc<Vec<Arc<RouteConfig>>>,
    pub virtual_hosts: Vec<VirtualHostConfig>,
    /// Written as a flat `routes:` list: one virtual host for every domain, dumped back in
    /// the same form.
    pub flat: bool,
    /// A request's host is matched without its port, so domains that name one match nothing
    /// (Envoy's `ignore_port_in_host_matching`).
    pub ignore_port_in_host_matching: bool,
    /// The config's clusters by name, when a route here picks one by a request header
    /// (`cluster_header`); empty otherwise.
    pub cluster_names: Arc<std::collections::HashMap<Box<str>, usize>>,
}

impl RouteConfiguration {
    /// A flat list of routes: one virtual host, `*`.
    pub fn flat(mut routes: Vec<Arc<RouteConfig>>) -> Self {
        // Kept as long as the config: no room for more.
        routes.shrink_to_fit();
        let virtual_hosts = vec![VirtualHostConfig {
            name: "default".into(),
            domains: vec![Domain::Any],
            routes: 0..routes.len(),
            retry_policy: None,
            filters: RouteFilters::default(),
            rate_limits: Vec::new(),
        }];
        Self {
            routes: Arc::new(routes),
            virtual_hosts,
            flat: true,
            ignore_port_in_host_matching: false,
            cluster_names: Arc::default(),
        }
    }

    /// The index of the cluster named `name`, for a route's `cluster_header`.
    pub fn cluster_named(&self, name: &[u8]) -> Option<usize> {
        let name = std::str::from_utf8(name).ok()?;
        self.cluster_names.get(name).copied()
    }

    /// The cluster `target` picks for a request: its own, or the one the request names (its
    /// header's first value, or its host for `:authority`), if there is one of that name.
    pub fn cluster_for(
        &self,
        target: &crate::ClusterTarget,
        uri: &http::Uri,
        headers: &http::HeaderMap,
    ) -> Option<usize> {
        let name = match target {
            crate::ClusterTarget::Index(i) => return Some(*i),
            crate::ClusterTarget::Header(header) => headers.get(header)?.as_bytes(),
            crate::ClusterTarget::Authority => match uri.authority() {
                Some(authority) => authority.as_str().as_bytes(),
                None => headers.get(http::header::HOST)?.as_bytes(),
            },
        };
        self.cluster_named(name)
    }

    /// The routes of `host`, in order.
    pub fn routes_of(&self, host: &VirtualHostConfig) -> &[Arc<RouteConfig>] {
        &self.routes[host.routes.clone()]
    }
}

impl PartialEq for RouteConfiguration {
    /// A route shared by both is equal without a look inside: a table changed in one route
    /// of a thousand compares that one.
    fn eq(&self, other: &Self) -> bool {
        let Self {
            routes,
            virtual_hosts,
            flat,
            ignore_port_in_host_matching,
            cluster_names,
        } = self;
        let same_route =
            |(a, b): (&Arc<RouteConfig>, &Arc<RouteConfig>)| Arc::ptr_eq(a, b) || a == b;
        (Arc::ptr_eq(routes, &other.routes)
            || (routes.len() == other.routes.len()
                && routes.iter().zip(other.routes.iter()).all(same_route)))
            && *virtual_hosts == other.virtual_hosts
            && *flat == other.flat
            && *ignore_port_in_host_matching == other.ignore_port_in_host_matching
            && *cluster_names == other.cluster_names
    }
}

/// A set of domains and the routes for requests to them.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualHostConfig {
    pub name: String,
    pub domains: Vec<Domain>,
    /// This host's part of [`RouteConfiguration::routes`].
    pub routes: Range<usize>,
    /// The retry policy of this host's routes that have none of their own (already filled
    /// in on those routes).
    pub retry_policy: Option<RetryPolicy>,
    /// What this host changes about the listener's filters; a route's own entry for a filter
    /// replaces the host's (`ext_authz` context extensions are merged into the routes).
    pub filters: RouteFilters,
    /// Rules for the rate limit filter, for its routes that give none (or include these).
    pub rate_limits: Vec<crate::StagedRateLimit>,
}

/// A domain of a virtual host, stored lowercase. A request's host picks a virtual host by
/// Envoy's order: an exact domain, then the longest suffix wildcard, then the longest prefix
/// wildcard, then `*`. A domain without a port matches the host with any port (or none); a
/// domain with a port (`example.com:8443`) matches only that port, and is tried first.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Domain {
    /// `api.example.com`.
    Exact(String),
    /// `*.example.com` or `*-eu.example.com`, stored as what follows the `*`; the `*` stands
    /// for at least one character.
    Suffix(String),
    /// `api.*` or `api-*`, stored as what precedes the `*`.
    Prefix(String),
    /// `*`.
    Any,
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Domain::Exact(name) => f.write_str(name),
            Domain::Suffix(suffix) => write!(f, "*{suffix}"),
            Domain::Prefix(prefix) => write!(f, "{prefix}*"),
            Domain::Any => f.write_str("*"),
        }
    }
}

impl Serialize for Domain {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl Serialize for RouteConfiguration {
    /// As written: `routes: [...]`, or `virtual_hosts: [...]` each with its own routes.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        if self.ignore_port_in_host_matching {
            map.serialize_entry("ignore_port_in_host_matching", &true)?;
        }
        if self.flat {
            map.serialize_entry("routes", &self.routes[..])?;
        } else {
            let hosts: Vec<HostView<'_>> = self
                .virtual_hosts
                .iter()
                .map(|host| HostView {
                    host,
                    routes: self.routes_of(host),
                })
                .collect();
            map.serialize_entry("virtual_hosts", &hosts)?;
        }
        map.end()
    }
}

struct HostView<'a> {
    host: &'a VirtualHostConfig,
    routes: &'a [Arc<RouteConfig>],
}

impl Serialize for HostView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut host = s.serialize_struct("VirtualHost", 6)?;
        host.serialize_field("name", &self.host.name)?;
        host.serialize_field("domains", &self.host.domains)?;
        if let Some(retry) = &self.host.retry_policy {
            host.serialize_field("retry_policy", retry)?;
        }
        if !self.host.filters.is_default() {
            host.serialize_field("filters", &self.host.filters)?;
        }
        if !self.host.rate_limits.is_empty() {
            host.serialize_field("rate_limits", &self.host.rate_limits)?;
        }
        host.serialize_field("routes", self.routes)?;
        host.end()
    }
}
