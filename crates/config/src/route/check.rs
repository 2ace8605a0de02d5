//! Routes and virtual hosts: domains checked (unique across a listener's hosts), routes
//! resolved to their clusters, a host's defaults filled in on its routes.

use std::collections::HashMap;

use http::{HeaderValue, StatusCode};

use crate::field_path::FieldPath;
use crate::matchers::{header_match, pattern, query_match};
use crate::route::check_actions as route_actions;
use crate::values::{name, positive};
use crate::*;

/// What routes are checked against: the clusters they may name and the listener's filters.
pub(crate) struct RouteCtx<'a> {
    pub(crate) cluster_index: &'a crate::cluster::ClusterIndex<'a>,
    pub(crate) clusters: &'a crate::route::memo::Clusters<'a>,
    pub(crate) chain: &'a [ChainFilter],
    /// The listener came from a management server: its names follow control planes'.
    pub(crate) dynamic: bool,
    /// Requests' paths are normalised so before matching: a route path must be too.
    pub(crate) path_normalization: PathNormalization,
}

/// A listener's `routes` (one virtual host for every domain) or its `virtual_hosts`.
pub(crate) fn route_configuration(
    routes: Vec<RawRoute>,
    virtual_hosts: Vec<RawVirtualHost>,
    path: &str,
    ctx: &RouteCtx<'_>,
) -> Result<RouteConfiguration, ConfigError> {
    let mut config = hosts_and_routes(routes, virtual_hosts, path, ctx)?;
    if config.routes.iter().any(|r| names_cluster_by_header(r)) {
        config.cluster_names = std::sync::Arc::new(
            (ctx.cluster_index.iter())
                .map(|(name, &i)| (Box::from(*name), i))
                .collect(),
        );
    }
    Ok(config)
}

/// Whether the route, a side of its split or a mirror picks its cluster by a request header.
fn names_cluster_by_header(route: &RouteConfig) -> bool {
    let RouteAction::Forward(forward) = &route.action else {
        return false;
    };
    let by_header = ClusterTarget::by_request;
    by_header(&forward.cluster)
        || (forward.split.iter()).any(|s| s.clusters.iter().any(|c| by_header(&c.target)))
        || forward.mirrors.iter().any(|m| by_header(&m.cluster))
}

fn hosts_and_routes(
    routes: Vec<RawRoute>,
    virtual_hosts: Vec<RawVirtualHost>,
    path: &str,
    ctx: &RouteCtx<'_>,
) -> Result<RouteConfiguration, ConfigError> {
    match (routes.is_empty(), virtual_hosts.is_empty()) {
        (false, false) => Err(ConfigError::invalid(
            path,
            "expected `routes` (for every host) or `virtual_hosts`, not both",
        )),
        (true, true) => Err(ConfigError::invalid(
            format!("{path}.routes"),
            "expected at least one route (or `virtual_hosts`)",
        )),
        (false, true) => {
            let none = HostDefaults::default();
            let at = FieldPath::from(path);
            let routes = routes
                .into_iter()
                .enumerate()
                .map(|(i, r)| route(r, &at.item("routes", i), ctx, &none).map(std::sync::Arc::new))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(RouteConfiguration::flat(routes))
        }
        (true, false) => {
            // Sized once: a table of thousands of routes is not copied as it grows.
            let count = |h: &RawVirtualHost| h.routes.len() + h.remembered.len();
            let mut routes = Vec::with_capacity(virtual_hosts.iter().map(count).sum());
            let mut hosts = Vec::with_capacity(virtual_hosts.len());
            // Where each domain and name was first seen, to name both in an error.
            let mut domains: HashMap<Domain, usize> = HashMap::new();
            let mut names: HashMap<String, usize> = HashMap::new();
            for (i, raw) in virtual_hosts.into_iter().enumerate() {
                let at = format!("{path}.virtual_hosts[{i}]");
                let host = virtual_host(raw, &at, ctx, &mut routes)?;
                if let Some(first) = names.insert(host.name.clone(), i) {
                    return Err(ConfigError::invalid(
                        format!("{at}.name"),
                        format!(
                            "virtual host `{}` is already defined at {path}.virtual_hosts[{first}]",
                            host.name
                        ),
                    ));
                }
                for (j, domain) in host.domains.iter().enumerate() {
                    if let Some(first) = domains.insert(domain.clone(), i) {
                        return Err(ConfigError::invalid(
                            format!("{at}.domains[{j}]"),
                            format!(
                                "domain `{domain}` is already served by {path}.virtual_hosts[{first}]"
                            ),
                        ));
                    }
                }
                hosts.push(host);
            }
            Ok(RouteConfiguration {
                routes: std::sync::Arc::new(routes),
                virtual_hosts: hosts,
                flat: false,
                ignore_port_in_host_matching: false,
                cluster_names: Default::default(),
            })
        }
    }
}

/// What a virtual host gives the routes that say nothing of their own.
#[derive(Default)]
struct HostDefaults {
    retry_policy: Option<RetryPolicy>,
    /// Per ext_authz filter of the chain (by name), the host's settings.
    ext_authz: Vec<(String, RouteAuthz)>,
    include_attempt_count: bool,
    include_attempt_count_in_response: bool,
}

fn virtual_host(
    raw: RawVirtualHost,
    path: &str,
    ctx: &RouteCtx<'_>,
    routes: &mut Vec<std::sync::Arc<RouteConfig>>,
) -> Result<VirtualHostConfig, ConfigError> {
    let name = if ctx.dynamic {
        crate::values::dynamic_name(raw.name, path)?
    } else {
        name(raw.name, path)?
    };
    if raw.domains.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.domains"),
            "expected at least one domain (`*` for every host)",
        ));
    }
    let domains = raw
        .domains
        .iter()
        .enumerate()
        .map(|(i, d)| domain(d, &format!("{path}.domains[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let retry_policy = raw
        .retry_policy
        .map(|r| retry_policy(r, &format!("{path}.retry_policy")))
        .transpose()?;
    let filters = filters::route_filters(raw.filters, &format!("{path}.filters"), ctx.chain)?;
    let defaults = HostDefaults {
        retry_policy: retry_policy.clone(),
        ext_authz: (ctx.chain.iter())
            .filter(|f| matches!(f.config, crate::HttpFilterConfig::ExtAuthz(_)))
            .map(|f| (f.name.clone(), filters.of_filter(&f.name).ext_authz.clone()))
            .collect(),
        include_attempt_count: raw.include_request_attempt_count.unwrap_or(false),
        include_attempt_count_in_response: raw.include_attempt_count_in_response.unwrap_or(false),
    };
    let rate_limits = crate::filters::rate_limit_actions::staged_rules(
        raw.rate_limits,
        &format!("{path}.rate_limits"),
    )?;
    let start = routes.len();
    // A host has routes of its own or remembered ones, not both.
    let first_remembered = raw.routes.len();
    for (i, r) in raw.routes.into_iter().enumerate() {
        routes.push(std::sync::Arc::new(route(
            r,
            &FieldPath::from(path).item("routes", i),
            ctx,
            &defaults,
        )?));
    }
    for (i, cell) in raw.remembered.iter().enumerate() {
        let at = FieldPath::from(path);
        routes.push(remembered_route(
            cell,
            &at.item("routes", first_remembered + i),
            ctx,
            &defaults,
        )?);
    }
    Ok(VirtualHostConfig {
        name,
        domains,
        routes: start..routes.len(),
        retry_policy,
        filters,
        rate_limits,
    })
}

/// `example.com`, `example.com:8443`, `*.example.com`, `*-eu.example.com`, `example.*` or `*`.
fn domain(value: &str, path: &str) -> Result<Domain, ConfigError> {
    if value == "*" {
        return Ok(Domain::Any);
    }
    let lower = value.to_ascii_lowercase();
    let invalid = || {
        ConfigError::invalid(
            path,
            format!(
                "expected a host name, optionally with `:PORT`, with at most one `*` at its start or end (or `*` alone), found `{value}`"
            ),
        )
    };
    let domain = match lower.matches('*').count() {
        0 => Domain::Exact(lower),
        1 => match (lower.strip_prefix('*'), lower.strip_suffix('*')) {
            (Some(rest), _) => Domain::Suffix(rest.to_string()),
            (_, Some(rest)) => Domain::Prefix(rest.to_string()),
            _ => return Err(invalid()),
        },
        _ => return Err(invalid()),
    };
    let text = match &domain {
        Domain::Exact(t) | Domain::Suffix(t) | Domain::Prefix(t) => t,
        Domain::Any => return Ok(domain),
    };
    let valid = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
    if valid { Ok(domain) } else { Err(invalid()) }
}

/// A route from a management server as checked before against the same clusters, or
/// checked now (see `memo.rs`).
fn remembered_route(
    cell: &crate::route::memo::CheckedCell,
    path: &FieldPath<'_>,
    ctx: &RouteCtx<'_>,
    host: &HostDefaults,
) -> Result<std::sync::Arc<RouteConfig>, ConfigError> {
    let stamp = ctx.clusters.stamp();
    if let Some(checked) = cell.get(stamp) {
        return Ok(checked);
    }
    let checked = std::sync::Arc::new(route(cell.sectioned().clone(), path, ctx, host)?);
    cell.remember(stamp, &checked);
    Ok(checked)
}

fn route(
    raw: RawRoute,
    path: &FieldPath<'_>,
    ctx: &RouteCtx<'_>,
    host: &HostDefaults,
) -> Result<RouteConfig, ConfigError> {
    let RouteCtx {
        cluster_index,
        clusters,
        chain,
        ..
    } = *ctx;
    let clusters = clusters.all;
    let matcher = route_match(raw.matcher, &path.field("match"), &ctx.path_normalization)?;
    if raw.ext_authz.is_some() {
        return Err(ConfigError::invalid(
            format!("{path}.ext_authz"),
            "a route's ext_authz settings go under `filters: { ext_authz: ... }`",
        ));
    }
    let own_authz: Vec<bool> = (host.ext_authz.iter())
        .map(|(name, _)| {
            (raw.filters.as_ref())
                .and_then(|f| f.of_filter(name))
                .is_some_and(|f| f.ext_authz.is_some())
        })
        .collect();
    let mut filters = filters::route_filters(raw.filters, &path.field("filters"), chain)?;
    for ((name, host), own) in host.ext_authz.iter().zip(own_authz) {
        let level = filters.of_filter_mut(name);
        level.ext_authz = if own {
            // Envoy merges context extensions from the host down; the route's win.
            let mut merged: std::collections::BTreeMap<String, String> =
                host.context_extensions.iter().cloned().collect();
            merged.extend(std::mem::take(&mut level.ext_authz.context_extensions));
            RouteAuthz {
                disabled: level.ext_authz.disabled,
                context_extensions: merged.into_iter().collect(),
            }
        } else {
            host.clone()
        };
    }
    filters.drop_empty_instances();
    let forwards =
        raw.cluster.is_some() || raw.cluster_header.is_some() || raw.weighted_clusters.is_some();
    let actions = [
        ("cluster", raw.cluster.is_some()),
        ("cluster_header", raw.cluster_header.is_some()),
        ("weighted_clusters", raw.weighted_clusters.is_some()),
        ("direct_response", raw.direct_response.is_some()),
        ("redirect", raw.redirect.is_some()),
        ("https_redirect", raw.https_redirect == Some(true)),
    ];
    let given: Vec<&str> = actions
        .iter()
        .filter(|(_, set)| *set)
        .map(|(name, _)| *name)
        .collect();
    match given.as_slice() {
        [_] | ["redirect", "https_redirect"] => {}
        [] => {
            return Err(ConfigError::invalid(
                path,
                "expected a `cluster` to forward to (or `cluster_header`, `weighted_clusters`), a \
                 `direct_response` or a `redirect` (or `https_redirect: true`)",
            ));
        }
        [first, second, ..] => {
            return Err(ConfigError::invalid(
                path,
                format!("expected one action: `{first}` or `{second}`, not both"),
            ));
        }
    }
    if !forwards
        && (raw.timeout.is_some()
            || raw.idle_timeout.is_some()
            || raw.host_rewrite.is_some()
            || raw.host_rewrite_header.is_some()
            || raw.host_rewrite_path_regex.is_some()
            || raw.auto_host_rewrite.is_some()
            || raw.append_x_forwarded_host.is_some()
            || raw.grpc_timeout_header_max.is_some()
            || raw.max_stream_duration.is_some()
            || raw.retry_policy.is_some()
            || !raw.upgrades.is_empty()
            || raw.connect.is_some()
            || raw.prefix_rewrite.is_some()
            || raw.regex_rewrite.is_some()
            || !raw.hash_policy.is_empty()
            || !raw.request_mirror_policies.is_empty()
            || raw.internal_redirect.is_some()
            || raw.cluster_not_found_status.is_some())
    {
        return Err(ConfigError::invalid(
            path,
            "`timeout`, `idle_timeout`, `host_rewrite` (and its `_header`, `_path_regex` forms), `append_x_forwarded_host`, `grpc_timeout_header_max`, `max_stream_duration`, `retry_policy`, `upgrades`, `connect`, `prefix_rewrite`, \
             `regex_rewrite`, `hash_policy`, `request_mirror_policies`, `internal_redirect` and `cluster_not_found_status` apply only to routes with a \
             `cluster`, `cluster_header` or `weighted_clusters`",
        ));
    }
    if raw.random_value_header.is_some() && raw.weighted_clusters.is_none() {
        return Err(ConfigError::invalid(
            format!("{path}.random_value_header"),
            "picks one of `weighted_clusters`, which this route has none of",
        ));
    }
    if raw.use_hash_policy == Some(true)
        && (raw.weighted_clusters.is_none() || raw.hash_policy.is_empty())
    {
        return Err(ConfigError::invalid(
            format!("{path}.use_hash_policy"),
            "draws one of `weighted_clusters` by the route's `hash_policy`: the route needs both",
        ));
    }
    if raw.hash_key.is_some() && raw.weighted_clusters.is_none() {
        return Err(ConfigError::invalid(
            format!("{path}.hash_key"),
            "a route's `hash_key` keeps a client on one side of `weighted_clusters`; \
             for hosts, set it on the cluster",
        ));
    }
    let action = if let Some(direct) = raw.direct_response {
        let status = StatusCode::from_u16(direct.status)
            .ok()
            .filter(|s| !s.is_informational())
            .ok_or_else(|| {
                ConfigError::invalid(
                    format!("{path}.direct_response.status"),
                    format!(
                        "expected an HTTP status from 200 to 999, found {}",
                        direct.status
                    ),
                )
            })?;
        RouteAction::DirectResponse {
            status,
            body: direct.body,
        }
    } else if !forwards {
        let at = if raw.redirect.is_some() {
            format!("{path}.redirect")
        } else {
            format!("{path}.https_redirect")
        };
        RouteAction::Redirect(route_actions::redirect(
            raw.redirect.map(|r| *r).unwrap_or_default(),
            raw.https_redirect == Some(true),
            &matcher,
            &at,
        )?)
    } else {
        let (target, cluster_name, split) = match (raw.cluster, raw.weighted_clusters) {
            (Some(cluster), _) => (
                ClusterTarget::Index(route_actions::cluster(
                    &cluster,
                    cluster_index,
                    clusters,
                    &path.field("cluster"),
                )?),
                cluster,
                None,
            ),
            (None, None) if raw.cluster_header.is_some() => (
                route_actions::cluster_header(
                    raw.cluster_header.as_deref().unwrap_or_default(),
                    &format!("{path}.cluster_header"),
                )?,
                String::new(),
                None,
            ),
            (None, weighted) => {
                let split = route_actions::split(
                    weighted.unwrap_or_default(),
                    (
                        raw.hash_key.map(|k| *k),
                        raw.random_value_header,
                        raw.use_hash_policy.unwrap_or(false),
                    ),
                    cluster_index,
                    clusters,
                    chain,
                    &path.to_string(),
                )?;
                // Not read with a split; an index, so that it dumps as nothing.
                let first_named = (split.clusters.iter())
                    .find_map(|c| match c.target {
                        ClusterTarget::Index(i) => Some(i),
                        _ => None,
                    })
                    .unwrap_or_default();
                (
                    ClusterTarget::Index(first_named),
                    String::new(),
                    Some(split),
                )
            }
        };
        let timeout = raw.timeout.unwrap_or(DEFAULT_ROUTE_TIMEOUT);
        if timeout.is_zero() {
            return Err(ConfigError::invalid(
                format!("{path}.timeout"),
                "expected a duration above zero",
            ));
        }
        let rewrites = [
            raw.host_rewrite.is_some(),
            raw.host_rewrite_header.is_some(),
            raw.host_rewrite_path_regex.is_some(),
            raw.auto_host_rewrite == Some(true),
        ];
        if rewrites.iter().filter(|r| **r).count() > 1 {
            return Err(ConfigError::invalid(
                path,
                "expected one of `host_rewrite`, `host_rewrite_header`, `host_rewrite_path_regex` and `auto_host_rewrite`",
            ));
        }
        let host_rewrite = raw
            .host_rewrite
            .map(|h| host_rewrite(&h, &format!("{path}.host_rewrite")))
            .transpose()?;
        let host_rewrite_header = raw
            .host_rewrite_header
            .map(|h| {
                http::HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                    ConfigError::invalid(
                        format!("{path}.host_rewrite_header"),
                        format!("expected a header name, found `{h}`"),
                    )
                })
            })
            .transpose()?;
        let host_rewrite_path_regex = raw
            .host_rewrite_path_regex
            .map(|r| route_actions::regex_rewrite(*r, &format!("{path}.host_rewrite_path_regex")))
            .transpose()?;
        let retry_policy = raw
            .retry_policy
            .map(|r| retry_policy(*r, &format!("{path}.retry_policy")))
            .transpose()?
            .or_else(|| host.retry_policy.clone());
        let upgrades = upgrades(raw.upgrades, &path.field("upgrades"))?;
        // Those named here; one a header names is known per request.
        let targets: Vec<usize> = match &split {
            Some(split) => split.clusters.iter().map(|c| &c.target).collect(),
            None => vec![&target],
        }
        .into_iter()
        .filter_map(|t| match t {
            ClusterTarget::Index(i) => Some(*i),
            _ => None,
        })
        .collect();
        if let Some(&h2) = targets
            .iter()
            .find(|&&i| clusters[i].protocol == UpstreamProtocol::Http2)
            && (!upgrades.is_empty() || raw.connect == Some(ConnectMode::Forward))
        {
            let key = if upgrades.is_empty() {
                "connect"
            } else {
                "upgrades"
            };
            return Err(ConfigError::invalid(
                format!("{path}.{key}"),
                format!(
                    "upgrades and forwarded CONNECTs are relayed over HTTP/1.1 (auto clusters offer it alone then); cluster `{}` speaks HTTP/2",
                    clusters[h2].name
                ),
            ));
        }
        let path_rewrite = route_actions::path_rewrite(
            raw.prefix_rewrite,
            raw.regex_rewrite.map(|r| *r),
            &matcher,
            path,
        )?;
        let mirrors =
            route_actions::mirrors(raw.request_mirror_policies, cluster_index, clusters, path)?;
        let cluster_not_found_status = match raw.cluster_not_found_status {
            None => StatusCode::SERVICE_UNAVAILABLE,
            Some(code) => StatusCode::from_u16(code)
                .ok()
                .filter(|s| s.is_client_error() || s.is_server_error())
                .ok_or_else(|| {
                    ConfigError::invalid(
                        format!("{path}.cluster_not_found_status"),
                        format!("expected a 4xx or 5xx status, found {code}"),
                    )
                })?,
        };
        RouteAction::Forward(Box::new(ForwardAction {
            cluster: target,
            cluster_name,
            cluster_not_found_status,
            split,
            path_rewrite,
            mirrors,
            timeout,
            idle_timeout: raw
                .idle_timeout
                .map(|t| {
                    if t.is_zero() {
                        Err(ConfigError::invalid(
                            format!("{path}.idle_timeout"),
                            "expected a duration above zero",
                        ))
                    } else {
                        Ok(t)
                    }
                })
                .transpose()?,
            host_rewrite,
            host_rewrite_header,
            host_rewrite_path_regex,
            auto_host_rewrite: raw.auto_host_rewrite.unwrap_or(false),
            append_x_forwarded_host: raw.append_x_forwarded_host.unwrap_or(false),
            grpc_timeout_header_max: raw.grpc_timeout_header_max,
            max_stream_duration: raw.max_stream_duration,
            retry_policy,
            hash_policy: crate::hash_policy::hash_policy(
                raw.hash_policy,
                &path.field("hash_policy"),
            )?,
            include_attempt_count: host.include_attempt_count,
            include_attempt_count_in_response: host.include_attempt_count_in_response,
            upgrades,
            connect: raw.connect,
            internal_redirect: raw
                .internal_redirect
                .map(|r| internal_redirect(*r, &format!("{path}.internal_redirect")))
                .transpose()?
                .map(Box::new),
        }))
    };
    let metadata = match raw.metadata {
        None => None,
        Some(namespaces) => {
            let mut checked = RouteMetadata::new();
            for (namespace, value) in namespaces {
                let serde_json::Value::Object(fields) = value else {
                    return Err(ConfigError::invalid(
                        format!("{path}.metadata.{namespace}"),
                        "expected a map",
                    ));
                };
                checked.insert(namespace, fields);
            }
            (!checked.is_empty()).then(|| Box::new(checked))
        }
    };
    let tracing = raw
        .tracing
        .map(|t| crate::tracing::route_tracing(*t, &path.to_string()).map(Box::new))
        .transpose()?;
    let decorator = raw
        .decorator
        .map(|d| crate::tracing::route_decorator(d, &path.to_string()).map(Box::new))
        .transpose()?;
    let rate_limits = crate::filters::rate_limit_actions::staged_rules(
        raw.rate_limits,
        &path.field("rate_limits"),
    )?;
    let include_vh_rate_limits = raw.include_vh_rate_limits.unwrap_or(false);
    Ok(RouteConfig {
        matcher,
        action,
        filters,
        metadata,
        tracing,
        decorator,
        rate_limits: (!rate_limits.is_empty() || include_vh_rate_limits).then(|| {
            Box::new(crate::RouteRateLimitPolicy {
                rate_limits,
                include_vh_rate_limits,
            })
        }),
    })
}

fn route_match(
    raw: RawMatch,
    path: &FieldPath<'_>,
    normalization: &PathNormalization,
) -> Result<RouteMatch, ConfigError> {
    let host = match raw.host {
        None => HostMatch::Any,
        Some(h) if h == "*" => HostMatch::Any,
        Some(h) => {
            let lower = h.to_ascii_lowercase();
            let (suffix, rest) = match lower.strip_prefix('*') {
                Some(rest) if rest.starts_with('.') => (true, rest.to_string()),
                _ => (false, lower.clone()),
            };
            let valid = !rest.is_empty()
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
            if !valid {
                return Err(ConfigError::invalid(
                    format!("{path}.host"),
                    format!("expected a host name or `*.domain`, found `{h}`"),
                ));
            }
            if suffix {
                HostMatch::Suffix(rest)
            } else {
                HostMatch::Exact(rest)
            }
        }
    };
    let case_sensitive = raw.case_sensitive.unwrap_or(true);
    let connect = raw.connect.unwrap_or(false);
    let path_match = match (raw.prefix, raw.path, raw.regex, raw.path_separated_prefix) {
        (None, None, None, None) if connect => PathMatch::Connect,
        _ if connect => {
            return Err(ConfigError::invalid(
                path,
                "`connect` matches CONNECT requests, which have no path: it takes no `prefix`, `path`, `path_separated_prefix` or `regex`",
            ));
        }
        (Some(p), None, None, None) => {
            PathMatch::Prefix(url_path(p, &path.field("prefix"), normalization, true)?)
        }
        (None, Some(p), None, None) => {
            PathMatch::Exact(url_path(p, &path.field("path"), normalization, false)?)
        }
        (None, None, Some(r), None) => {
            PathMatch::Regex(pattern(&r, !case_sensitive, &format!("{path}.regex"))?)
        }
        (None, None, None, Some(p)) => {
            let at = path.field("path_separated_prefix");
            // Envoy's rule: the separator is implied, so the prefix does not end with one.
            if p.ends_with('/') || p.contains(['?', '#']) {
                return Err(ConfigError::invalid(
                    &at,
                    format!("expected a path prefix not ending in `/`, found `{p}`"),
                ));
            }
            PathMatch::SeparatedPrefix(url_path(p, &at, normalization, false)?)
        }
        (None, None, None, None) => {
            return Err(ConfigError::invalid(
                path,
                "expected a `prefix` (e.g. `/`), an exact `path` or a `regex`",
            ));
        }
        _ => {
            return Err(ConfigError::invalid(
                path,
                "expected one of `prefix`, `path`, `path_separated_prefix` or `regex`",
            ));
        }
    };
    let path_match = match path_match {
        _ if case_sensitive => path_match,
        PathMatch::Prefix(p) => PathMatch::Prefix(p.to_ascii_lowercase()),
        PathMatch::Exact(p) => PathMatch::Exact(p.to_ascii_lowercase()),
        PathMatch::SeparatedPrefix(p) => PathMatch::SeparatedPrefix(p.to_ascii_lowercase()),
        other @ (PathMatch::Regex(_) | PathMatch::Connect) => other,
    };
    let mut headers = Vec::new();
    let mut authority = Vec::new();
    for (i, h) in raw.headers.into_iter().enumerate() {
        let at = format!("{path}.headers[{i}]");
        if h.name == ":authority" {
            // The pseudo-header: the host as the client sent it. Checked as a header would be.
            let host = RawHeaderMatch {
                name: "host".into(),
                ..h
            };
            authority.push(header_match(host, &at)?.value);
        } else {
            headers.push(header_match(h, &at)?);
        }
    }
    let query_parameters = raw
        .query_parameters
        .into_iter()
        .enumerate()
        .map(|(i, q)| query_match(q, &format!("{path}.query_parameters[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let cookies = raw
        .cookies
        .into_iter()
        .enumerate()
        .map(|(i, c)| cookie_match(c, &format!("{path}.cookies[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RouteMatch {
        host,
        path: path_match,
        case_sensitive,
        headers,
        authority,
        query_parameters,
        cookies,
    })
}

/// A host to send upstream instead of the client's: it becomes the upstream's `host` or
/// `:authority`, so it must be one.
pub(crate) fn host_rewrite(h: &str, path: &str) -> Result<HeaderValue, ConfigError> {
    h.parse::<http::uri::Authority>()
        .ok()
        .filter(|a| !a.as_str().contains('@'))
        .and_then(|_| HeaderValue::from_str(h).ok())
        .ok_or_else(|| ConfigError::invalid(path, format!("expected a host name, found `{h}`")))
}

fn cookie_match(raw: RawCookieMatch, path: &str) -> Result<CookieMatch, ConfigError> {
    if raw.name.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.name"),
            "expected a cookie name",
        ));
    }
    let as_header = RawHeaderMatch {
        name: raw.name,
        exact: raw.exact,
        prefix: raw.prefix,
        suffix: raw.suffix,
        contains: raw.contains,
        regex: raw.regex,
        present: None,
    };
    let Some(value) = crate::matchers::string_match(&as_header, path)? else {
        return Err(ConfigError::invalid(
            path,
            "expected one of `exact`, `prefix`, `suffix`, `contains` or `regex`",
        ));
    };
    Ok(CookieMatch {
        name: as_header.name,
        value,
        invert: raw.invert.unwrap_or(false),
    })
}

fn url_path(
    value: String,
    path: &FieldPath<'_>,
    normalization: &PathNormalization,
    prefix: bool,
) -> Result<String, ConfigError> {
    if value.starts_with('/') && !value.bytes().any(|b| b.is_ascii_control() || b == b' ') {
        // Requests are matched after normalisation: a path it would change never matches.
        // A prefix's last segment may be the start of a longer one (`/.` for `/.git`,
        // `/..` for `/..data`): a `.` or `..` there is not a dot segment.
        let last = &value[value.rfind('/').map_or(0, |i| i + 1)..];
        let checked = if prefix && matches!(last, "." | "..") {
            &value[..value.len() - last.len()]
        } else {
            value.as_str()
        };
        match crate::path::normalize(checked, normalization) {
            Ok(crate::path::Normalized::Path(std::borrow::Cow::Borrowed(_))) => Ok(value),
            Ok(crate::path::Normalized::Path(std::borrow::Cow::Owned(normal))) => {
                Err(ConfigError::invalid(
                    path,
                    format!(
                        "`{value}` would never match: request paths are normalised first (http.path_normalization); write `{normal}`"
                    ),
                ))
            }
            Ok(crate::path::Normalized::Redirect(_)) | Err(_) => Err(ConfigError::invalid(
                path,
                format!("`{value}` would never match a normalised request path"),
            )),
        }
    } else {
        Err(ConfigError::invalid(
            path,
            format!("expected a path starting with `/`, found `{value}`"),
        ))
    }
}

fn retry_policy(raw: RawRetryPolicy, path: &str) -> Result<RetryPolicy, ConfigError> {
    let on = crate::values::retry_conditions(&raw.retry_on, path)?;
    if on.retriable_status_codes == raw.retriable_status_codes.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.retriable_status_codes"),
            "`retriable_status_codes` and the `retriable-status-codes` condition go together",
        ));
    }
    if on.retriable_headers == raw.retriable_headers.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.retriable_headers"),
            "`retriable_headers` and the `retriable-headers` condition go together",
        ));
    }
    let matches = |list: Vec<RawHeaderMatch>, key: &str| {
        list.into_iter()
            .enumerate()
            .map(|(i, m)| crate::matchers::header_match(m, &format!("{path}.{key}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
    };
    let retriable_headers = matches(raw.retriable_headers, "retriable_headers")?;
    let retriable_request_headers =
        matches(raw.retriable_request_headers, "retriable_request_headers")?;
    if let Some(code) = raw
        .retriable_status_codes
        .iter()
        .find(|c| !(100..=599).contains(*c))
    {
        return Err(ConfigError::invalid(
            format!("{path}.retriable_status_codes"),
            format!("expected status codes from 100 to 599, found {code}"),
        ));
    }
    let per_try_timeout = raw
        .per_try_timeout
        .map(|t| positive(t, &format!("{path}.per_try_timeout")))
        .transpose()?;
    let back_off =
        crate::values::retry_back_off(raw.retry_back_off, DEFAULT_RETRY_BASE_INTERVAL, path)?;
    if raw.previous_priorities == Some(0) {
        return Err(ConfigError::invalid(
            format!("{path}.previous_priorities"),
            "expected an update frequency of at least 1",
        ));
    }
    let previous_priorities = raw.previous_priorities;
    Ok(RetryPolicy {
        retry_on: on,
        // Envoy's default.
        num_retries: raw.num_retries.unwrap_or(1),
        per_try_timeout,
        retriable_status_codes: raw.retriable_status_codes,
        back_off,
        // The file's default: a retry avoids the hosts tried, picking up to 3 times more.
        previous_hosts: raw.previous_hosts.unwrap_or(true),
        host_selection_attempts: 1 + raw.host_selection_retry_max_attempts.unwrap_or(3).min(16),
        previous_priorities,
        retriable_headers,
        retriable_request_headers,
    })
}

/// A route's `internal_redirect`: Envoy's defaults (one redirect, 302 only).
fn internal_redirect(
    raw: RawInternalRedirect,
    path: &str,
) -> Result<InternalRedirectPolicy, ConfigError> {
    let codes = if raw.redirect_response_codes.is_empty() {
        vec![302]
    } else {
        raw.redirect_response_codes
    };
    if let Some(code) = codes
        .iter()
        .find(|c| ![301, 302, 303, 307, 308].contains(*c))
    {
        return Err(ConfigError::invalid(
            format!("{path}.redirect_response_codes"),
            format!("expected 301, 302, 303, 307 or 308, found {code}"),
        ));
    }
    let response_headers_to_copy = (raw.response_headers_to_copy.iter())
        .map(|name| {
            let header =
                route_actions::header_name(name, &format!("{path}.response_headers_to_copy"))?;
            // The request's own framing and host are the proxy's to set.
            if crate::values::framing_or_host(&header) {
                return Err(ConfigError::invalid(
                    format!("{path}.response_headers_to_copy"),
                    format!("`{name}` may not be copied onto a request"),
                ));
            }
            Ok(header)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(InternalRedirectPolicy {
        max_internal_redirects: raw.max_internal_redirects.unwrap_or(1),
        redirect_response_codes: codes,
        allow_cross_scheme_redirect: raw.allow_cross_scheme_redirect.unwrap_or(false),
        previous_routes: raw.previous_routes.unwrap_or(false),
        safe_cross_scheme: raw.safe_cross_scheme.unwrap_or(false),
        response_headers_to_copy,
    })
}

/// Protocols a route lets clients upgrade to (`Upgrade: websocket`), lowercase tokens.
fn upgrades(raw: Vec<String>, path: &FieldPath<'_>) -> Result<Vec<String>, ConfigError> {
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let mut out: Vec<String> = Vec::with_capacity(raw.len());
    for (i, token) in raw.into_iter().enumerate() {
        let lower = token.to_ascii_lowercase();
        // A protocol as `Upgrade` names it (RFC 9110 section 7.8): a token, and a version
        // after `/` if the route names one (`spdy/3.1`).
        let is_token = |t: &str| {
            !t.is_empty()
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
        };
        let valid = match lower.split_once('/') {
            None => is_token(&lower),
            Some((name, version)) => is_token(name) && is_token(version),
        };
        if !valid {
            return Err(ConfigError::invalid(
                format!("{path}[{i}]"),
                format!("expected a protocol name such as `websocket`, found `{token}`"),
            ));
        }
        if lower == "connect" {
            return Err(ConfigError::invalid(
                format!("{path}[{i}]"),
                "CONNECT is no `Upgrade:` protocol: set the route's `connect: forward` or `connect: terminate`",
            ));
        }
        if out.contains(&lower) {
            return Err(ConfigError::invalid(
                format!("{path}[{i}]"),
                format!("`{token}` is listed twice"),
            ));
        }
        out.push(lower);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::*;

    fn with_hosts(filters: &str, hosts: &str) -> String {
        format!(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n{filters}    virtual_hosts:\n{hosts}clusters:\n  - name: c\n    endpoints: [127.0.0.1:2]\n"
        )
    }

    fn error_of(yaml: &str) -> String {
        Config::from_yaml(yaml).unwrap_err().to_string()
    }

    const ROUTE: &str = "[{ match: { prefix: / }, cluster: c }]";

    #[test]
    fn virtual_hosts_are_checked() {
        for (hosts, expected) in [
            (
                format!("      - {{ name: a, domains: [a.test, \"*\"], routes: {ROUTE} }}\n      - {{ name: b, domains: [\"*.test\", A.Test], routes: {ROUTE} }}\n"),
                "listeners[0].virtual_hosts[1].domains[1]: domain `a.test` is already served by listeners[0].virtual_hosts[0]",
            ),
            (
                format!("      - {{ name: a, domains: [a.test], routes: {ROUTE} }}\n      - {{ name: a, domains: [b.test] }}\n"),
                "listeners[0].virtual_hosts[1].name: virtual host `a` is already defined",
            ),
            (
                "      - { name: a, domains: [] }\n".to_string(),
                "listeners[0].virtual_hosts[0].domains: expected at least one domain",
            ),
            (
                "      - { name: a, domains: [\"a.*.test\"] }\n".to_string(),
                "listeners[0].virtual_hosts[0].domains[0]: expected a host name",
            ),
            (
                "      - { name: a, domains: [\"*a*\"] }\n".to_string(),
                "listeners[0].virtual_hosts[0].domains[0]: expected a host name",
            ),
            (
                "      - { name: a, domains: [\"a test\"] }\n".to_string(),
                "listeners[0].virtual_hosts[0].domains[0]: expected a host name",
            ),
            (
                "      - { name: a, domains: [a.test], routes: [{ match: { prefix: / }, cluster: nowhere }] }\n".to_string(),
                "listeners[0].virtual_hosts[0].routes[0].cluster: unknown cluster `nowhere`",
            ),
            (
                "      - { name: a, domains: [a.test], filters: { cors: disabled } }\n".to_string(),
                "listeners[0].virtual_hosts[0].filters.cors: the listener has no `cors` filter",
            ),
            (
                "      - { name: a, domains: [a.test], retry_policy: { retry_on: [retriable-headers] } }\n".to_string(),
                "listeners[0].virtual_hosts[0].retry_policy.retriable_headers: `retriable_headers` and the `retriable-headers` condition go together",
            ),
            (
                "      - { name: a, domains: [a.test], retry_policy: { retry_on: [reset], retriable_request_headers: [{ name: x, regex: \"(\" }] } }\n".to_string(),
                "listeners[0].virtual_hosts[0].retry_policy.retriable_request_headers[0].regex: invalid regex",
            ),
        ] {
            let err = error_of(&with_hosts("", &hosts));
            assert!(err.starts_with(expected), "{hosts}: {err}");
        }
        let both = with_hosts(
            "    routes: [{ match: { prefix: / }, cluster: c }]\n",
            "      - { name: a, domains: [\"*\"] }\n",
        );
        assert!(
            error_of(&both)
                .contains("expected `routes` (for every host) or `virtual_hosts`, not both"),
            "{both}"
        );
    }

    #[test]
    fn a_hosts_retry_policy_and_authz_settings_reach_its_routes() {
        let yaml = with_hosts(
            "    http_filters:\n      - ext_authz: { grpc: { address: 127.0.0.1:9191 } }\n",
            r#"      - name: api
        domains: [api.test]
        retry_policy: { retry_on: [5xx], num_retries: 3 }
        filters: { ext_authz: { context_extensions: { tier: api, team: core } } }
        routes:
          - { match: { prefix: /own }, cluster: c, retry_policy: { retry_on: [reset] }, filters: { ext_authz: { context_extensions: { team: edge } } } }
          - { match: { prefix: /open }, cluster: c, filters: { ext_authz: disabled } }
          - { match: { prefix: / }, cluster: c }
      - name: static
        domains: ["*"]
        filters: { ext_authz: disabled }
        routes:
          - { match: { prefix: /checked }, direct_response: { status: 200 }, filters: { ext_authz: enabled } }
          - { match: { prefix: / }, direct_response: { status: 200 } }
"#,
        );
        let config = Config::from_yaml(&yaml).unwrap();
        let table = &config.listeners[0].route_config;
        let retry = |i: usize| match &table.routes[i].action {
            RouteAction::Forward(f) => f.retry_policy.as_ref().map(|r| r.num_retries),
            _ => None,
        };
        // A route's own policy replaces the host's whole (Envoy: not merged).
        assert_eq!(retry(0), Some(1));
        assert_eq!(retry(2), Some(3));
        let authz = |i: usize| &table.routes[i].filters.ext_authz;
        let pairs = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            authz(0).context_extensions,
            pairs(&[("team", "edge"), ("tier", "api")])
        );
        assert!(!authz(0).disabled);
        assert!(authz(1).disabled);
        assert_eq!(
            authz(2).context_extensions,
            pairs(&[("team", "core"), ("tier", "api")])
        );
        assert!(
            !authz(3).disabled,
            "turned back on under its host's `disabled`"
        );
        assert!(authz(4).disabled);
        assert_eq!(table.virtual_hosts[1].routes, 3..5);
    }

    #[test]
    fn the_dump_keeps_the_form_written() {
        let flat = Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes: [{ match: { prefix: / }, direct_response: { status: 200 } }]\n",
        )
        .unwrap();
        let dump = serde_json::to_value(&flat.listeners[0]).unwrap();
        assert!(dump.get("virtual_hosts").is_none(), "{dump}");
        assert_eq!(dump["routes"][0]["match"]["prefix"], "/");

        let yaml = with_hosts(
            "",
            &format!(
                "      - {{ name: a, domains: [A.test, \"*.b.test:8443\", \"c.*\"], routes: {ROUTE} }}\n      - {{ name: b, domains: [\"*\"] }}\n"
            ),
        );
        let config = Config::from_yaml(&yaml).unwrap();
        let dump = serde_json::to_value(&config.listeners[0]).unwrap();
        assert!(dump.get("routes").is_none(), "{dump}");
        let hosts = &dump["virtual_hosts"];
        assert_eq!(
            hosts[0]["domains"],
            serde_json::json!(["a.test", "*.b.test:8443", "c.*"])
        );
        assert_eq!(hosts[0]["routes"][0]["cluster"], "c");
        assert_eq!(hosts[1]["routes"], serde_json::json!([]));
        // What the dump says loads again, to the same thing.
        let mut again = serde_json::to_value(&config).unwrap();
        again["listeners"][0]
            .as_object_mut()
            .unwrap()
            .retain(|k, _| ["name", "address", "virtual_hosts"].contains(&k.as_str()));
        let again = serde_json::json!({
            "listeners": [again["listeners"][0].clone()],
            "clusters": [{ "name": "c", "endpoints": ["127.0.0.1:2"] }],
        });
        let reloaded = Config::from_yaml(&serde_json::to_string(&again).unwrap()).unwrap();
        assert_eq!(
            serde_json::to_value(&reloaded.listeners[0].route_config).unwrap(),
            serde_json::to_value(&config.listeners[0].route_config).unwrap()
        );
    }
}
