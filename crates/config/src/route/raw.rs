//! Virtual hosts and routes as the file writes them (serde, unknown keys refused).

use std::time::Duration;

use serde::Deserialize;

use crate::units::de_opt_duration;
use crate::*;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVirtualHost {
    pub name: String,
    pub domains: Vec<String>,
    pub retry_policy: Option<RawRetryPolicy>,
    /// Each try sent upstream carries `x-envoy-attempt-count: N`.
    pub include_request_attempt_count: Option<bool>,
    /// The response carries `x-envoy-attempt-count: N`, the tries it took.
    pub include_attempt_count_in_response: Option<bool>,
    /// Boxed, as a route's.
    pub filters: Option<Box<RawRouteFilters>>,
    /// Rules for the rate limit filter, for routes that give none (or include these).
    #[serde(default)]
    pub rate_limits: Vec<crate::RawStagedRateLimit>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    /// Routes from a management server handed over in their listener chain's memo, in place
    /// of `routes`: each was checked before, or is checked from there (`route/memo.rs`).
    #[serde(skip)]
    pub(crate) remembered: Vec<crate::route::memo::CheckedCell>,
}

impl RawVirtualHost {
    /// Its `i`th route, as it is to be checked.
    #[cfg(test)]
    pub(crate) fn route(&self, i: usize) -> &RawRoute {
        match self.remembered.get(i) {
            Some(cell) => cell.sectioned(),
            None => &self.routes[i],
        }
    }
}

// Settings most routes leave out are boxed: a table of thousands of routes is moved and
// copied as these on every change from a management server.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    #[serde(rename = "match")]
    pub matcher: RawMatch,
    /// `{ NAMESPACE: { ... } }`: what the route tells filters that read it (Envoy's
    /// `metadata.filter_metadata`; an authorization service gets the namespaces its filter
    /// names).
    pub metadata: Option<std::collections::BTreeMap<String, serde_json::Value>>,
    /// The route's own sampling, tags and span names (Envoy's route `tracing`).
    pub tracing: Option<Box<crate::tracing::RawRouteTracing>>,
    /// The request span's name, and whether the client is told it (Envoy's `decorator`).
    pub decorator: Option<crate::tracing::RawDecorator>,
    pub cluster: Option<String>,
    /// The cluster is the one this request header names (Envoy's `cluster_header`).
    pub cluster_header: Option<String>,
    pub weighted_clusters: Option<Vec<RawWeightedCluster>>,
    /// With `weighted_clusters`: what keeps one client on one side.
    pub hash_key: Option<Box<RawHashKey>>,
    /// With `weighted_clusters`: a header whose number picks the cluster.
    pub random_value_header: Option<String>,
    /// What a request is hashed on, for a consistent-hashing cluster's host (and, with
    /// `use_hash_policy`, the side of `weighted_clusters`).
    #[serde(default)]
    pub hash_policy: Vec<crate::hash_policy::RawHashRule>,
    /// With `weighted_clusters`: the cluster is drawn by `hash_policy`'s hash.
    pub use_hash_policy: Option<bool>,
    pub direct_response: Option<RawDirectResponse>,
    pub redirect: Option<Box<RawRedirect>>,
    pub https_redirect: Option<bool>,
    pub prefix_rewrite: Option<String>,
    pub regex_rewrite: Option<Box<RawRegexRewrite>>,
    #[serde(default)]
    pub request_mirror_policies: Vec<RawMirrorPolicy>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub timeout: Option<Duration>,
    /// HTTP/2: this route's streams are reset after this long with nothing moving, instead
    /// of after the listener's `stream_idle_timeout`.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Duration>,
    pub host_rewrite: Option<String>,
    /// The host sent upstream is this request header's value (unchanged without it).
    pub host_rewrite_header: Option<String>,
    /// The host sent upstream is the path with this substitution made.
    pub host_rewrite_path_regex: Option<Box<RawRegexRewrite>>,
    /// The host sent upstream is the chosen host's name (its endpoint's `hostname`, or the
    /// DNS name it was resolved from).
    pub auto_host_rewrite: Option<bool>,
    /// With a host rewrite: the request's own host is appended to `x-forwarded-host`.
    pub append_x_forwarded_host: Option<bool>,
    /// gRPC requests: the timeout is their `grpc-timeout`, at most this (`0s`: no most).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub grpc_timeout_header_max: Option<Duration>,
    /// The listener's `max_stream_duration` for this route's requests (`0s`: none).
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_stream_duration: Option<Duration>,
    pub retry_policy: Option<Box<RawRetryPolicy>>,
    #[serde(default)]
    pub upgrades: Vec<String>,
    /// CONNECT requests: `forward` them to the cluster, or `terminate` them here.
    pub connect: Option<ConnectMode>,
    /// Redirects the upstream answers with that are followed here.
    pub internal_redirect: Option<Box<RawInternalRedirect>>,
    /// Moved into `filters`; kept here to say so.
    pub ext_authz: Option<serde::de::IgnoredAny>,
    /// Boxed: most routes have none, and the settings of every filter take 2 KiB inline
    /// (a table of 100,000 routes is copied and kept as these).
    pub filters: Option<Box<RawRouteFilters>>,
    /// Rules for the rate limit filter (Envoy's `RouteAction.rate_limits`).
    #[serde(default)]
    pub rate_limits: Vec<crate::RawStagedRateLimit>,
    /// The virtual host's `rate_limits` apply here as well as the route's.
    pub include_vh_rate_limits: Option<bool>,
    /// The status a request gets whose `cluster_header` names no cluster there is, or (from a
    /// management server) while the route's cluster is not there (Envoy's
    /// `cluster_not_found_response_code`; 503 when `None`).
    pub cluster_not_found_status: Option<u16>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetryPolicy {
    pub retry_on: Vec<String>,
    pub num_retries: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub per_try_timeout: Option<Duration>,
    #[serde(default)]
    pub retriable_status_codes: Vec<u16>,
    pub retry_back_off: Option<RawRetryBackOff>,
    /// A retry goes to a host not tried yet, if one turns up in
    /// `host_selection_retry_max_attempts` more picks.
    pub previous_hosts: Option<bool>,
    pub host_selection_retry_max_attempts: Option<u32>,
    /// Retries leave out the priorities tried, counted again every N tries.
    pub previous_priorities: Option<u32>,
    #[serde(default)]
    pub retriable_headers: Vec<RawHeaderMatch>,
    #[serde(default)]
    pub retriable_request_headers: Vec<RawHeaderMatch>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetryBackOff {
    #[serde(deserialize_with = "crate::units::de_duration")]
    pub base_interval: Duration,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_interval: Option<Duration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub host: Option<String>,
    pub prefix: Option<String>,
    pub path: Option<String>,
    pub regex: Option<String>,
    pub path_separated_prefix: Option<String>,
    /// `true`: CONNECT requests, which have no path (Envoy's `connect_matcher`).
    pub connect: Option<bool>,
    pub case_sensitive: Option<bool>,
    #[serde(default)]
    pub headers: Vec<RawHeaderMatch>,
    #[serde(default)]
    pub query_parameters: Vec<RawHeaderMatch>,
    #[serde(default)]
    pub cookies: Vec<RawCookieMatch>,
}

/// A cookie's match: `name`, one value match, and `invert`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCookieMatch {
    pub name: String,
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub contains: Option<String>,
    pub regex: Option<String>,
    pub invert: Option<bool>,
}

/// A header's or query parameter's match: `name` and one of the rest.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMatch {
    pub name: String,
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub contains: Option<String>,
    pub regex: Option<String>,
    pub present: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeightedCluster {
    /// The cluster, or (`cluster_header`) the request header that names it.
    #[serde(default)]
    pub cluster: String,
    pub cluster_header: Option<String>,
    pub weight: u32,
    /// Header rules for the requests drawn to this cluster (and their responses), applied
    /// before the route's, virtual host's and listener's (Envoy's order).
    pub headers: Option<crate::RawHeaderRules>,
    /// The host sent upstream for requests drawn here (over the route's `host_rewrite`).
    pub host_rewrite: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRedirect {
    pub scheme: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub path: Option<String>,
    pub prefix_rewrite: Option<String>,
    /// The request's path with every match of `pattern` replaced.
    pub regex_rewrite: Option<RawRegexRewrite>,
    pub status: Option<u16>,
    #[serde(default)]
    pub strip_query: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRegexRewrite {
    pub pattern: String,
    pub substitution: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMirrorPolicy {
    /// The cluster, or (`cluster_header`) the request header that names it.
    #[serde(default)]
    pub cluster: String,
    pub cluster_header: Option<String>,
    /// `10%`, `0.5%` or a number of percent; default 100%.
    pub fraction: Option<serde_yaml::Value>,
    pub disable_shadow_host_suffix_append: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDirectResponse {
    pub status: u16,
    /// Text in the file; any bytes over xDS.
    #[serde(default, deserialize_with = "crate::units::de_text_bytes")]
    pub body: bytes::Bytes,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawInternalRedirect {
    /// Default 1.
    pub max_internal_redirects: Option<u32>,
    /// Default `[302]`.
    #[serde(default)]
    pub redirect_response_codes: Vec<u16>,
    pub allow_cross_scheme_redirect: Option<bool>,
    pub previous_routes: Option<bool>,
    pub safe_cross_scheme: Option<bool>,
    #[serde(default)]
    pub response_headers_to_copy: Vec<String>,
}
