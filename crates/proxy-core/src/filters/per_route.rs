//! A filter's settings as each route sees them: the listener's, none (`disabled`), or the
//! route's own, resolved by route index without a lookup by name.

use super::Exchange;
use crate::config::{PerRoute, RouteConfig};

/// The listener's settings and, per route in the route table's order, what the route says.
pub(crate) struct PerRouteSettings<T> {
    listener: T,
    routes: Box<[PerRoute<T>]>,
}

impl<T> PerRouteSettings<T> {
    /// `of_route` picks the filter's entry from a route's `filters`; `build` makes the
    /// worker's form of a config (header values made once, and so on).
    pub(crate) fn new<C>(
        listener: &C,
        routes: &[RouteConfig],
        of_route: impl Fn(&RouteConfig) -> &PerRoute<C>,
        build: impl Fn(&C) -> T,
    ) -> Self {
        Self {
            listener: build(listener),
            routes: routes
                .iter()
                .map(|r| match of_route(r) {
                    PerRoute::Inherit => PerRoute::Inherit,
                    PerRoute::Disabled => PerRoute::Disabled,
                    PerRoute::Override(config) => PerRoute::Override(build(config)),
                })
                .collect(),
        }
    }

    /// The settings for this exchange, a route's own replacing the listener's; `None` when
    /// the route turns the filter off. Requests that matched no route get the listener's.
    pub(crate) fn get(&self, exchange: &Exchange<'_>) -> Option<&T> {
        match exchange.route.and_then(|i| self.routes.get(i)) {
            None | Some(PerRoute::Inherit) => Some(&self.listener),
            Some(PerRoute::Disabled) => None,
            Some(PerRoute::Override(own)) => Some(own),
        }
    }

    /// The settings that apply in turn, for filters where a route's own add to the
    /// listener's (header rules): listener's first.
    pub(crate) fn layered(&self, exchange: &Exchange<'_>) -> [Option<&T>; 2] {
        match exchange.route.and_then(|i| self.routes.get(i)) {
            None | Some(PerRoute::Inherit) => [Some(&self.listener), None],
            Some(PerRoute::Disabled) => [None, None],
            Some(PerRoute::Override(own)) => [Some(&self.listener), Some(own)],
        }
    }

    /// The listener's and every route's own settings.
    pub(crate) fn all(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.listener).chain(self.routes.iter().filter_map(|r| match r {
            PerRoute::Override(own) => Some(own),
            _ => None,
        }))
    }
}
