//! The config file's top level as written: serde structs that reject unknown keys. Nothing
//! here is trusted yet; `validate.rs` turns it into [`super::Config`]. Each section's own form
//! is in its topic (`listener/raw.rs`, `cluster/raw.rs`, `filters/<name>.rs`, ...).

use std::time::Duration;

use serde::Deserialize;

use crate::units::de_opt_duration;
use crate::*;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub concurrency: Option<RawConcurrency>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub drain_timeout: Option<Duration>,
    #[serde(default)]
    pub admin: Option<RawAdmin>,
    pub max_connections: Option<u64>,
    #[serde(default)]
    pub overload: Option<super::RawOverload>,
    #[serde(default)]
    pub watch: bool,
    pub stats: Option<RawStats>,
    pub tracing: Option<RawTracing>,
    #[serde(default)]
    pub listeners: Vec<RawListener>,
    #[serde(default)]
    pub clusters: Vec<RawCluster>,
    /// Who this proxy is to a management server.
    pub node: Option<RawNode>,
    /// Where listeners, routes, clusters and endpoints come from besides this file.
    pub dynamic_resources: Option<RawDynamicResources>,
    /// The proxy's own fleet, for zone-aware routing.
    pub cluster_manager: Option<crate::cluster::local::RawClusterManager>,
}

/// `concurrency: auto` or a number of workers.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum RawConcurrency {
    Workers(u64),
    Word(String),
}
