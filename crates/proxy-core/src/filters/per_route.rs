//! A filter's settings as each request sees them: the listener's, its virtual host's, its
//! route's, or none (`disabled`), resolved by index without a lookup by name.

use super::Exchange;
use crate::config::{PerRoute, RouteConfiguration, RouteFilters};

/// The listener's settings and what each virtual host and route says, in the route table's
/// order. The most specific entry wins: a route's over its host's over the listener's.
pub(crate) struct PerRouteSettings<T> {
    listener: T,
    hosts: Box<[PerRoute<T>]>,
    routes: Box<[PerRoute<T>]>,
}

impl<T> PerRouteSettings<T> {
    /// `of` picks the filter's entry from a host's or route's `filters`; `build` makes the
    /// worker's form of a config (header values made once, and so on).
    pub(crate) fn new<C>(
        listener: &C,
        table: &RouteConfiguration,
        of: impl Fn(&RouteFilters) -> &PerRoute<C>,
        build: impl Fn(&C) -> T,
    ) -> Self {
        let resolve = |filters: &RouteFilters| match of(filters) {
            PerRoute::Inherit => PerRoute::Inherit,
            PerRoute::Disabled => PerRoute::Disabled,
            PerRoute::Override(config) => PerRoute::Override(Box::new(build(config))),
        };
        Self {
            listener: build(listener),
            hosts: table
                .virtual_hosts
                .iter()
                .map(|h| resolve(&h.filters))
                .collect(),
            routes: table.routes.iter().map(|r| resolve(&r.filters)).collect(),
        }
    }

    /// The host's and the route's own settings for this exchange, `None` where there is
    /// nothing to say; `Err` when the filter is off for it.
    fn levels(&self, exchange: &Exchange<'_>) -> Result<[Option<&T>; 2], Off<'_, T>> {
        fn entry<T>(list: &[PerRoute<T>], i: Option<usize>) -> &PerRoute<T> {
            i.and_then(|i| list.get(i)).unwrap_or(&PerRoute::Inherit)
        }
        match (
            entry(&self.hosts, exchange.virtual_host),
            entry(&self.routes, exchange.route),
        ) {
            (_, PerRoute::Disabled) => Err(Off { route_own: None }),
            (PerRoute::Disabled, PerRoute::Override(own)) => Err(Off {
                route_own: Some(own),
            }),
            (PerRoute::Disabled, PerRoute::Inherit) => Err(Off { route_own: None }),
            (host, route) => Ok([own(host), own(route)]),
        }
    }

    /// The settings for this exchange, the most specific level's; `None` when that level
    /// turns the filter off. Requests that matched no virtual host get the listener's.
    pub(crate) fn get(&self, exchange: &Exchange<'_>) -> Option<&T> {
        match self.levels(exchange) {
            Ok([host, route]) => route.or(host).or(Some(&self.listener)),
            Err(off) => off.route_own,
        }
    }

    /// The settings that apply in turn, for filters where each level adds to the one above
    /// (header rules): the listener's, the host's, the route's. `disabled` on a host turns
    /// off the listener's too; on a route, everything.
    pub(crate) fn layered(&self, exchange: &Exchange<'_>) -> [Option<&T>; 3] {
        match self.levels(exchange) {
            Ok([host, route]) => [Some(&self.listener), host, route],
            Err(off) => [None, None, off.route_own],
        }
    }

    /// The listener's and every host's and route's own settings.
    pub(crate) fn all(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.listener)
            .chain(self.hosts.iter().filter_map(own))
            .chain(self.routes.iter().filter_map(own))
    }
}

/// A filter turned off by a host: a route of that host may still give settings of its own.
struct Off<'a, T> {
    route_own: Option<&'a T>,
}

fn own<T>(entry: &PerRoute<T>) -> Option<&T> {
    match entry {
        PerRoute::Override(own) => Some(own),
        _ => None,
    }
}
