//! The local cluster: the proxy's own fleet, by locality, and the locality this proxy runs in
//! (Envoy's `cluster_manager.local_cluster_name` and `node.locality`). Clusters route by zone
//! from it (`zone_aware`).

use serde::{Deserialize, Serialize};

use crate::{ClusterConfig, ConfigError};

/// `cluster_manager` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClusterManager {
    /// The cluster whose hosts are this proxy's fleet.
    pub local_cluster_name: String,
}

/// A locality as Envoy writes it: `region`, `zone`, `sub_zone`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLocality {
    #[serde(default)]
    pub region: String,
    #[serde(default)]
    pub zone: String,
    #[serde(default)]
    pub sub_zone: String,
}

/// The name a locality goes by in endpoints: the region alone, or `region/zone/sub_zone`.
pub fn locality_name(region: &str, zone: &str, sub_zone: &str) -> String {
    if zone.is_empty() && sub_zone.is_empty() {
        region.to_owned()
    } else {
        format!("{region}/{zone}/{sub_zone}")
    }
}

/// The proxy's fleet and place, for zone-aware routing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LocalClusterConfig {
    /// The cluster of the fleet's hosts (from the file, or from the management server).
    pub name: String,
    /// This proxy's locality, named as endpoints name theirs.
    pub locality: String,
}

/// Checks `cluster_manager` against `node.locality` and the file's clusters; with a
/// management server, the cluster may come from it later.
pub(crate) fn local_cluster(
    manager: Option<RawClusterManager>,
    locality: Option<&RawLocality>,
    clusters: &[std::sync::Arc<ClusterConfig>],
    dynamic: bool,
) -> Result<Option<LocalClusterConfig>, ConfigError> {
    let Some(manager) = manager else {
        return Ok(None);
    };
    let name = manager.local_cluster_name;
    if name.is_empty() {
        return Err(ConfigError::invalid(
            "cluster_manager.local_cluster_name",
            "expected a cluster name",
        ));
    }
    if !dynamic && !clusters.iter().any(|c| c.name == name) {
        return Err(ConfigError::invalid(
            "cluster_manager.local_cluster_name",
            format!("no cluster is named `{name}`"),
        ));
    }
    let Some(locality) = locality else {
        return Err(ConfigError::invalid(
            "node.locality",
            "a local cluster needs this proxy's locality: `node: { locality: { region, zone, sub_zone } }`",
        ));
    };
    Ok(Some(LocalClusterConfig {
        name,
        locality: locality_name(&locality.region, &locality.zone, &locality.sub_zone),
    }))
}
