//! What routes match besides host, path prefix and exact path (regexes, query parameters,
//! header patterns), and the actions beyond a plain forward: redirects, path rewrites,
//! traffic splits and mirrors.

use http::StatusCode;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::HashKey;
use crate::serialize as ser;

/// A regular expression (the `regex` crate's syntax, RE2-like: no backreferences, linear
/// time) that must match a whole value, as Envoy's `safe_regex` does.
#[derive(Clone)]
pub struct Pattern {
    /// As written, for the dump.
    source: String,
    /// `^(?:source)$`.
    whole: regex::bytes::Regex,
}

impl Pattern {
    /// Compiles `source` to match whole values; `ignore_case` folds case.
    pub fn new(source: &str, ignore_case: bool) -> Result<Self, String> {
        let flags = if ignore_case { "(?i)" } else { "" };
        let whole = regex::bytes::RegexBuilder::new(&format!("{flags}^(?:{source})$"))
            // A pattern from the config, not from a client; still, bound what it may cost.
            .size_limit(1 << 20)
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            source: source.to_owned(),
            whole,
        })
    }

    pub fn is_match(&self, value: &[u8]) -> bool {
        self.whole.is_match(value)
    }

    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl std::fmt::Debug for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Pattern").field(&self.source).finish()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source && self.whole.as_str() == other.whole.as_str()
    }
}

impl Eq for Pattern {}

impl Serialize for Pattern {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

/// How a header's or query parameter's value must look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StringMatch {
    Exact(String),
    Prefix(String),
    Suffix(String),
    Contains(String),
    Regex(Pattern),
}

impl StringMatch {
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            StringMatch::Exact(s) => value == s.as_bytes(),
            StringMatch::Prefix(s) => value.starts_with(s.as_bytes()),
            StringMatch::Suffix(s) => value.ends_with(s.as_bytes()),
            StringMatch::Contains(s) => {
                s.is_empty() || value.windows(s.len()).any(|w| w == s.as_bytes())
            }
            StringMatch::Regex(p) => p.is_match(value),
        }
    }

    /// The key and value as written (`prefix: /v1`), into a map being serialised.
    pub(crate) fn write<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        match self {
            StringMatch::Exact(s) => map.serialize_entry("exact", s),
            StringMatch::Prefix(s) => map.serialize_entry("prefix", s),
            StringMatch::Suffix(s) => map.serialize_entry("suffix", s),
            StringMatch::Contains(s) => map.serialize_entry("contains", s),
            StringMatch::Regex(p) => map.serialize_entry("regex", p),
        }
    }
}

/// One `query_parameters` entry of a route's match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryMatch {
    /// Compared with the parameter's name after percent-decoding.
    pub name: String,
    /// `None`: the parameter must be present (with or without a value).
    pub value: Option<StringMatch>,
}

impl Serialize for QueryMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("name", &self.name)?;
        match &self.value {
            Some(value) => value.write(&mut map)?,
            None => map.serialize_entry("present", &true)?,
        }
        map.end()
    }
}

/// A route that answers with a redirect (Envoy's `RedirectAction`). Parts not given keep the
/// request's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedirectAction {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// The host without a port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub path: Option<RedirectPath>,
    #[serde(serialize_with = "ser::status")]
    pub status: StatusCode,
    pub strip_query: bool,
}

/// The path of a redirect's location.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RedirectPath {
    /// Replaces the whole path.
    Path(String),
    /// Replaces the part the route's prefix (or exact path) matched.
    PrefixRewrite(String),
    /// Every match of `pattern` in the path is replaced by `substitution`.
    RegexRewrite(RegexRewrite),
}

/// How the path a route forwards differs from the request's.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathRewrite {
    /// The part the route's prefix (or exact path) matched is replaced by this.
    PrefixRewrite(String),
    /// Every match of `pattern` in the path is replaced by `substitution`.
    RegexRewrite(RegexRewrite),
}

#[derive(Debug, Clone, Serialize)]
pub struct RegexRewrite {
    #[serde(serialize_with = "ser_regex")]
    pub pattern: regex::Regex,
    /// As written (`\1` for a group), for the dump.
    pub substitution: String,
    /// In the `regex` crate's form (`${1}`).
    #[serde(skip)]
    pub replacement: String,
}

impl PartialEq for RegexRewrite {
    fn eq(&self, other: &Self) -> bool {
        self.pattern.as_str() == other.pattern.as_str() && self.substitution == other.substitution
    }
}

impl Eq for RegexRewrite {}

fn ser_regex<S: Serializer>(regex: &regex::Regex, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(regex.as_str())
}

/// Where a route, one side of its split or a mirror sends requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterTarget {
    /// Index into [`Config::clusters`](super::Config::clusters).
    Index(usize),
    /// The cluster the request's header of this name names (its first value), read when the
    /// route is matched (Envoy's `cluster_header`); one it names that is not there answers
    /// as a cluster not found.
    Header(http::HeaderName),
    /// The cluster the request's host names (`cluster_header: ":authority"`; an HTTP/1.1
    /// request's `host`).
    Authority,
}

impl ClusterTarget {
    /// Whether each request names its cluster.
    pub fn by_request(&self) -> bool {
        !matches!(self, ClusterTarget::Index(_))
    }
}

impl Serialize for ClusterTarget {
    /// Flattened beside the cluster's name: `cluster_header: NAME`, or nothing.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match self {
            ClusterTarget::Index(_) => {}
            ClusterTarget::Header(name) => map.serialize_entry("cluster_header", name.as_str())?,
            ClusterTarget::Authority => map.serialize_entry("cluster_header", ":authority")?,
        }
        map.end()
    }
}

/// One cluster of a route's `weighted_clusters`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WeightedCluster {
    #[serde(flatten)]
    pub target: ClusterTarget,
    /// Empty with a `cluster_header`.
    #[serde(rename = "cluster", skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub weight: u32,
    /// Applied by the `headers` filter before the levels' rules, to requests drawn here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<crate::HeaderRulesConfig>,
    /// The host sent upstream for requests drawn here, over the route's `host_rewrite`.
    #[serde(
        serialize_with = "crate::serialize::opt_header_value",
        skip_serializing_if = "Option::is_none"
    )]
    pub host_rewrite: Option<http::HeaderValue>,
}

/// A route's traffic split over clusters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrafficSplit {
    #[serde(rename = "weighted_clusters")]
    pub clusters: Vec<WeightedCluster>,
    /// Requests with the same key go to the same cluster; without one, each is drawn at
    /// random.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_key: Option<HashKey>,
    /// A request with this header holding a number goes to the cluster whose share of the
    /// total weight holds the number modulo the total (Envoy's `random_value_specifier`);
    /// others are drawn as without it.
    #[serde(
        serialize_with = "crate::serialize::opt_header_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub random_value_header: Option<http::HeaderName>,
    /// The cluster is drawn by the route's `hash_policy` (Envoy's `use_hash_policy`); a
    /// request it finds nothing to hash in is drawn at random.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub use_hash_policy: bool,
    #[serde(skip)]
    pub split: balancer::WeightedSplit,
}

/// A copy of the route's requests sent to another cluster, its answers discarded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MirrorPolicy {
    #[serde(flatten)]
    pub cluster: ClusterTarget,
    /// Empty with a `cluster_header`.
    #[serde(rename = "cluster", skip_serializing_if = "String::is_empty")]
    pub cluster_name: String,
    /// The share of requests mirrored, in millionths (Envoy's `runtime_fraction`).
    #[serde(serialize_with = "ser_fraction")]
    pub fraction: u32,
    /// `false` (the default): the copy's host gets `-shadow` appended (before any port), so
    /// the shadow's logs tell copies from real requests, as Envoy does.
    pub disable_shadow_host_suffix_append: bool,
}

/// Millionths as a percentage, as written (`10%`).
fn ser_fraction<S: Serializer>(millionths: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{}%", f64::from(*millionths) / 10_000.0))
}

/// Redirects an upstream answers with that the proxy follows itself, sending the request on
/// to the location and the client the answer from there (Envoy's `internal_redirect_policy`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InternalRedirectPolicy {
    /// Redirects followed for one request, at most; the next is the client's.
    pub max_internal_redirects: u32,
    /// The statuses followed (of 301, 302, 303, 307 and 308).
    pub redirect_response_codes: Vec<u16>,
    /// A location of another scheme than the request's is followed too.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub allow_cross_scheme_redirect: bool,
    /// A location whose route one of the request's earlier ones was is not followed (Envoy's
    /// `previous_routes` predicate).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub previous_routes: bool,
    /// An `http` request is not sent on to an `https` location (Envoy's `safe_cross_scheme`
    /// predicate).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub safe_cross_scheme: bool,
    /// Headers of the redirect answer put on the request sent on.
    #[serde(
        serialize_with = "crate::serialize::header_names",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub response_headers_to_copy: Vec<http::HeaderName>,
}
