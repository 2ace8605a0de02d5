//! Legate's configuration: parsed once from YAML (or translated from Envoy's xDS resources),
//! validated, then trusted.
//!
//! [`Config::from_yaml`] (or [`Config::load`]) is the only way in. Every error names the key
//! path that is wrong (`listeners[0].virtual_hosts[1].routes[0].cluster`) and what was
//! expected; after that, the data plane reads plain values with defaults filled in and never
//! re-checks them. Checking a file needs nothing else (`legate validate` is this crate):
//!
//! ```
//! let config = config::Config::from_yaml(
//!     "listeners:\n  - { name: web, address: 127.0.0.1:8080, routes: [{ match: { prefix: / }, direct_response: { status: 200 } }] }",
//! )?;
//! assert_eq!(config.listeners[0].http.max_request_headers_kb, config::DEFAULT_MAX_REQUEST_HEADERS_KB);
//!
//! let error = config::Config::from_yaml("listeners:\n  - { name: web, address: nowhere }").unwrap_err();
//! assert!(error.to_string().starts_with("listeners[0].address:"), "{error}");
//! # Ok::<(), config::ConfigError>(())
//! ```
//!
//! The model is organised by topic, a folder or file each (`listener/`, `route/`, `cluster/`,
//! `tls/`, `filters/<name>`, `admin.rs`, ...), holding side by side the file's form (`raw`),
//! the typed settings and their defaults, the checks, and the mapping of Envoy's xDS
//! resources; docs/architecture.md lists them.

pub mod access_log;
pub mod admin;
pub mod cel;
pub mod cluster;
mod envoy;
mod field_path;
pub mod filters;
pub mod hash_policy;
pub mod header_field;
pub mod listener;
pub mod local_reply;
pub mod machine;
mod matchers;
pub mod overload;
pub mod path;
pub mod raw;
pub mod route;
mod serialize;
pub mod stats;
pub mod template;
pub mod tls;
pub mod tracing;
pub mod units;
mod validate;
mod values;
pub mod xds;

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Serialize, Serializer};

use serialize as ser;

pub use crate::access_log::{AccessLogConfig, JsonFormat, LogFormat, LogTarget, RawAccessLog};
pub use crate::units::{parse_duration, parse_size};
pub use admin::{AdminConfig, AdminToken, READ_ONLY_ENDPOINTS, RawAdmin};
pub use balancer::{LbPolicy, LbSettings};
pub use cluster::dns::*;
pub use cluster::raw::*;
pub use cluster::*;
pub use filters::*;
pub use listener::chains::{
    ChainMatch, FilterChainConfig, RawChain, RawChainMatch, TransportProtocol,
};
pub use listener::raw::*;
pub use listener::*;
pub use matchers::{RawStringMatch, Share};
pub use overload::{Environment as OverloadEnvironment, OverloadConfig, RawOverload};
pub use path::{EscapedSlashes, PathNormalization};
pub use raw::*;
pub use route::action::*;
pub use route::raw::*;
pub use route::virtual_host::*;
pub use route::*;
pub use service_endpoint::Endpoint as ServiceEndpoint;
pub use stats::{RawStats, StatsConfig};
pub use tls::raw::*;
pub use tls::*;
pub use tracing::{
    CustomTag, CustomTagValue, ListenerTracing, OtlpProtocol, RawCustomTag, RawListenerTracing,
    RawOtlp, RawRouteTracing, RawTagSource, RawTracing, RouteTracing, SpanName, TracingConfig,
};
pub use xds::{AdsProtocol, RawAds, RawDynamicResources, RawNode, XdsConfig};

/// How long in-flight requests may run after a shutdown signal, unless configured.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the admin server listens unless configured.
pub const DEFAULT_ADMIN_ADDRESS: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9901);

/// A validated configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    pub concurrency: Concurrency,
    #[serde(serialize_with = "ser::duration")]
    pub drain_timeout: Duration,
    /// The admin server; `None` when disabled.
    pub admin: Option<AdminConfig>,
    /// Downstream connections the whole process holds at most; `None`: no limit.
    pub max_connections: Option<usize>,
    /// When to shed load as memory or connections run short.
    pub overload: OverloadConfig,
    /// Reload when the config file changes (checked once a second), besides `SIGHUP` and
    /// `POST /reload`.
    pub watch: bool,
    /// How latency histograms are exported to Prometheus.
    pub stats: StatsConfig,
    /// Trace context propagation and span export; `None`: requests are not traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tracing: Option<TracingConfig>,
    pub listeners: Vec<ListenerConfig>,
    /// Shared: a change from a management server keeps each unchanged cluster's, checked once.
    pub clusters: Vec<Arc<ClusterConfig>>,
    /// The proxy's own fleet, which clusters route by zone from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub local_cluster: Option<cluster::local::LocalClusterConfig>,
    /// The management server listeners, routes, clusters and endpoints also come from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xds: Option<XdsConfig>,
    /// The file as written, for putting resources from the management server beside it.
    #[serde(skip)]
    pub(crate) origin: Arc<raw::RawConfig>,
}

/// The number of worker threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concurrency {
    /// One worker per CPU this process may use (affinity mask and cgroup quota).
    Auto,
    Fixed(NonZeroUsize),
}

impl Serialize for Concurrency {
    /// As written: `auto` or the number of workers.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Concurrency::Auto => s.serialize_str("auto"),
            Concurrency::Fixed(n) => s.serialize_u64(n.get() as u64),
        }
    }
}

/// Why a config was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        source: std::io::Error,
    },
    /// The YAML does not have the expected shape (unknown key, wrong type, bad unit).
    #[error("{0}")]
    Syntax(String),
    /// A value is well-formed but not acceptable.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

impl ConfigError {
    pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl Config {
    /// Parses and validates a YAML document.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let raw: raw::RawConfig =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let origin = Arc::new(raw.clone());
        validate::validate(raw, origin, Vec::new())
    }

    /// Reads, parses and validates a file.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.display().to_string(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// The file as written, which resources from a management server are put beside
    /// ([`xds::compose`]).
    pub fn origin(&self) -> &Arc<raw::RawConfig> {
        &self.origin
    }

    /// The number of workers to run: the configured number, or the usable CPU count.
    pub fn worker_count(&self) -> usize {
        match self.concurrency {
            Concurrency::Fixed(n) => n.get(),
            Concurrency::Auto => crate::machine::usable_cores(),
        }
    }
}
