//! A listener that relays TCP (Envoy's `tcp_proxy` network filter): each connection, past
//! the listener's PROXY protocol and TLS if it has them, goes to a host of one cluster and
//! its bytes are relayed both ways, with no HTTP in between. The typed settings, the file's
//! form and the check are here; Envoy's `TcpProxy` is mapped in `xds.rs` beside the
//! listener's.

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::{de_opt_duration, ser_opt_duration};
use crate::{ClusterConfig, ConfigError};

/// A relayed connection with nothing moving either way for this long is closed, unless
/// configured (Envoy's default).
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TcpProxyConfig {
    /// Index into [`crate::Config::clusters`].
    #[serde(skip)]
    pub cluster: usize,
    #[serde(rename = "cluster")]
    pub cluster_name: String,
    /// `None`: never closed for idleness.
    #[serde(serialize_with = "ser_opt_duration")]
    pub idle_timeout: Option<Duration>,
    /// Hosts tried, one after another, before the client's connection is closed.
    pub max_connect_attempts: u32,
    /// A client connection older than this is closed. `None`: no limit.
    #[serde(
        serialize_with = "ser_opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_downstream_connection_duration: Option<Duration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTcpProxy {
    pub cluster: String,
    /// `0s`: none.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Duration>,
    pub max_connect_attempts: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_downstream_connection_duration: Option<Duration>,
}

pub(crate) fn check(
    raw: RawTcpProxy,
    path: &str,
    cluster_index: &HashMap<&str, usize>,
    clusters: &[ClusterConfig],
) -> Result<TcpProxyConfig, ConfigError> {
    let cluster = crate::route::check_actions::cluster(
        &raw.cluster,
        cluster_index,
        clusters,
        &format!("{path}.cluster"),
    )?;
    let max_connect_attempts = match raw.max_connect_attempts {
        None => 1,
        Some(0) => {
            return Err(ConfigError::invalid(
                format!("{path}.max_connect_attempts"),
                "expected at least 1",
            ));
        }
        Some(n) => n,
    };
    Ok(TcpProxyConfig {
        cluster,
        cluster_name: raw.cluster,
        idle_timeout: match raw.idle_timeout {
            None => Some(DEFAULT_TCP_IDLE_TIMEOUT),
            Some(t) if t.is_zero() => None,
            Some(t) => Some(t),
        },
        max_connect_attempts,
        max_downstream_connection_duration: raw
            .max_downstream_connection_duration
            .filter(|d| !d.is_zero()),
    })
}

/// Envoy's `TcpProxy` network filter as the listener's `tcp_proxy`.
pub(crate) mod xds {
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier,
    };
    use envoy_types::pb::google::protobuf::Any;

    use super::RawTcpProxy;
    use crate::envoy::{ResourceError, decode, duration, fields, nothing_else};

    pub(crate) const TYPE_URL: &str =
        "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";

    pub(crate) fn tcp_proxy(any: &Any, at: &str) -> Result<RawTcpProxy, ResourceError> {
        let mut tcp: TcpProxy = decode(any, TYPE_URL, "a TcpProxy")?;
        tcp.stat_prefix.clear();
        let cluster = match tcp.cluster_specifier.take() {
            Some(ClusterSpecifier::Cluster(name)) if !name.is_empty() => name,
            Some(ClusterSpecifier::WeightedClusters(_)) => {
                return Err(ResourceError::Unsupported {
                    at: at.to_owned(),
                    fields: vec!["weighted_clusters".into()],
                });
            }
            _ => return Err(ResourceError::invalid(at, "expected a cluster")),
        };
        // Envoy: unset is one hour, `0s` none; the file's form says the same.
        let idle_timeout = duration(tcp.idle_timeout.take(), &format!("{at}.idle_timeout"))?;
        let max_connect_attempts = tcp.max_connect_attempts.take().map(|v| v.value);
        let max_downstream_connection_duration = duration(
            tcp.max_downstream_connection_duration.take(),
            &format!("{at}.max_downstream_connection_duration"),
        )?;
        nothing_else(&tcp, fields::TCP_PROXY, at)?;
        Ok(RawTcpProxy {
            cluster,
            idle_timeout,
            max_connect_attempts,
            max_downstream_connection_duration,
        })
    }
}
