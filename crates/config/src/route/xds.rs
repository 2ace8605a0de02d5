//! RouteConfiguration -> virtual hosts and their routes.

// Control planes still send deprecated fields (`exact_match`); they are read, not ignored.
#![allow(deprecated)]

use std::borrow::Cow;
use std::sync::Arc;

use crate::field_path::FieldPath;

use envoy_types::pb::envoy::config::core::v3::data_source;
use envoy_types::pb::envoy::config::route::v3::route_action as action;
use envoy_types::pb::envoy::config::route::v3::{
    CookieMatcher, DirectResponseAction, Route, RouteAction, RouteConfiguration, RouteMatch,
    VirtualHost, route, route_match,
};
use envoy_types::pb::google::protobuf::Any;

use super::xds_actions as route_action;
use crate::envoy::headers::{self as xds_headers, Lists};
use crate::envoy::matchers;
use crate::envoy::{ResourceError, decode, duration, fields, nothing_else, type_url};
use crate::filters::xds::route_filters;
use crate::{
    RawCookieMatch, RawDirectResponse, RawMatch, RawRetryPolicy, RawRoute, RawVirtualHost,
};
use crate::{RawHeaderRules, RawPerRoute, RawRouteFilters};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;

#[cfg(test)]
#[path = "xds_tests.rs"]
mod tests;

#[cfg(test)]
thread_local! {
    /// Routes translated by this thread: the tests see which were kept.
    static TRANSLATED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A route configuration from the management server (RDS, or inline in a listener).
#[derive(Debug, Clone)]
pub struct XdsRoutes {
    pub name: String,
    virtual_hosts: Vec<XdsHost>,
    pub(crate) ignore_port_in_host_matching: bool,
    /// The `headers` filter's listener entry, when any level changes headers: the route
    /// configuration's own mutations, in Envoy's order of the levels.
    headers: Option<RawHeaderRules>,
    /// Per virtual host, digests of the bytes it was translated from (empty when it came
    /// whole, inline in a listener): the next version of the table translates only the
    /// routes whose bytes changed.
    encoded: Vec<EncodedHost>,
    /// A digest of its bytes without its virtual hosts, its own settings (0 when it came
    /// whole): the routes' memo is kept while it stays.
    settings_digest: u64,
}

/// A virtual host as translated. Its routes are shared: the next version of the table keeps
/// those whose bytes are unchanged without copying them.
#[derive(Debug, Clone)]
struct XdsHost {
    /// Without its routes.
    host: RawVirtualHost,
    routes: Vec<Arc<RawRoute>>,
}

/// What a virtual host was translated from: a digest of its bytes without its routes, and
/// per route (in their order) a digest of its bytes and where it is among the host's
/// translated routes (`None` for a route that can never match, which is left out).
#[derive(Debug, Clone)]
struct EncodedHost {
    digest: u64,
    routes: Vec<(u64, Option<usize>)>,
}

/// Per route of a virtual host, in their order, where it is among the host's translated
/// routes (`None`: left out).
type Places = Vec<Option<usize>>;

/// By digest: the keys are hashes already, and a thousand are hashed again per change.
type DigestMap<V> = std::collections::HashMap<u64, V, foldhash::fast::RandomState>;

/// A route to translate, or the translation of the same bytes kept from before. Boxed: a
/// decoded route takes 2 KiB, and a table changed in one route holds a thousand kept ones.
enum RouteInput<'a> {
    Decoded(Box<Route>),
    Kept(Option<&'a Arc<RawRoute>>),
}

impl XdsRoutes {
    pub fn decode(value: &Any) -> Result<Self, ResourceError> {
        Self::decode_after(value, |_| None)
    }

    /// [`Self::decode`], keeping what `held` (given the configuration's name, the version of
    /// it held before) translated from the same bytes: a route whose bytes are those of a
    /// route there, in a virtual host whose own bytes are the same, is neither decoded nor
    /// translated again. A change to one route of a thousand costs that route.
    pub fn decode_after<'a>(
        value: &Any,
        held: impl FnOnce(&str) -> Option<&'a XdsRoutes>,
    ) -> Result<Self, ResourceError> {
        if value.type_url == type_url::ROUTE
            && let Some(parts) = Parts::decode(&value.value, held)
        {
            return parts.translate();
        }
        // Malformed somewhere: decoded whole, which says where.
        let config: RouteConfiguration = decode(value, type_url::ROUTE, "a RouteConfiguration")?;
        Self::translate(config, None)
    }

    /// `listener`: the listener an inline `route_config` belongs to (names the errors).
    pub(crate) fn translate(
        mut config: RouteConfiguration,
        listener: Option<&str>,
    ) -> Result<Self, ResourceError> {
        let hosts = std::mem::take(&mut config.virtual_hosts)
            .into_iter()
            .map(|mut host| {
                let routes = std::mem::take(&mut host.routes);
                (
                    host,
                    routes
                        .into_iter()
                        .map(|r| RouteInput::Decoded(Box::new(r)))
                        .collect(),
                )
            })
            .collect();
        let (translated, _) = Self::translate_hosts(config, hosts, listener)?;
        Ok(translated)
    }

    /// `hosts`: each virtual host without its routes, and its routes. Returns, per host,
    /// where each route is among its translated routes.
    fn translate_hosts(
        mut config: RouteConfiguration,
        hosts: Vec<(VirtualHost, Vec<RouteInput<'_>>)>,
        listener: Option<&str>,
    ) -> Result<(Self, Vec<Places>), ResourceError> {
        let name = std::mem::take(&mut config.name);
        let at = match listener {
            Some(l) => format!("listener `{l}`.route_config"),
            None => format!("routes `{name}`"),
        };
        // Checking that routes name known clusters is the server's option; a route to an
        // unknown cluster answers 503 here either way.
        config.validate_clusters = None;
        config.metadata = None;
        let ignore_port_in_host_matching = std::mem::take(&mut config.ignore_port_in_host_matching);
        let own_headers = xds_headers::rules(
            Lists {
                request_add: std::mem::take(&mut config.request_headers_to_add),
                request_remove: std::mem::take(&mut config.request_headers_to_remove),
                response_add: std::mem::take(&mut config.response_headers_to_add),
                response_remove: std::mem::take(&mut config.response_headers_to_remove),
            },
            &at,
        )?;
        let most_specific_wins = std::mem::take(&mut config.most_specific_header_mutations_wins);
        // Envoy refuses a configuration whose direct responses carry more than this (4 KiB
        // unless raised).
        let max_body = config
            .max_direct_response_body_size_bytes
            .take()
            .map_or(4096, |v| v.value as usize);
        nothing_else(&config, fields::ROUTE_CONFIGURATION, &at)?;
        let (virtual_hosts, places): (Vec<XdsHost>, Vec<_>) = hosts
            .into_iter()
            .enumerate()
            .map(|(i, (host, routes))| {
                virtual_host(host, routes, &format!("{at}.virtual_hosts[{i}]"))
            })
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        for (i, host) in virtual_hosts.iter().enumerate() {
            for (j, route) in host.routes.iter().enumerate() {
                if let Some(direct) = &route.direct_response
                    && direct.body.len() > max_body
                {
                    return Err(ResourceError::invalid(
                        format!("{at}.virtual_hosts[{i}].routes[{j}].direct_response.body"),
                        format!(
                            "{} bytes, over max_direct_response_body_size_bytes ({max_body})",
                            direct.body.len()
                        ),
                    ));
                }
            }
        }
        let levels_below = virtual_hosts.iter().any(|h: &XdsHost| {
            std::iter::once(&h.host.filters)
                .chain(h.routes.iter().map(|r| &r.filters))
                .any(|f| f.as_ref().is_some_and(|f| f.headers.is_some()))
                || h.routes
                    .iter()
                    .any(|r| (r.weighted_clusters.iter().flatten()).any(|c| c.headers.is_some()))
        });
        let headers = (own_headers.is_some() || levels_below).then(|| RawHeaderRules {
            most_specific_wins: Some(most_specific_wins),
            ..own_headers.unwrap_or_default()
        });
        let translated = Self {
            name,
            virtual_hosts,
            ignore_port_in_host_matching,
            headers,
            encoded: Vec::new(),
            settings_digest: 0,
        };
        Ok((translated, places))
    }

    /// Without what it was translated from: as a whole decode makes it.
    #[cfg(test)]
    fn without_encoding(mut self) -> Self {
        self.encoded.clear();
        self.settings_digest = 0;
        self
    }

    /// The host translated before from bytes with this digest, preferring the one at `i`.
    fn host_from(&self, i: usize, digest: u64) -> Option<(&XdsHost, &EncodedHost)> {
        let same = |e: &EncodedHost| e.digest == digest;
        let k = match self.encoded.get(i) {
            Some(e) if same(e) => i,
            _ => self.encoded.iter().position(same)?,
        };
        Some((self.virtual_hosts.get(k)?, &self.encoded[k]))
    }

    /// A digest of what the table says besides its virtual hosts (0 when it came whole).
    pub(crate) fn settings_digest(&self) -> u64 {
        self.settings_digest
    }

    /// The `headers` filter's listener entry, when the routes change headers at any level.
    pub(crate) fn headers_filter(&self) -> Option<&RawHeaderRules> {
        self.headers.as_ref()
    }

    /// The virtual hosts as the config file writes them: routes to clusters not in `ready`
    /// answer 503, and a route to an HTTP/1.1 cluster (`ready`'s `true`) allows the
    /// listener's `upgrades`. Envoy applies those to every route and fails an upgrade to an
    /// HTTP/2 cluster per request; here such a route does not offer any. Settings for a
    /// filter not in the listener's `chain` (the filters' names) are dropped, as Envoy
    /// ignores the settings of a filter it does not run.
    pub(crate) fn section(
        &self,
        ready: &dyn crate::cluster::xds::ReadyClusters,
        upgrades: &[String],
        chain: &[&str],
        memo: Option<&mut crate::route::memo::ChainMemo>,
    ) -> Vec<RawVirtualHost> {
        let mut hosts: Vec<RawVirtualHost> = match memo {
            None => (self.virtual_hosts.iter())
                .map(|h| RawVirtualHost {
                    routes: (h.routes.iter())
                        .map(|r| section_route(r, ready, upgrades, chain).into_owned())
                        .collect(),
                    ..h.host.clone()
                })
                .collect(),
            // Each route is handed over in its cell: the check finds it there, or what it
            // was checked into before.
            Some(memo) => {
                let all = self.virtual_hosts.iter().flat_map(|h| h.routes.iter());
                let section = |r| section_route(r, ready, upgrades, chain);
                let mut cells = memo.cells(all, section).into_iter();
                (self.virtual_hosts.iter())
                    .map(|h| RawVirtualHost {
                        remembered: cells.by_ref().take(h.routes.len()).collect(),
                        ..h.host.clone()
                    })
                    .collect()
            }
        };
        for host in &mut hosts {
            retain_filters(&mut host.filters, chain);
        }
        // Envoy takes a configuration with no hosts, or a host with no routes, and answers
        // 404 for what they do not route; so does a catch-all 404 here.
        if hosts.is_empty() {
            hosts.push(RawVirtualHost {
                name: "no_routes".into(),
                domains: vec!["*".into()],
                retry_policy: None,
                include_request_attempt_count: None,
                include_attempt_count_in_response: None,
                filters: None,
                rate_limits: Vec::new(),
                routes: Vec::new(),
                remembered: Vec::new(),
            });
        }
        for host in (hosts.iter_mut()).filter(|h| h.routes.is_empty() && h.remembered.is_empty()) {
            host.routes.push(not_found());
        }
        hosts
    }
}

/// Settings for filters not in the listener's `chain` dropped.
fn retain_filters(filters: &mut Option<Box<RawRouteFilters>>, chain: &[&str]) {
    if let Some(f) = filters {
        f.retain(chain);
    }
    if filters.as_ref().is_some_and(|f| f.is_empty()) {
        *filters = None;
    }
}

/// A route as its listener serves it (see [`XdsRoutes::section`]): borrowed as it is when
/// the section changes nothing in it (most routes), so that a memo keeps no copy of it.
fn section_route<'r>(
    route: &'r RawRoute,
    ready: &dyn crate::cluster::xds::ReadyClusters,
    upgrades: &[String],
    chain: &[&str],
) -> Cow<'r, RawRoute> {
    let mut route = Cow::Borrowed(route);
    let dropped = |filters: &RawRouteFilters| !filters.only_of(chain) || filters.is_empty();
    if route.filters.as_deref().is_some_and(dropped) {
        retain_filters(&mut route.to_mut().filters, chain);
    }
    // A copy for a cluster not there is not sent (Envoy's shadow fails quietly).
    // (One a request header names is looked up per request.)
    let there = |cluster: &str, by_header: bool| by_header || ready.http1(cluster).is_some();
    let mirrored = |m: &crate::RawMirrorPolicy| there(&m.cluster, m.cluster_header.is_some());
    if !route.request_mirror_policies.iter().all(mirrored) {
        route.to_mut().request_mirror_policies.retain(mirrored);
    }
    // Of a split, the clusters that are there share its traffic.
    let side = |c: &crate::RawWeightedCluster| there(&c.cluster, c.cluster_header.is_some());
    if route
        .weighted_clusters
        .as_ref()
        .is_some_and(|split| !split.iter().all(side))
        && let Some(split) = &mut route.to_mut().weighted_clusters
    {
        split.retain(side);
    }
    let clusters: Vec<&str> = match (&route.cluster, &route.weighted_clusters) {
        (Some(cluster), _) => vec![cluster.as_str()],
        (None, Some(split)) => (split.iter())
            .filter(|c| c.cluster_header.is_none())
            .map(|c| c.cluster.as_str())
            .collect(),
        // The listener's upgrades are offered as for an HTTP/1.1 cluster: one to a
        // cluster speaking HTTP/2 fails there, as in Envoy.
        (None, None) if route.cluster_header.is_some() => Vec::new(),
        (None, None) => return route,
    };
    let by_header = route.cluster_header.is_some()
        || (route.weighted_clusters.iter().flatten()).any(|c| c.cluster_header.is_some());
    let known: Vec<bool> = clusters.iter().filter_map(|c| ready.http1(c)).collect();
    if (known.is_empty() && !by_header) || known.len() < clusters.len() {
        return Cow::Owned(RawRoute {
            matcher: route.matcher.clone(),
            filters: route.filters.clone(),
            metadata: route.metadata.clone(),
            tracing: route.tracing.clone(),
            decorator: route.decorator.clone(),
            direct_response: Some(cluster_not_found(route.cluster_not_found_status)),
            ..Default::default()
        });
    }
    let http1 = known.iter().all(|&http1| http1);
    let terminated = |c: &crate::ConnectMode| *c == crate::ConnectMode::Terminate;
    if !http1 && (!route.upgrades.is_empty() || !route.connect.as_ref().is_none_or(terminated)) {
        // The route's own upgrade_configs too: Envoy takes them and fails each
        // upgrade to an HTTP/2 cluster; here they are not offered. A terminated
        // CONNECT speaks TCP to the host, whatever its HTTP.
        let route = route.to_mut();
        route.upgrades.clear();
        route.connect = route.connect.filter(terminated);
    }
    for upgrade in upgrades.iter().filter(|_| http1) {
        if upgrade == "connect" {
            // The route's own CONNECT setting wins over the listener's.
            if route.connect.is_none() {
                route.to_mut().connect = Some(crate::ConnectMode::Forward);
            }
            continue;
        }
        if !route.upgrades.contains(upgrade) {
            route.to_mut().upgrades.push(upgrade.clone());
        }
    }
    route
}

/// A route's or host's `filters:`: its `typed_per_filter_config` entries and the headers
/// filter's rules, if it has them.
fn filters(
    per_filter: Option<RawRouteFilters>,
    headers: Option<RawHeaderRules>,
) -> Option<Box<RawRouteFilters>> {
    if per_filter.is_none() && headers.is_none() {
        return None;
    }
    let mut filters = per_filter.unwrap_or_default();
    filters.headers = headers.map(RawPerRoute::Settings);
    Some(Box::new(filters))
}

/// A route that answers 404 to everything.
fn not_found() -> RawRoute {
    RawRoute {
        matcher: RawMatch {
            prefix: Some("/".into()),
            ..Default::default()
        },
        direct_response: Some(RawDirectResponse {
            status: 404,
            body: bytes::Bytes::new(),
        }),
        ..Default::default()
    }
}

/// A virtual host (without its routes) and its routes; with, per route, where it is among
/// the host's translated routes.
fn virtual_host(
    mut host: VirtualHost,
    routes: Vec<RouteInput<'_>>,
    at: &str,
) -> Result<(XdsHost, Places), ResourceError> {
    let name = std::mem::take(&mut host.name);
    let domains = std::mem::take(&mut host.domains);
    let retry_policy = host
        .retry_policy
        .take()
        .map(|r| retry(r, &format!("{at}.retry_policy")))
        .transpose()?;
    host.metadata = None;
    let (per_filter, host_cors) =
        route_filters(std::mem::take(&mut host.typed_per_filter_config), at, None)?;
    let headers = xds_headers::rules(
        Lists {
            request_add: std::mem::take(&mut host.request_headers_to_add),
            request_remove: std::mem::take(&mut host.request_headers_to_remove),
            response_add: std::mem::take(&mut host.response_headers_to_add),
            response_remove: std::mem::take(&mut host.response_headers_to_remove),
        },
        at,
    )?;
    // Statistics per request class only (Envoy's `vhost.*.vcluster.*` counters, not kept
    // here): nothing a request meets.
    host.virtual_clusters.clear();
    let rate_limits = crate::filters::rate_limit_actions::xds::staged(
        std::mem::take(&mut host.rate_limits),
        &format!("{at}.rate_limits"),
    )?;
    let include_request_attempt_count =
        Some(std::mem::take(&mut host.include_request_attempt_count));
    let include_attempt_count_in_response =
        Some(std::mem::take(&mut host.include_attempt_count_in_response));
    nothing_else(&host, fields::VIRTUAL_HOST, at)?;
    let mut translated = Vec::with_capacity(routes.len());
    let mut places = Vec::with_capacity(routes.len());
    for (i, input) in routes.into_iter().enumerate() {
        let route = match input {
            RouteInput::Decoded(r) => self::route(
                *r,
                host_cors.as_ref(),
                &FieldPath::from(at).item("routes", i),
            )?
            .map(Arc::new),
            RouteInput::Kept(r) => r.map(Arc::clone),
        };
        places.push(route.as_ref().map(|_| translated.len()));
        translated.extend(route);
    }
    let host = RawVirtualHost {
        name,
        domains,
        retry_policy,
        include_request_attempt_count,
        include_attempt_count_in_response,
        filters: filters(per_filter, headers),
        rate_limits,
        routes: Vec::new(),
        remembered: Vec::new(),
    };
    Ok((
        XdsHost {
            host,
            routes: translated,
        },
        places,
    ))
}

/// A RouteConfiguration's parts, decoded where their bytes are new.
struct Parts<'a> {
    config: RouteConfiguration,
    /// A digest of the configuration's bytes without its virtual hosts.
    settings_digest: u64,
    hosts: Vec<HostParts<'a>>,
}

/// A virtual host without its routes, the digest of its bytes, and its routes with theirs.
struct HostParts<'a> {
    host: VirtualHost,
    digest: u64,
    routes: Vec<(u64, RouteInput<'a>)>,
}

impl<'a> Parts<'a> {
    /// `None` when a part is malformed. Every new part is decoded before anything is
    /// translated, as when the whole message is decoded at once.
    fn decode(encoded: &[u8], held: impl FnOnce(&str) -> Option<&'a XdsRoutes>) -> Option<Self> {
        use crate::envoy::wire::split;
        use prost::Message;
        const VIRTUAL_HOSTS: u32 = 2;
        const ROUTES: u32 = 3;
        let top = split(encoded, VIRTUAL_HOSTS)?;
        let config = RouteConfiguration::decode(top.rest.as_slice()).ok()?;
        let before = held(&config.name);
        let mut hosts = Vec::with_capacity(top.parts.len());
        for (i, encoded_host) in top.parts.iter().enumerate() {
            let parts = split(encoded_host, ROUTES)?;
            let host_digest = crate::envoy::digest(&parts.rest);
            let host = VirtualHost::decode(parts.rest.as_slice()).ok()?;
            let kept = before.and_then(|b| b.host_from(i, host_digest));
            // By digest, made when a route is not where it was.
            let mut by_digest: Option<DigestMap<Option<usize>>> = None;
            let mut routes = Vec::with_capacity(parts.parts.len());
            for (j, encoded_route) in parts.parts.iter().enumerate() {
                let digest = crate::envoy::digest(encoded_route);
                let place = kept.and_then(|(raw, encoded)| {
                    let place = match encoded.routes.get(j) {
                        Some(&(d, place)) if d == digest => place,
                        _ => *by_digest
                            .get_or_insert_with(|| encoded.routes.iter().copied().collect())
                            .get(&digest)?,
                    };
                    match place {
                        None => Some(None),
                        // A place not there (never, as the places are made with the routes)
                        // decodes the route again.
                        Some(k) => raw.routes.get(k).map(Some),
                    }
                });
                let input = match place {
                    Some(route) => RouteInput::Kept(route),
                    None => RouteInput::Decoded(Box::new(Route::decode(*encoded_route).ok()?)),
                };
                routes.push((digest, input));
            }
            hosts.push(HostParts {
                host,
                digest: host_digest,
                routes,
            });
        }
        Some(Self {
            config,
            settings_digest: crate::envoy::digest(&top.rest),
            hosts,
        })
    }

    fn translate(self) -> Result<XdsRoutes, ResourceError> {
        let mut digests = Vec::with_capacity(self.hosts.len());
        let hosts = (self.hosts.into_iter())
            .map(
                |HostParts {
                     host,
                     digest,
                     routes,
                 }| {
                    let (route_digests, inputs): (Vec<u64>, Vec<_>) = routes.into_iter().unzip();
                    digests.push((digest, route_digests));
                    (host, inputs)
                },
            )
            .collect();
        let (mut translated, places) = XdsRoutes::translate_hosts(self.config, hosts, None)?;
        translated.settings_digest = self.settings_digest;
        translated.encoded = (digests.into_iter().zip(places))
            .map(|((digest, routes), places)| EncodedHost {
                digest,
                routes: routes.into_iter().zip(places).collect(),
            })
            .collect();
        Ok(translated)
    }
}

/// `host_cors`: the virtual host's CORS policy, whose fields the route's may leave empty.
/// `None` for a route whose path can never match (a path or prefix without its leading `/`,
/// which Envoy takes and never matches): it is left out, which changes nothing.
fn route(
    mut r: Route,
    host_cors: Option<&CorsPolicy>,
    at: &FieldPath<'_>,
) -> Result<Option<RawRoute>, ResourceError> {
    #[cfg(test)]
    TRANSLATED.with(|n| n.set(n.get() + 1));
    let matcher = matcher(r.r#match.take().unwrap_or_default(), &at.field("match"))?;
    let action = r.action.take();
    r.name.clear();
    // Its filter metadata, which an authorization filter may send (typed metadata is read
    // by no filter here).
    let metadata = r.metadata.take().and_then(|m| {
        let namespaces: std::collections::BTreeMap<String, serde_json::Value> = (m.filter_metadata)
            .iter()
            .map(|(namespace, s)| {
                let fields = s.fields.iter();
                let object = fields.map(|(k, v)| (k.clone(), crate::envoy::json(v)));
                (
                    namespace.clone(),
                    serde_json::Value::Object(object.collect()),
                )
            })
            .collect();
        (!namespaces.is_empty()).then_some(namespaces)
    });
    let decorator = r.decorator.take().map(|d| crate::tracing::RawDecorator {
        operation: d.operation,
        propagate: d.propagate.map(|b| b.value),
    });
    r.stat_prefix.clear();
    let tracing = r
        .tracing
        .take()
        .map(|t| crate::tracing::xds::route_tracing(t, &at.to_string()).map(Box::new))
        .transpose()?;
    let (per_filter, _) = route_filters(
        std::mem::take(&mut r.typed_per_filter_config),
        at,
        host_cors,
    )?;
    let headers = xds_headers::rules(
        Lists {
            request_add: std::mem::take(&mut r.request_headers_to_add),
            request_remove: std::mem::take(&mut r.request_headers_to_remove),
            response_add: std::mem::take(&mut r.response_headers_to_add),
            response_remove: std::mem::take(&mut r.response_headers_to_remove),
        },
        at,
    )?;
    nothing_else(&r, fields::ROUTE, at)?;
    let mut raw = RawRoute {
        matcher,
        metadata,
        tracing,
        decorator,
        filters: filters(per_filter, headers),
        ..Default::default()
    };
    match action {
        Some(route::Action::Route(action)) => forward(action, &mut raw, &at.field("route"))?,
        Some(route::Action::DirectResponse(direct)) => {
            raw.direct_response = Some(direct_response(direct, &format!("{at}.direct_response"))?);
        }
        Some(route::Action::Redirect(redirect)) => {
            raw.redirect = Some(Box::new(route_action::redirect(
                redirect,
                &format!("{at}.redirect"),
            )?));
        }
        _ => {
            return Err(ResourceError::Unsupported {
                at: at.to_string(),
                fields: vec!["action (route, redirect and direct_response only)".into()],
            });
        }
    }
    let never = |p: &Option<String>| p.as_ref().is_some_and(|p| !p.starts_with('/'));
    let m = &raw.matcher;
    if never(&m.prefix) || never(&m.path) || never(&m.path_separated_prefix) {
        return Ok(None);
    }
    Ok(Some(raw))
}

fn matcher(mut m: RouteMatch, at: &FieldPath<'_>) -> Result<RawMatch, ResourceError> {
    let (mut prefix, mut path, mut regex, mut separated) = (None, None, None, None);
    let mut connect = None;
    match m.path_specifier.take() {
        Some(route_match::PathSpecifier::ConnectMatcher(_)) => connect = Some(true),
        Some(route_match::PathSpecifier::Prefix(p)) => prefix = Some(p),
        Some(route_match::PathSpecifier::Path(p)) => path = Some(p),
        Some(route_match::PathSpecifier::SafeRegex(r)) => regex = Some(matchers::regex(r)),
        Some(route_match::PathSpecifier::PathSeparatedPrefix(p)) => separated = Some(p),
        _ => {
            return Err(ResourceError::Unsupported {
                at: at.to_string(),
                fields: vec![
                    "path_specifier (prefix, path, safe_regex, path_separated_prefix and connect_matcher only)"
                        .into(),
                ],
            });
        }
    }
    let case_sensitive = m.case_sensitive.take().map(|c| c.value);
    let headers = std::mem::take(&mut m.headers)
        .into_iter()
        .enumerate()
        .map(|(i, h)| matchers::header(h, &format!("{at}.headers[{i}]")))
        .collect::<Result<_, _>>()?;
    let query_parameters = std::mem::take(&mut m.query_parameters)
        .into_iter()
        .enumerate()
        .map(|(i, q)| {
            crate::envoy::matchers::query_parameter(q, &format!("{at}.query_parameters[{i}]"))
        })
        .collect::<Result<_, _>>()?;
    let cookies = std::mem::take(&mut m.cookies)
        .into_iter()
        .enumerate()
        .map(|(i, c)| cookie(c, &format!("{at}.cookies[{i}]")))
        .collect::<Result<_, _>>()?;
    nothing_else(&m, fields::ROUTE_MATCH, at)?;
    Ok(RawMatch {
        host: None,
        prefix: prefix.filter(|p| !p.is_empty()).or_else(|| {
            (path.is_none() && regex.is_none() && separated.is_none() && connect.is_none())
                .then(|| "/".into())
        }),
        connect,
        path,
        regex,
        path_separated_prefix: separated,
        case_sensitive,
        headers,
        query_parameters,
        cookies,
    })
}

/// A `CookieMatcher`: its string match (required) and `invert_match`.
fn cookie(c: CookieMatcher, at: &str) -> Result<RawCookieMatch, ResourceError> {
    let string_match = c
        .string_match
        .ok_or_else(|| ResourceError::invalid(at, "expected a string_match"))?;
    let m = matchers::string_match(c.name, string_match, &format!("{at}.string_match"))?;
    Ok(RawCookieMatch {
        name: m.name,
        exact: m.exact,
        prefix: m.prefix,
        suffix: m.suffix,
        contains: m.contains,
        regex: m.regex,
        invert: Some(c.invert_match),
    })
}

fn forward(
    mut a: RouteAction,
    raw: &mut RawRoute,
    at: &FieldPath<'_>,
) -> Result<(), ResourceError> {
    match a.cluster_specifier.take() {
        Some(action::ClusterSpecifier::Cluster(name)) => raw.cluster = Some(name),
        Some(action::ClusterSpecifier::ClusterHeader(header)) => raw.cluster_header = Some(header),
        Some(action::ClusterSpecifier::WeightedClusters(weighted)) => {
            let (clusters, random_value_header, use_hash_policy) =
                route_action::weighted_clusters(weighted, &format!("{at}.weighted_clusters"))?;
            raw.weighted_clusters = Some(clusters);
            raw.random_value_header = random_value_header;
            raw.use_hash_policy = Some(use_hash_policy).filter(|u| *u);
        }
        _ => {
            return Err(ResourceError::Unsupported {
                at: at.to_string(),
                fields: vec![
                    "cluster_specifier (a cluster by name or by header, or weighted_clusters)"
                        .into(),
                ],
            });
        }
    }
    raw.rate_limits = crate::filters::rate_limit_actions::xds::staged(
        std::mem::take(&mut a.rate_limits),
        &at.field("rate_limits"),
    )?;
    #[allow(deprecated)]
    {
        raw.include_vh_rate_limits = a
            .include_vh_rate_limits
            .take()
            .map(|b| b.value)
            .filter(|b| *b);
    }
    raw.prefix_rewrite = Some(std::mem::take(&mut a.prefix_rewrite)).filter(|p| !p.is_empty());
    raw.regex_rewrite = a
        .regex_rewrite
        .take()
        .map(|r| route_action::regex_rewrite(r, &format!("{at}.regex_rewrite")).map(Box::new))
        .transpose()?;
    raw.request_mirror_policies =
        route_action::mirrors(std::mem::take(&mut a.request_mirror_policies), at)?;
    raw.hash_policy = crate::hash_policy::xds::hash_policy(std::mem::take(&mut a.hash_policy), at)?;
    if raw.hash_policy.is_empty() {
        // Nothing to hash: Envoy draws such a split at random.
        raw.use_hash_policy = None;
    }
    raw.timeout = match duration(a.timeout.take(), &at.field("timeout"))? {
        Some(t) if t.is_zero() => Some(crate::envoy::NO_TIMEOUT),
        other => other,
    };
    // `0s` turns the stream's idle timer off for the route, the listener's too.
    raw.idle_timeout = match duration(a.idle_timeout.take(), &at.field("idle_timeout"))? {
        Some(t) if t.is_zero() => Some(crate::envoy::NO_TIMEOUT),
        other => other,
    };
    // gRPC's own deadline: the deprecated `max_grpc_timeout` (Istio's) or its successor.
    #[allow(deprecated)]
    let legacy = a.max_grpc_timeout.take();
    raw.grpc_timeout_header_max = duration(legacy, &at.field("max_grpc_timeout"))?;
    if let Some(mut stream) = a.max_stream_duration.take() {
        let at = format!("{at}.max_stream_duration");
        if let Some(max) = duration(
            stream.grpc_timeout_header_max.take(),
            &format!("{at}.grpc_timeout_header_max"),
        )? {
            raw.grpc_timeout_header_max = Some(max);
        }
        // `0s`: no limit for the route's streams, whatever the connection manager's.
        raw.max_stream_duration = duration(
            stream.max_stream_duration.take(),
            &format!("{at}.max_stream_duration"),
        )?;
        // With both, Envoy bounds the stream by the `grpc-timeout` (capped) instead: not done
        // here, where `grpc-timeout` bounds the wait for the response.
        if raw.max_stream_duration.is_some_and(|d| !d.is_zero())
            && raw.grpc_timeout_header_max.is_some()
        {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![
                    "grpc_timeout_header_max with a max_stream_duration (one or the other)".into(),
                ],
            });
        }
        nothing_else(&stream, fields::MAX_STREAM_DURATION, &at)?;
    }
    match a.host_rewrite_specifier.take() {
        None => {}
        Some(action::HostRewriteSpecifier::HostRewriteLiteral(host)) => {
            raw.host_rewrite = Some(host)
        }
        Some(action::HostRewriteSpecifier::HostRewriteHeader(header)) => {
            raw.host_rewrite_header = Some(header.to_ascii_lowercase())
        }
        Some(action::HostRewriteSpecifier::HostRewritePathRegex(r)) => {
            raw.host_rewrite_path_regex = Some(Box::new(super::xds_actions::regex_rewrite(
                r,
                &format!("{at}.host_rewrite_path_regex"),
            )?))
        }
        Some(action::HostRewriteSpecifier::AutoHostRewrite(auto)) => {
            raw.auto_host_rewrite = Some(auto.value).filter(|on| *on);
        }
        Some(action::HostRewriteSpecifier::HostRewrite(_)) => {
            return Err(ResourceError::Unsupported {
                at: at.to_string(),
                fields: vec!["host_rewrite (a formatted host)".into()],
            });
        }
    }
    // Acts on a host rewrite only, as Envoy's.
    let rewrites = raw.host_rewrite.is_some()
        || raw.host_rewrite_header.is_some()
        || raw.host_rewrite_path_regex.is_some()
        || raw.auto_host_rewrite.is_some();
    raw.append_x_forwarded_host =
        Some(std::mem::take(&mut a.append_x_forwarded_host)).filter(|append| *append && rewrites);
    raw.retry_policy = a
        .retry_policy
        .take()
        .map(|r| retry(r, &format!("{at}.retry_policy")).map(Box::new))
        .transpose()?;
    for (i, upgrade) in std::mem::take(&mut a.upgrade_configs)
        .into_iter()
        .enumerate()
    {
        let at = format!("{at}.upgrade_configs[{i}]");
        if upgrade.enabled.is_some_and(|e| !e.value) {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec!["enabled: false".into()],
            });
        }
        if !upgrade.upgrade_type.eq_ignore_ascii_case("CONNECT") {
            if upgrade.connect_config.is_some() {
                return Err(ResourceError::invalid(
                    at,
                    "connect_config is for the CONNECT upgrade_type only",
                ));
            }
            raw.upgrades.push(upgrade.upgrade_type.to_ascii_lowercase());
            continue;
        }
        raw.connect = Some(match upgrade.connect_config {
            None => crate::ConnectMode::Forward,
            Some(config) => {
                let mut refused = Vec::new();
                if config.proxy_protocol_config.is_some() {
                    refused.push("proxy_protocol_config".to_owned());
                }
                if config.allow_post {
                    refused.push("allow_post".to_owned());
                }
                if !refused.is_empty() {
                    return Err(ResourceError::Unsupported {
                        at: format!("{at}.connect_config"),
                        fields: refused,
                    });
                }
                crate::ConnectMode::Terminate
            }
        });
    }
    raw.internal_redirect = route_action::internal_redirect(&mut a, at)?.map(Box::new);
    raw.cluster_not_found_status = match std::mem::take(&mut a.cluster_not_found_response_code) {
        0 => None,
        1 => Some(404),
        2 => Some(500),
        other => {
            return Err(ResourceError::invalid(
                format!("{at}.cluster_not_found_response_code"),
                format!("unknown code {other}"),
            ));
        }
    };
    nothing_else(&a, fields::ROUTE_ACTION, at)
}

fn retry_on_has(retry_on: &[String], condition: &str) -> bool {
    retry_on.iter().any(|c| c == condition)
}

fn retry(
    mut r: envoy_types::pb::envoy::config::route::v3::RetryPolicy,
    at: &str,
) -> Result<RawRetryPolicy, ResourceError> {
    let retry_on = crate::envoy::retry_conditions(&std::mem::take(&mut r.retry_on));
    let retry_back_off = match r.retry_back_off.take() {
        None => None,
        Some(b) => Some(crate::envoy::retry_back_off(
            b.base_interval,
            b.max_interval,
            at,
        )?),
    };
    // Envoy's hosts predicates: `previous_hosts` only.
    let mut previous_hosts = false;
    for (i, predicate) in std::mem::take(&mut r.retry_host_predicate)
        .into_iter()
        .enumerate()
    {
        let typed = match &predicate.config_type {
            Some(envoy_types::pb::envoy::config::route::v3::retry_policy::retry_host_predicate::ConfigType::TypedConfig(any)) => any.type_url.as_str(),
            None => "",
        };
        if predicate.name == "envoy.retry_host_predicates.previous_hosts"
            || typed
                .ends_with("envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate")
        {
            previous_hosts = true;
        } else {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.retry_host_predicate[{i}]"),
                fields: vec![format!("retry host predicate `{}`", predicate.name)],
            });
        }
    }
    // Envoy picks again this many times (1 when unset) before taking a host tried already.
    let reattempts = std::mem::take(&mut r.host_selection_retry_max_attempts);
    let reattempts = if reattempts <= 0 {
        1
    } else {
        reattempts.min(16) as u32
    };
    // Envoy's `previous_priorities`: retries leave out the priority levels tried.
    let mut previous_priorities = None;
    if let Some(priority) = r.retry_priority.take() {
        use envoy_types::pb::envoy::config::route::v3::retry_policy::retry_priority::ConfigType;
        use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
        let at = format!("{at}.retry_priority");
        let Some(ConfigType::TypedConfig(any)) = &priority.config_type else {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![format!("retry priority `{}`", priority.name)],
            });
        };
        if !any.type_url.ends_with(
            "envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig",
        ) {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![format!("retry priority `{}`", priority.name)],
            });
        }
        let config: PreviousPrioritiesConfig = prost::Message::decode(any.value.as_slice())
            .map_err(|e| ResourceError::invalid(&at, format!("cannot decode: {e}")))?;
        if config.update_frequency <= 0 {
            return Err(ResourceError::invalid(
                format!("{at}.update_frequency"),
                "expected at least 1",
            ));
        }
        previous_priorities = Some(config.update_frequency as u32);
    }
    let headers = |list: Vec<envoy_types::pb::envoy::config::route::v3::HeaderMatcher>,
                   key: &str| {
        list.into_iter()
            .enumerate()
            .map(|(i, h)| matchers::header(h, &format!("{at}.{key}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
    };
    let mut retriable_headers = headers(
        std::mem::take(&mut r.retriable_headers),
        "retriable_headers",
    )?;
    // Read only under the `retriable-headers` condition, in Envoy as here.
    if !retry_on_has(&retry_on, "retriable-headers") {
        retriable_headers.clear();
    }
    let retriable_request_headers = headers(
        std::mem::take(&mut r.retriable_request_headers),
        "retriable_request_headers",
    )?;
    let raw = RawRetryPolicy {
        retriable_headers,
        retriable_request_headers,
        retry_back_off,
        previous_hosts: Some(previous_hosts),
        host_selection_retry_max_attempts: Some(reattempts),
        previous_priorities,
        retry_on,
        num_retries: r.num_retries.take().map(|v| v.value),
        // `0s` is none in Envoy: each try has the route's timeout.
        per_try_timeout: duration(r.per_try_timeout.take(), &format!("{at}.per_try_timeout"))?
            .filter(|t| !t.is_zero()),
        retriable_status_codes: std::mem::take(&mut r.retriable_status_codes)
            .into_iter()
            .map(|code| {
                u16::try_from(code).map_err(|_| {
                    ResourceError::invalid(
                        format!("{at}.retriable_status_codes"),
                        format!("{code} is not a status"),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
    };
    nothing_else(&r, fields::RETRY_POLICY, at)?;
    Ok(raw)
}

fn direct_response(
    mut d: DirectResponseAction,
    at: &str,
) -> Result<RawDirectResponse, ResourceError> {
    // Bodies are bytes: an image is as good as text.
    let body = match d.body.take().and_then(|b| b.specifier) {
        None => bytes::Bytes::new(),
        Some(data_source::Specifier::InlineString(s)) => bytes::Bytes::from(s),
        Some(data_source::Specifier::InlineBytes(b)) => bytes::Bytes::from(b),
        Some(_) => {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.body"),
                fields: vec!["filename / environment_variable (inline bodies only)".into()],
            });
        }
    };
    // A body format without command operators is the body itself (Envoy Gateway's inline
    // responses); one that formats the request, or another content type, is refused.
    let body = match d.body_format.take() {
        None => body,
        Some(format) => crate::envoy::literal_body(format, &format!("{at}.body_format"))?,
    };
    let status = u16::try_from(d.status).map_err(|_| {
        ResourceError::invalid(
            format!("{at}.status"),
            format!("{} is not a status", d.status),
        )
    })?;
    d.status = 0;
    nothing_else(&d, fields::DIRECT_RESPONSE_ACTION, at)?;
    Ok(RawDirectResponse { status, body })
}

/// The answer of a route whose cluster is not (yet) known: 503 unless the route says.
pub(crate) fn cluster_not_found(status: Option<u16>) -> RawDirectResponse {
    RawDirectResponse {
        status: status.unwrap_or(503),
        body: bytes::Bytes::from_static(b"cluster not found\n"),
    }
}
