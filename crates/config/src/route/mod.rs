//! Routes: what a request is matched on and what is done with it.
//!
//! The topic's files, side by side: this one holds a route's typed settings and defaults;
//! `virtual_host.rs` a listener's route table by domain; `action.rs` redirects, rewrites,
//! splits and mirrors; `raw.rs` the file's form; `check.rs` and `check_actions.rs` the checks;
//! `xds.rs` and `xds_actions.rs` the mapping of Envoy's `RouteConfiguration`; `memo.rs` the
//! routes from it kept checked while their table changes around them. What a request
//! is hashed on, which clusters have too, is the `hash_policy` topic.

pub mod action;
pub(crate) mod check;
pub(crate) mod check_actions;
pub(crate) mod memo;
pub mod raw;
pub mod virtual_host;
pub mod xds;
pub mod xds_actions;

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde::{Serialize, Serializer};

use crate::serialize as ser;
use crate::*;

/// Time allowed for an upstream response to start, unless the route says otherwise.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteConfig {
    #[serde(rename = "match")]
    pub matcher: RouteMatch,
    #[serde(flatten)]
    pub action: RouteAction,
    /// What this route changes about its listener's filters.
    #[serde(skip_serializing_if = "RouteFilters::is_default")]
    pub filters: RouteFilters,
    /// Its metadata by namespace, for filters that read it. Boxed: most routes have none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Box<RouteMetadata>>,
    /// Its own sampling, tags and span names over the listener's. Boxed: most routes have
    /// none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<Box<crate::tracing::RouteTracing>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decorator: Option<Box<crate::tracing::RouteDecorator>>,
    /// Its rules for the rate limit filter. Boxed: most routes have none.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<Box<crate::RouteRateLimitPolicy>>,
}

/// A route's `metadata`: objects by namespace.
pub type RouteMetadata =
    std::collections::BTreeMap<String, serde_json::Map<String, serde_json::Value>>;

/// What a request must look like for a route to take it. All parts must match.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteMatch {
    #[serde(skip_serializing_if = "HostMatch::is_any")]
    pub host: HostMatch,
    #[serde(flatten)]
    pub path: PathMatch,
    /// `false`: the path matches whatever its ASCII case (`/Private` takes a `/private`
    /// route), for origins that ignore case; the prefix or path is then kept lowercase.
    #[serde(skip_serializing_if = "is_true")]
    pub case_sensitive: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HeaderMatch>,
    /// Matches on the `:authority` pseudo-header (a header named so in `headers`): the host
    /// as the client sent it, port and letter case included, as Envoy compares it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub authority: Vec<HeaderValueMatch>,
    /// Parameters of the request's query, percent-decoded; all must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub query_parameters: Vec<QueryMatch>,
    /// Cookies of the `cookie` header; all must match.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cookies: Vec<CookieMatch>,
}

/// A cookie's value matched (Envoy's `CookieMatcher`): an absent cookie does not match, so
/// with `invert` it does.
#[derive(Debug, Clone, PartialEq)]
pub struct CookieMatch {
    pub name: String,
    pub value: StringMatch,
    pub invert: bool,
}

impl Serialize for CookieMatch {
    /// As written: `name`, the value's match, and `invert: true` when set.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("name", &self.name)?;
        self.value.write(&mut map)?;
        if self.invert {
            map.serialize_entry("invert", &true)?;
        }
        map.end()
    }
}

impl CookieMatch {
    pub fn matches(&self, headers: &http::HeaderMap) -> bool {
        let found = cookie_value(headers, &self.name).is_some_and(|v| self.value.matches(v));
        found != self.invert
    }
}

/// The value of the first cookie named `name` in the `cookie` headers, without the quotes
/// around it if it has them (as Envoy reads it): for route matches and hash keys alike.
pub fn cookie_value<'a>(headers: &'a http::HeaderMap, name: &str) -> Option<&'a [u8]> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|h| h.as_bytes().split(|b| *b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let at = pair.iter().position(|b| *b == b'=')?;
            let (key, value) = (&pair[..at], &pair[at + 1..]);
            (key == name.as_bytes()).then(|| {
                value
                    .strip_prefix(b"\"")
                    .and_then(|v| v.strip_suffix(b"\""))
                    .unwrap_or(value)
            })
        })
}

impl RouteMatch {
    /// Whether the route is decided by more than its host and path (or its path is a regex):
    /// the index must then check each candidate in full.
    pub fn has_conditions(&self) -> bool {
        !self.headers.is_empty()
            || !self.authority.is_empty()
            || !self.query_parameters.is_empty()
            || !self.cookies.is_empty()
            || matches!(
                self.path,
                PathMatch::Regex(_) | PathMatch::SeparatedPrefix(_) | PathMatch::Connect
            )
    }
}

fn is_true(value: &bool) -> bool {
    *value
}

/// Matches the request's host (without its port), case-insensitively.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    Any,
    /// `api.example.com`, stored lowercase.
    Exact(String),
    /// `*.example.com` is stored as `.example.com`: any host ending in it.
    Suffix(String),
}

impl HostMatch {
    fn is_any(&self) -> bool {
        *self == HostMatch::Any
    }
}

impl Serialize for HostMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            HostMatch::Any => s.serialize_str("*"),
            HostMatch::Exact(name) => s.serialize_str(name),
            HostMatch::Suffix(suffix) => s.collect_str(&format_args!("*{suffix}")),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    Prefix(String),
    #[serde(rename = "path")]
    Exact(String),
    /// The path is this, or goes on with `/` after it (`/api` takes `/api` and `/api/x`, not
    /// `/apis`); the query is not part of it.
    #[serde(rename = "path_separated_prefix")]
    SeparatedPrefix(String),
    /// The whole path (without the query) must match.
    Regex(Pattern),
    /// CONNECT requests (which have no path), and nothing else (Envoy's `connect_matcher`).
    #[serde(rename = "connect", serialize_with = "ser::unit_true")]
    Connect,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HeaderMatch {
    #[serde(serialize_with = "ser::header_name")]
    pub name: HeaderName,
    #[serde(flatten)]
    pub value: HeaderValueMatch,
}

impl HeaderValueMatch {
    /// Whether a single value (`None`: absent) satisfies the match.
    pub fn matches_value(&self, value: Option<&[u8]>) -> bool {
        match (self, value) {
            (HeaderValueMatch::Present, found) => found.is_some(),
            (HeaderValueMatch::Absent, found) => found.is_none(),
            (HeaderValueMatch::Exact(v), Some(found)) => v.as_bytes() == found,
            (HeaderValueMatch::Pattern(p), Some(found)) => p.matches(found),
            (_, None) => false,
        }
    }
}

impl HeaderMatch {
    /// Whether `headers` satisfy the match (for a value match, the header's values as one,
    /// joined by commas, as Envoy reads a repeated header).
    pub fn matches(&self, headers: &http::HeaderMap) -> bool {
        let values = headers.get_all(&self.name).iter().map(|v| v.as_bytes());
        self.value.matches_header(self.name.as_str(), values)
    }
}

impl HeaderValueMatch {
    /// Whether a header with these values (none: absent) satisfies the match: presence, or
    /// the values joined by commas (Envoy's `getAllOfHeaderAsString`; one value is read as
    /// it is, with no copy).
    pub fn matches_values<'a>(&self, values: impl Iterator<Item = &'a [u8]>) -> bool {
        self.matches_joined(values, b",")
    }

    /// Whether the values of the header `name` (lowercase) satisfy the match, joined as
    /// Envoy joins them: by commas, and cookies (one per field in HTTP/2) by `; `.
    pub fn matches_header<'a>(&self, name: &str, values: impl Iterator<Item = &'a [u8]>) -> bool {
        let separator: &[u8] = if name == "cookie" { b"; " } else { b"," };
        self.matches_joined(values, separator)
    }

    /// As [`Self::matches_values`], the values joined by `separator`.
    fn matches_joined<'a>(
        &self,
        mut values: impl Iterator<Item = &'a [u8]>,
        separator: &[u8],
    ) -> bool {
        match self {
            HeaderValueMatch::Present => values.next().is_some(),
            HeaderValueMatch::Absent => values.next().is_none(),
            _ => {
                let Some(first) = values.next() else {
                    return self.matches_value(None);
                };
                let Some(second) = values.next() else {
                    return self.matches_value(Some(first));
                };
                let mut joined = Vec::with_capacity(first.len() + second.len() + separator.len());
                for (i, value) in [first, second].into_iter().chain(values).enumerate() {
                    if i > 0 {
                        joined.extend_from_slice(separator);
                    }
                    joined.extend_from_slice(value);
                }
                self.matches_value(Some(&joined))
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValueMatch {
    Exact(HeaderValue),
    /// `prefix`, `suffix`, `contains` or `regex` over the header's values joined.
    Pattern(StringMatch),
    Present,
    Absent,
}

impl Serialize for HeaderValueMatch {
    /// As written: `exact: VALUE`, `present: true` or `present: false`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(1))?;
        match self {
            HeaderValueMatch::Exact(value) => {
                map.serialize_entry("exact", &String::from_utf8_lossy(value.as_bytes()))?
            }
            HeaderValueMatch::Pattern(pattern) => pattern.write(&mut map)?,
            HeaderValueMatch::Present => map.serialize_entry("present", &true)?,
            HeaderValueMatch::Absent => map.serialize_entry("present", &false)?,
        }
        map.end()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteAction {
    /// Answer from the proxy itself.
    DirectResponse {
        #[serde(serialize_with = "ser::status")]
        status: StatusCode,
        #[serde(serialize_with = "ser::bytes_text")]
        body: Bytes,
    },
    /// Answer with a redirect.
    Redirect(RedirectAction),
    /// Forward to a cluster.
    #[serde(untagged)]
    Forward(Box<ForwardAction>),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ForwardAction {
    /// Where requests go without a split (with one it is not read: the drawn side's is).
    #[serde(flatten)]
    pub cluster: ClusterTarget,
    /// The cluster's name (empty with a split or a `cluster_header`).
    #[serde(rename = "cluster", skip_serializing_if = "String::is_empty")]
    pub cluster_name: String,
    /// The status of a request whose `cluster_header` names no cluster there is (Envoy's
    /// `cluster_not_found_response_code`). Dumped unless 503, so a change makes a new table.
    #[serde(
        serialize_with = "ser::status",
        skip_serializing_if = "is_service_unavailable"
    )]
    pub cluster_not_found_status: StatusCode,
    /// `weighted_clusters`: the cluster is drawn per request, `cluster` is not used.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub split: Option<TrafficSplit>,
    /// `prefix_rewrite` or `regex_rewrite` of the path sent upstream.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub path_rewrite: Option<PathRewrite>,
    #[serde(
        rename = "request_mirror_policies",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub mirrors: Vec<MirrorPolicy>,
    /// Time allowed for the response head to arrive after the request body has been sent
    /// (as Envoy's route timeout); while the body is still going up, time it stands still.
    #[serde(serialize_with = "ser::duration")]
    pub timeout: Duration,
    /// HTTP/2: the route's streams are reset after this long with nothing moving (Envoy's
    /// route `idle_timeout`); `None`: the listener's `stream_idle_timeout`.
    #[serde(
        serialize_with = "ser::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub idle_timeout: Option<Duration>,
    /// Replaces the `host` (or `:authority`) sent upstream.
    #[serde(serialize_with = "ser::opt_header_value")]
    pub host_rewrite: Option<HeaderValue>,
    /// The host sent upstream is this request header's value, when it has one (Envoy's
    /// `host_rewrite_header`).
    #[serde(
        serialize_with = "ser::opt_header_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_rewrite_header: Option<http::HeaderName>,
    /// The host sent upstream is the request's path (without its query) with this
    /// substitution made (Envoy's `host_rewrite_path_regex`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_rewrite_path_regex: Option<RegexRewrite>,
    /// The host sent upstream is the chosen host's name, when it has one (Envoy's
    /// `auto_host_rewrite`).
    pub auto_host_rewrite: bool,
    /// With `host_rewrite`: the request's own host is appended to `x-forwarded-host` (unless
    /// it is already the last value there), as Envoy's `append_x_forwarded_host`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub append_x_forwarded_host: bool,
    /// A gRPC request's timeout is its `grpc-timeout` header (none: no timeout) instead of
    /// `timeout`, at most this; zero: no most (Envoy's `grpc_timeout_header_max`).
    #[serde(
        serialize_with = "ser::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub grpc_timeout_header_max: Option<Duration>,
    /// This route's limit on a request and its response, over the listener's
    /// `max_stream_duration` (`0s`: none for the route).
    #[serde(
        serialize_with = "ser::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_stream_duration: Option<Duration>,
    pub retry_policy: Option<RetryPolicy>,
    /// What a request is hashed on for the cluster's host (its `hash_key` when `None`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_policy: Option<crate::hash_policy::HashPolicy>,
    /// Each try carries `x-envoy-attempt-count: N` (its virtual host's
    /// `include_request_attempt_count`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub include_attempt_count: bool,
    /// The response carries `x-envoy-attempt-count: N`, the tries it took (its virtual
    /// host's `include_attempt_count_in_response`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub include_attempt_count_in_response: bool,
    /// Protocols clients may switch to on this route (`websocket`): the upgrade is relayed
    /// to the upstream and, once it agrees, bytes flow both ways.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upgrades: Vec<String>,
    /// What a CONNECT request on this route opens (Envoy's `CONNECT` upgrade); `None`: it is
    /// refused (403).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect: Option<ConnectMode>,
    /// Redirects the upstream answers with that are followed here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub internal_redirect: Option<Box<InternalRedirectPolicy>>,
}

/// How a route serves CONNECT (RFC 9110 section 9.3.6) tunnels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectMode {
    /// The CONNECT goes on to the cluster's host (itself a proxy); its 2xx opens the tunnel.
    Forward,
    /// The tunnel ends here: a TCP connection is opened to a host of the cluster, the client
    /// is answered 200, and bytes are relayed (Envoy's `connect_config`).
    Terminate,
}

fn is_service_unavailable(status: &StatusCode) -> bool {
    *status == StatusCode::SERVICE_UNAVAILABLE
}

/// When and how often a failed request is tried again, on another host if there is one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetryPolicy {
    pub retry_on: RetryOn,
    pub num_retries: u32,
    /// Time allowed for each try; the route timeout still bounds them all together.
    #[serde(serialize_with = "ser::opt_duration")]
    pub per_try_timeout: Option<Duration>,
    pub retriable_status_codes: Vec<u16>,
    /// The wait before retry N: a random time below `base_interval` x 2^(N-1), at most
    /// `max_interval` (Envoy's fully jittered exponential back-off).
    pub back_off: RetryBackOff,
    /// A retry goes to a host no try of the request went to, when one turns up within
    /// `host_selection_attempts` picks (Envoy's `previous_hosts` predicate).
    pub previous_hosts: bool,
    pub host_selection_attempts: u32,
    /// A retry's priority loads leave out the priorities tried, counted again every this
    /// many tries (Envoy's `previous_priorities` retry priority and its `update_frequency`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_priorities: Option<u32>,
    /// Response headers that make a try worth retrying (`retriable-headers`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retriable_headers: Vec<HeaderMatch>,
    /// Only requests matching one of these are retried; empty: every request.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub retriable_request_headers: Vec<HeaderMatch>,
}

/// Envoy's default: 25 ms, doubling up to 250 ms.
pub const DEFAULT_RETRY_BASE_INTERVAL: Duration = Duration::from_millis(25);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RetryBackOff {
    #[serde(serialize_with = "ser::duration")]
    pub base_interval: Duration,
    #[serde(serialize_with = "ser::duration")]
    pub max_interval: Duration,
}

impl RetryBackOff {
    /// The longest wait before retry `n` (from 1).
    pub fn ceiling(&self, n: u32) -> Duration {
        let doubled = self
            .base_interval
            .saturating_mul(1u32 << (n.saturating_sub(1)).min(20));
        doubled.min(self.max_interval)
    }
}

/// Envoy's `retry_on` conditions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetryOn {
    pub connect_failure: bool,
    pub refused_stream: bool,
    pub reset: bool,
    /// A try that failed before any of the request went out (a connect failure, a
    /// connection that closed before the head was written): safe for any method.
    pub reset_before_request: bool,
    /// A response with a header `retriable_headers` matches.
    pub retriable_headers: bool,
    /// Any 5xx, and no response at all (connect failure, reset, try timeout).
    pub server_error: bool,
    /// 502, 503, 504, and no response at all.
    pub gateway_error: bool,
    pub retriable_status_codes: bool,
    /// 409, as Envoy's `retriable-4xx`.
    pub retriable_4xx: bool,
    /// gRPC statuses in a response's head (a trailers-only answer): `cancelled` (1),
    /// `deadline-exceeded` (4), `resource-exhausted` (8), `internal` (13), `unavailable` (14).
    pub grpc_cancelled: bool,
    pub grpc_deadline_exceeded: bool,
    pub grpc_resource_exhausted: bool,
    pub grpc_internal: bool,
    pub grpc_unavailable: bool,
}

impl RetryOn {
    /// Whether a response's `grpc-status` is one to retry.
    pub fn grpc_status(&self, code: u32) -> bool {
        match code {
            1 => self.grpc_cancelled,
            4 => self.grpc_deadline_exceeded,
            8 => self.grpc_resource_exhausted,
            13 => self.grpc_internal,
            14 => self.grpc_unavailable,
            _ => false,
        }
    }

    pub fn any_grpc(&self) -> bool {
        self.grpc_cancelled
            || self.grpc_deadline_exceeded
            || self.grpc_resource_exhausted
            || self.grpc_internal
            || self.grpc_unavailable
    }
}

impl Serialize for RetryOn {
    /// As written: the list of condition names.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            [
                (self.connect_failure, "connect-failure"),
                (self.refused_stream, "refused-stream"),
                (self.reset, "reset"),
                (self.reset_before_request, "reset-before-request"),
                (self.retriable_headers, "retriable-headers"),
                (self.server_error, "5xx"),
                (self.gateway_error, "gateway-error"),
                (self.retriable_status_codes, "retriable-status-codes"),
                (self.retriable_4xx, "retriable-4xx"),
                (self.grpc_cancelled, "cancelled"),
                (self.grpc_deadline_exceeded, "deadline-exceeded"),
                (self.grpc_resource_exhausted, "resource-exhausted"),
                (self.grpc_internal, "internal"),
                (self.grpc_unavailable, "unavailable"),
            ]
            .into_iter()
            .filter_map(|(set, name)| set.then_some(name)),
        )
    }
}

#[cfg(test)]
mod header_value_tests {
    use super::*;

    #[test]
    fn a_repeated_header_matches_as_its_values_joined() {
        let mut headers = http::HeaderMap::new();
        headers.append("x-tag", http::HeaderValue::from_static("a"));
        headers.append("x-tag", http::HeaderValue::from_static("b"));
        let exact = |v: &'static str| HeaderMatch {
            name: http::HeaderName::from_static("x-tag"),
            value: HeaderValueMatch::Exact(http::HeaderValue::from_static(v)),
        };
        assert!(exact("a,b").matches(&headers));
        assert!(!exact("a").matches(&headers), "not one value alone");
        let mut single = http::HeaderMap::new();
        single.insert("x-tag", http::HeaderValue::from_static("a"));
        assert!(exact("a").matches(&single));
        assert!(!exact("a").matches(&http::HeaderMap::new()));
        let mut cookies = http::HeaderMap::new();
        cookies.append("cookie", http::HeaderValue::from_static("a=1"));
        cookies.append("cookie", http::HeaderValue::from_static("b=2"));
        let cookie = HeaderMatch {
            name: http::header::COOKIE,
            value: HeaderValueMatch::Exact(http::HeaderValue::from_static("a=1; b=2")),
        };
        assert!(
            cookie.matches(&cookies),
            "HTTP/2's cookie fields are one header"
        );
    }
}
