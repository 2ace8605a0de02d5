//! A filter's settings as each request sees them: the listener's, its virtual host's, its
//! route's, or none (`disabled`), resolved by index without a lookup by name.

use super::Exchange;
use config::{PerRoute, RouteConfiguration, RouteFilters};

/// The listener's settings and what each virtual host and route says, in the route table's
/// order. The most specific entry wins: a route's over its host's over the listener's.
pub(crate) struct PerRouteSettings<T> {
    listener: T,
    hosts: Box<[PerRoute<T>]>,
    routes: Box<[PerRoute<T>]>,
}

/// Whose settings: the listener's, or those of the virtual host or route at an index.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Level {
    Listener,
    Host(usize),
    Route(usize),
}

impl<T> PerRouteSettings<T> {
    /// `of` picks the filter's entry from a host's or route's `filters`; `build` makes the
    /// worker's form of a config (header values made once, and so on).
    /// `filter`: the chain filter's name (`TYPE` or `TYPE/INSTANCE`), whose entries are read.
    pub(crate) fn new<C>(
        listener: &C,
        table: &RouteConfiguration,
        filter: &str,
        of: impl Fn(&RouteFilters) -> &PerRoute<C>,
        build: impl Fn(&C) -> T,
    ) -> Self {
        Self::new_at(listener, table, filter, of, |_, config| build(config))
    }

    /// [`PerRouteSettings::new`] for settings that depend on where they are set (a shared
    /// rate-limit bucket is found by its level).
    pub(crate) fn new_at<C>(
        listener: &C,
        table: &RouteConfiguration,
        filter: &str,
        of: impl Fn(&RouteFilters) -> &PerRoute<C>,
        build: impl Fn(Level, &C) -> T,
    ) -> Self {
        let resolve = |level: Level, filters: &RouteFilters| match of(filters.of_filter(filter)) {
            PerRoute::Inherit => PerRoute::Inherit,
            PerRoute::Disabled => PerRoute::Disabled,
            PerRoute::Enabled => PerRoute::Enabled,
            PerRoute::Override(config) => PerRoute::Override(Box::new(build(level, config))),
        };
        Self {
            listener: build(Level::Listener, listener),
            hosts: (table.virtual_hosts.iter().enumerate())
                .map(|(i, h)| resolve(Level::Host(i), &h.filters))
                .collect(),
            routes: (table.routes.iter().enumerate())
                .map(|(i, r)| resolve(Level::Route(i), &r.filters))
                .collect(),
        }
    }

    /// The settings that apply in turn, for filters where each level adds to the one above
    /// (header rules): the listener's, the host's, the route's. `disabled` on a host turns
    /// off the listener's too; on a route, everything. `enabled` on a route under a host that
    /// turns the filter off brings back the listener's. Requests that matched no virtual host
    /// get the listener's.
    pub(crate) fn layered(&self, exchange: &Exchange<'_>) -> [Option<&T>; 3] {
        fn entry<T>(list: &[PerRoute<T>], i: Option<usize>) -> &PerRoute<T> {
            i.and_then(|i| list.get(i)).unwrap_or(&PerRoute::Inherit)
        }
        let host = entry(&self.hosts, exchange.virtual_host);
        let route = entry(&self.routes, exchange.route);
        match (host, route) {
            (_, PerRoute::Disabled) => [None, None, None],
            (PerRoute::Disabled, PerRoute::Enabled) => [Some(&self.listener), None, None],
            (PerRoute::Disabled, route) => [None, None, own(route)],
            (host, route) => [Some(&self.listener), own(host), own(route)],
        }
    }

    /// The settings for this exchange: the most specific level's, or `None` when the filter
    /// is off for it.
    pub(crate) fn get(&self, exchange: &Exchange<'_>) -> Option<&T> {
        self.layered(exchange).into_iter().rev().flatten().next()
    }

    /// The settings set at `level` itself (`None` where it inherits or turns them off).
    pub(crate) fn at(&self, level: Level) -> Option<&T> {
        match level {
            Level::Listener => Some(&self.listener),
            Level::Host(i) => self.hosts.get(i).and_then(own),
            Level::Route(i) => self.routes.get(i).and_then(own),
        }
    }

    /// The listener's and every host's and route's own settings.
    pub(crate) fn all(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.listener)
            .chain(self.hosts.iter().filter_map(own))
            .chain(self.routes.iter().filter_map(own))
    }
}

fn own<T>(entry: &PerRoute<T>) -> Option<&T> {
    match entry {
        PerRoute::Override(own) => Some(own),
        _ => None,
    }
}
