//! A listener that relays TCP (Envoy's `tcp_proxy` network filter): each connection, past
//! the listener's PROXY protocol and TLS if it has them, goes to a host of one cluster and
//! its bytes are relayed both ways, with no HTTP in between. The typed settings, the file's
//! form and the check are here; Envoy's `TcpProxy` is mapped in `xds.rs` beside the
//! listener's.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::units::{de_opt_duration, ser_opt_duration};
use crate::{ClusterConfig, ConfigError};

/// A relayed connection with nothing moving either way for this long is closed, unless
/// configured (Envoy's default).
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TcpProxyConfig {
    /// Index into [`crate::Config::clusters`].
    /// The cluster, or the first of `weighted_clusters`.
    #[serde(skip)]
    pub cluster: usize,
    #[serde(rename = "cluster")]
    pub cluster_name: String,
    /// Each connection goes to one of these, drawn by weight (Envoy's `weighted_clusters`);
    /// empty: to `cluster`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub weighted_clusters: Vec<TcpWeightedCluster>,
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
    /// What a consistent-hashing cluster (ring hash, Maglev) hashes a connection by; `None`:
    /// nothing, so such a cluster picks as if at random.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_policy: Option<TcpHashPolicy>,
    /// Connections allowed or denied by what they show (addresses, ports, SNI, client
    /// certificate) before they are relayed (Envoy's network `rbac` filter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rbac: Option<crate::filters::RbacConfig>,
}

/// What a relayed connection is hashed by (Envoy's `hash_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TcpHashPolicy {
    /// The client's IP address, hashed as a route's `source_ip` rule hashes it.
    SourceIp,
}

/// One of a relay's weighted clusters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TcpWeightedCluster {
    #[serde(skip)]
    pub cluster: usize,
    #[serde(rename = "cluster")]
    pub name: String,
    pub weight: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTcpWeightedCluster {
    pub cluster: String,
    pub weight: u32,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTcpProxy {
    /// One cluster, or
    #[serde(default)]
    pub cluster: String,
    /// several, each connection to one drawn by weight.
    #[serde(default)]
    pub weighted_clusters: Vec<RawTcpWeightedCluster>,
    /// `0s`: none.
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Duration>,
    pub max_connect_attempts: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub max_downstream_connection_duration: Option<Duration>,
    #[serde(default)]
    pub hash_policy: Option<TcpHashPolicy>,
    pub rbac: Option<crate::filters::RawRbac>,
}

pub(crate) fn check(
    raw: RawTcpProxy,
    path: &str,
    cluster_index: &crate::cluster::ClusterIndex<'_>,
    clusters: &[std::sync::Arc<ClusterConfig>],
) -> Result<TcpProxyConfig, ConfigError> {
    let mut weighted_clusters = Vec::with_capacity(raw.weighted_clusters.len());
    for (i, w) in raw.weighted_clusters.iter().enumerate() {
        let at = format!("{path}.weighted_clusters[{i}]");
        weighted_clusters.push(TcpWeightedCluster {
            cluster: crate::route::check_actions::cluster(
                &w.cluster,
                cluster_index,
                clusters,
                &format!("{at}.cluster"),
            )?,
            name: w.cluster.clone(),
            weight: w.weight,
        });
    }
    let cluster_name = match (raw.cluster.is_empty(), weighted_clusters.first()) {
        (false, None) => raw.cluster.clone(),
        (true, Some(first)) if weighted_clusters.iter().any(|w| w.weight > 0) => first.name.clone(),
        (true, Some(_)) => {
            return Err(ConfigError::invalid(
                format!("{path}.weighted_clusters"),
                "expected a weight above 0 somewhere",
            ));
        }
        _ => {
            return Err(ConfigError::invalid(
                path.to_owned(),
                "expected `cluster` or `weighted_clusters`, one of them",
            ));
        }
    };
    let cluster = crate::route::check_actions::cluster(
        &cluster_name,
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
        cluster_name,
        weighted_clusters,
        idle_timeout: match raw.idle_timeout {
            None => Some(DEFAULT_TCP_IDLE_TIMEOUT),
            Some(t) if t.is_zero() => None,
            Some(t) => Some(t),
        },
        max_connect_attempts,
        max_downstream_connection_duration: raw
            .max_downstream_connection_duration
            .filter(|d| !d.is_zero()),
        hash_policy: raw.hash_policy,
        rbac: (raw.rbac)
            .map(|rbac| crate::filters::rbac::network_rbac(rbac, &format!("{path}.rbac")))
            .transpose()?,
    })
}

/// Envoy's `TcpProxy` network filter as the listener's `tcp_proxy`.
pub(crate) mod xds {
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy::ClusterSpecifier,
    };
    use envoy_types::pb::envoy::r#type::v3::hash_policy::PolicySpecifier;
    use envoy_types::pb::google::protobuf::Any;

    use super::{RawTcpProxy, RawTcpWeightedCluster, TcpHashPolicy};
    use crate::access_log::xds::XdsAccessLog;
    use crate::envoy::{ResourceError, decode, duration, fields, nothing_else};

    pub(crate) const TYPE_URL: &str =
        "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";

    /// The relay's settings, and its loggers (one line per relayed connection).
    pub(crate) fn tcp_proxy(
        any: &Any,
        at: &str,
    ) -> Result<(RawTcpProxy, Vec<XdsAccessLog>), ResourceError> {
        let mut tcp: TcpProxy = decode(any, TYPE_URL, "a TcpProxy")?;
        tcp.stat_prefix.clear();
        let (cluster, weighted_clusters) = match tcp.cluster_specifier.take() {
            Some(ClusterSpecifier::Cluster(name)) if !name.is_empty() => (name, Vec::new()),
            Some(ClusterSpecifier::WeightedClusters(weighted)) => {
                let mut list = Vec::with_capacity(weighted.clusters.len());
                for (i, mut w) in weighted.clusters.into_iter().enumerate() {
                    let at = format!("{at}.weighted_clusters.clusters[{i}]");
                    // Picking hosts by endpoint metadata is not done here.
                    if w.metadata_match.is_some() {
                        return Err(ResourceError::Unsupported {
                            at,
                            fields: vec!["metadata_match".into()],
                        });
                    }
                    if w.name.is_empty() {
                        return Err(ResourceError::invalid(at, "a cluster without a name"));
                    }
                    list.push(RawTcpWeightedCluster {
                        cluster: std::mem::take(&mut w.name),
                        weight: w.weight,
                    });
                }
                // Refused when the listener comes, as Envoy does, not once its clusters are
                // there to make it whole.
                if list.iter().all(|w| w.weight == 0) {
                    return Err(ResourceError::invalid(
                        format!("{at}.weighted_clusters"),
                        "expected a cluster with a weight above 0",
                    ));
                }
                (String::new(), list)
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
        let hash_policy = match std::mem::take(&mut tcp.hash_policy).as_mut_slice() {
            [] => None,
            [only] => match only.policy_specifier.take() {
                Some(PolicySpecifier::SourceIp(_)) => Some(TcpHashPolicy::SourceIp),
                Some(PolicySpecifier::FilterState(_)) => {
                    return Err(ResourceError::Unsupported {
                        at: format!("{at}.hash_policy[0]"),
                        fields: vec!["filter_state (source_ip only)".into()],
                    });
                }
                None => {
                    return Err(ResourceError::invalid(
                        format!("{at}.hash_policy[0]"),
                        "expected source_ip",
                    ));
                }
            },
            _ => {
                return Err(ResourceError::invalid(
                    format!("{at}.hash_policy"),
                    "expected at most one policy",
                ));
            }
        };
        let logs = crate::access_log::xds::connection_manager_logs(
            std::mem::take(&mut tcp.access_log),
            at,
        )?;
        nothing_else(&tcp, fields::TCP_PROXY, at)?;
        let raw = RawTcpProxy {
            cluster,
            weighted_clusters,
            idle_timeout,
            max_connect_attempts,
            max_downstream_connection_duration,
            hash_policy,
            rbac: None,
        };
        Ok((raw, logs))
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy,
        tcp_proxy::{ClusterSpecifier, WeightedCluster, weighted_cluster::ClusterWeight},
    };

    #[test]
    fn weighted_clusters_come_over_xds_and_metadata_matches_are_refused() {
        let weighted = |metadata: bool| TcpProxy {
            stat_prefix: "tcp".into(),
            cluster_specifier: Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters: vec![
                    ClusterWeight {
                        name: "a".into(),
                        weight: 3,
                        metadata_match: metadata.then(Default::default),
                    },
                    ClusterWeight {
                        name: "b".into(),
                        weight: 1,
                        metadata_match: None,
                    },
                ],
            })),
            ..Default::default()
        };
        let any = |tcp: &TcpProxy| envoy_types::pb::google::protobuf::Any {
            type_url: super::xds::TYPE_URL.into(),
            value: prost::Message::encode_to_vec(tcp),
        };
        let (raw, _) = super::xds::tcp_proxy(&any(&weighted(false)), "t").expect("taken");
        assert!(raw.cluster.is_empty());
        let pairs: Vec<(&str, u32)> = (raw.weighted_clusters.iter())
            .map(|w| (w.cluster.as_str(), w.weight))
            .collect();
        assert_eq!(pairs, [("a", 3), ("b", 1)]);
        let error = super::xds::tcp_proxy(&any(&weighted(true)), "t").expect_err("refused");
        assert!(error.to_string().contains("metadata_match"), "{error}");
    }

    #[test]
    fn hash_policy_and_access_log_come_over_xds() {
        use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
        use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
        use envoy_types::pb::envoy::r#type::v3::{HashPolicy, hash_policy};
        let relay = |policy: hash_policy::PolicySpecifier| {
            TcpProxy {
            stat_prefix: "tcp".into(),
            cluster_specifier: Some(ClusterSpecifier::Cluster("c".into())),
            hash_policy: vec![HashPolicy {
                policy_specifier: Some(policy),
            }],
            access_log: vec![AccessLog {
                name: "envoy.access_loggers.file".into(),
                config_type: Some(access_log::ConfigType::TypedConfig(
                    envoy_types::pb::google::protobuf::Any {
                        type_url: "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog".into(),
                        value: prost::Message::encode_to_vec(&FileAccessLog {
                            path: "/dev/stdout".into(),
                            ..Default::default()
                        }),
                    },
                )),
                ..Default::default()
            }],
            ..Default::default()
        }
        };
        let any = |tcp: &TcpProxy| envoy_types::pb::google::protobuf::Any {
            type_url: super::xds::TYPE_URL.into(),
            value: prost::Message::encode_to_vec(tcp),
        };
        let source_ip = hash_policy::PolicySpecifier::SourceIp(Default::default());
        let (raw, logs) = super::xds::tcp_proxy(&any(&relay(source_ip)), "t").expect("taken");
        assert_eq!(raw.hash_policy, Some(super::TcpHashPolicy::SourceIp));
        assert_eq!(logs.len(), 1);
        let state = hash_policy::PolicySpecifier::FilterState(Default::default());
        let error = super::xds::tcp_proxy(&any(&relay(state)), "t").expect_err("refused");
        assert!(error.to_string().contains("filter_state"), "{error}");
    }
}
