//! Resources from a management server (xDS) as config sections.
//!
//! A Listener, RouteConfiguration, Cluster or ClusterLoadAssignment is decoded and checked
//! once, when it arrives ([`XdsListener::decode`] and the others): a field that would change
//! behaviour and that Legate does not honour makes the resource invalid (the response is
//! NACKed), never silently ignored. [`Resources`] holds what was accepted, by type and name,
//! and [`Resources::sections`] joins it into listeners and clusters as the config file would
//! write them, which are then validated with the file's own ([`compose`]). Clusters are
//! checked as their sections are made, each once while what it is made from stays the same,
//! so a change costs the clusters it touches. docs/xds.md lists the fields honoured.
//!
//! Each resource's mapping is in its topic, beside the settings it becomes:
//!
//! ```text
//! xds/mod.rs                    the bootstrap keys, the resources held, joining them into sections
//! envoy/                        decoding Envoy's messages; field names, to name what is refused
//! listener/xds.rs               Listener + HttpConnectionManager -> a listener (routes inline or by RDS)
//! route/xds.rs, xds_actions.rs  RouteConfiguration -> virtual hosts and routes
//! cluster/xds.rs                Cluster -> a cluster (endpoints inline, or by EDS name)
//! cluster/xds_endpoints.rs      ClusterLoadAssignment -> endpoints
//! filters/ext_authz/xds.rs      the ext_authz filter (gRPC) and its per-route settings
//! tls/xds.rs                    TLS transport sockets -> a listener's or a cluster's `tls`
//! tls/sds.rs                    Secret -> certificates and CAs those name (SDS)
//! ```

mod shared_map;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Serialize;

use serde::Deserialize;

use crate::cluster::xds::ReadyClusters;
pub use crate::cluster::xds::XdsCluster;
pub use crate::cluster::xds_endpoints::XdsEndpoints;
pub use crate::listener::xds::XdsListener;
pub use crate::route::xds::XdsRoutes;
pub use crate::tls::sds::XdsSecret;
use crate::{ClusterConfig, ConfigError, RawConfig, RawListener, ServiceEndpoint};

pub use crate::envoy::{Held, ResourceError, digest, type_url};
pub use shared_map::SharedMap;

/// `node` and `dynamic_resources.ads`: the management server this proxy takes listeners,
/// routes, clusters and endpoints from, and who it says it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct XdsConfig {
    pub node: NodeConfig,
    #[serde(serialize_with = "super::serialize::display")]
    pub address: ServiceEndpoint,
    pub protocol: AdsProtocol,
    /// TLS to the server, with a client certificate if it asks for one (mutual TLS); its
    /// files are read again for each new connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<crate::ClusterTlsConfig>,
    /// The largest response read, in bytes: a longer one is refused before it is buffered
    /// (the stream ends, the config in force stays).
    pub max_message_size: u64,
}

/// The default `ads.max_message_size`: a whole fleet's clusters fit in one response.
pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 256 << 20;
/// Bounds on `ads.max_message_size`: below, one ordinary cluster would not fit; above, a
/// single response could take gigabytes before it is parsed.
const MAX_MESSAGE_SIZE_RANGE: (u64, u64) = (64 << 10, 2 << 30);

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeConfig {
    pub id: String,
    pub cluster: String,
}

/// The variant of the ADS protocol spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AdsProtocol {
    /// State of the world.
    Sotw,
    /// Incremental.
    Delta,
}

pub(crate) fn bootstrap(
    node: Option<RawNode>,
    dynamic: Option<RawDynamicResources>,
) -> Result<Option<XdsConfig>, ConfigError> {
    let Some(RawDynamicResources {
        ads:
            RawAds {
                address,
                protocol,
                tls,
                max_message_size,
            },
    }) = dynamic
    else {
        if node.is_some_and(|n| n.locality.is_none()) {
            tracing::debug!("`node` is given without `dynamic_resources`; it has no use");
        }
        return Ok(None);
    };
    let Some(node) = node else {
        return Err(ConfigError::invalid(
            "node",
            "`dynamic_resources` needs `node: { id, cluster }`: the management server knows this proxy by it",
        ));
    };
    if node.id.is_empty() {
        return Err(ConfigError::invalid("node.id", "expected a non-empty id"));
    }
    let address = crate::values::service_endpoint(&address, "dynamic_resources.ads.address")?;
    let protocol = match protocol.as_deref() {
        None | Some("sotw") => AdsProtocol::Sotw,
        Some("delta") => AdsProtocol::Delta,
        Some(other) => {
            return Err(ConfigError::invalid(
                "dynamic_resources.ads.protocol",
                format!("expected `sotw` or `delta`, found `{other}`"),
            ));
        }
    };
    let tls = match tls {
        None => None,
        Some(_) if matches!(address, ServiceEndpoint::Unix(_)) => {
            return Err(ConfigError::invalid(
                "dynamic_resources.ads.tls",
                "TLS is for a TCP address, not a Unix socket",
            ));
        }
        Some(raw) => Some(crate::tls::check::cluster_tls(
            raw,
            "dynamic_resources.ads.tls",
        )?),
    };
    let max_message_size = max_message_size.unwrap_or(DEFAULT_MAX_MESSAGE_SIZE);
    let (least, most) = MAX_MESSAGE_SIZE_RANGE;
    if !(least..=most).contains(&max_message_size) {
        return Err(ConfigError::invalid(
            "dynamic_resources.ads.max_message_size",
            format!("expected 64KiB to 2GiB, found {max_message_size} bytes"),
        ));
    }
    Ok(Some(XdsConfig {
        node: NodeConfig {
            id: node.id,
            cluster: node.cluster.unwrap_or_default(),
        },
        address,
        protocol,
        tls,
        max_message_size,
    }))
}

/// Everything accepted from the management server, by type and name. A clone shares
/// every map until it changes one: the next generation is made from a clone, and a change
/// copies only the maps it touches.
#[derive(Debug, Default, Clone)]
pub struct Resources {
    pub listeners: SharedMap<String, Held<XdsListener>>,
    pub routes: SharedMap<String, Held<XdsRoutes>>,
    pub clusters: SharedMap<String, Held<XdsCluster>>,
    pub endpoints: SharedMap<String, Held<XdsEndpoints>>,
    pub secrets: SharedMap<String, Held<XdsSecret>>,
    /// The last version of each listener that had its routes: a listener updated to name a
    /// route configuration that has not arrived keeps serving with it (Envoy's warming).
    serving: SharedMap<String, Held<XdsListener>>,
    /// The same for clusters: one updated to name endpoints or secrets that have not arrived
    /// keeps serving as it was.
    serving_clusters: SharedMap<String, Held<XdsCluster>>,
    /// Each cluster's section as last checked, kept while what it is made from stays the
    /// same: a change to one route or one cluster checks that one again, not all of them.
    checked: SharedMap<String, crate::cluster::xds::CheckedCluster>,
    /// The names last gathered from the listeners and clusters, with the stamps of the maps
    /// they came from: a route or endpoint change (most of a fleet's changes) names nothing
    /// new, and a thousand clusters are not walked again for it.
    gathered: Option<(NameSources, Arc<Named>)>,
    /// The clusters last made ready, with the stamps of the maps they were made from: a
    /// route or listener change makes the same again, and a thousand clusters are not
    /// walked for it.
    clusters_made: Option<ClustersMade>,
    /// The stamps of listeners, serving, clusters and serving clusters when the earlier
    /// versions of those gone were last dropped: while they stay, none is to drop.
    serving_retained: Option<[u64; 4]>,
    /// The endpoints' stamp, and those of what names them, when the endpoints nothing
    /// names were last dropped.
    endpoints_retained: Option<(u64, NameSources)>,
    /// The routes of the listeners' chains as last checked (shared by the clones: what it
    /// keeps is known by what it was made from).
    route_memo: Arc<std::sync::Mutex<crate::route::memo::RouteMemo>>,
}

/// The stamps of the maps clusters are made from (clusters, serving clusters, endpoints,
/// secrets, checked clusters).
type ClusterSources = [u64; 5];

#[cfg(test)]
thread_local! {
    /// How often this thread made the clusters ready: the tests see when they were kept.
    static CLUSTERS_MADE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A hash of the resources something is made from: each by kind, name and digest.
struct InputHash(twox_hash::XxHash64);

impl Default for InputHash {
    fn default() -> Self {
        Self(twox_hash::XxHash64::with_seed(0))
    }
}

impl InputHash {
    fn add(&mut self, kind: u8, name: &str, digest: u64) {
        use std::hash::Hasher;
        self.0.write_u8(kind);
        self.0.write_usize(name.len());
        self.0.write(name.as_bytes());
        self.0.write_u64(digest);
    }

    fn finish(&self) -> u64 {
        std::hash::Hasher::finish(&self.0)
    }
}

/// The clusters ready to serve, and those left out while they warm.
#[derive(Debug, Clone)]
struct ClustersMade {
    from: ClusterSources,
    clusters: Vec<Arc<ClusterConfig>>,
    warming: Vec<String>,
    /// A hash of the resources they were made from (names and digests).
    digest: u64,
    /// A hash of what a route's section reads of them: the names of those ready and
    /// whether each speaks HTTP/1.1. Endpoints changing leave it (and the routes) as is.
    routing: u64,
}

/// The stamps of the maps names are gathered from (listeners, serving, clusters, serving
/// clusters).
type NameSources = [u64; 4];

/// The names the listeners and clusters give (and the earlier versions of them still
/// serving): what to subscribe to. Shared: each set goes to the xDS client as it is.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Named {
    /// Route configurations (RDS).
    pub routes: Arc<BTreeSet<String>>,
    /// Endpoint sets (EDS).
    pub endpoints: Arc<BTreeSet<String>>,
    /// Secrets asked of the management server (SDS).
    pub secrets: Arc<BTreeSet<String>>,
    /// Secrets read from files, by their keys: never asked of the server.
    pub file_secrets: BTreeSet<String>,
}

impl Named {
    fn of(
        listeners: &BTreeMap<String, Held<XdsListener>>,
        serving: &BTreeMap<String, Held<XdsListener>>,
        clusters: &BTreeMap<String, Held<XdsCluster>>,
        serving_clusters: &BTreeMap<String, Held<XdsCluster>>,
    ) -> Self {
        let listeners = || listeners.values().chain(serving.values());
        let clusters = || clusters.values().chain(serving_clusters.values());
        let owned = |names: BTreeSet<&str>| names.into_iter().map(str::to_owned).collect();
        let (file_secrets, secrets): (BTreeSet<&str>, BTreeSet<&str>) = (listeners()
            .flat_map(|l| l.value.secret_names()))
        .chain(clusters().flat_map(|c| c.value.secret_names()))
        .partition(|name| crate::tls::sds_file::is_file_secret(name));
        Self {
            routes: Arc::new(owned(
                listeners().flat_map(|l| l.value.route_names()).collect(),
            )),
            endpoints: Arc::new(owned(
                clusters().filter_map(|c| c.value.eds.as_deref()).collect(),
            )),
            secrets: Arc::new(owned(secrets)),
            file_secrets: owned(file_secrets),
        }
    }

    /// Whether a secret of this name (from the server or a file) is named.
    fn names_secret(&self, name: &str) -> bool {
        self.secrets.contains(name) || self.file_secrets.contains(name)
    }
}

/// What [`Resources::sections`] makes: the listeners and clusters to put in force.
#[derive(Debug, Default)]
pub struct Sections {
    pub listeners: Vec<RawListener>,
    /// Checked already: shared with the config in force while they stay the same.
    pub clusters: Vec<Arc<ClusterConfig>>,
    pub warming: Warming,
    /// A hash of the resources the sections were made from (names and digests): equal
    /// inputs make equal sections, so an update that changes none of them needs no swap.
    pub inputs: u64,
}

/// What [`Resources::sections`] left out, and why.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Warming {
    /// Clusters waiting for their endpoints (EDS) or secrets (SDS).
    pub clusters: Vec<String>,
    /// Listeners waiting for their routes (RDS) or secrets (SDS).
    pub listeners: Vec<String>,
}

impl Resources {
    /// What the listeners and clusters name, and the earlier versions of them still
    /// serving while one warms: as last gathered while none of them has changed since.
    fn named(&self) -> Arc<Named> {
        match &self.gathered {
            Some((from, named)) if *from == self.name_sources() => Arc::clone(named),
            _ => Arc::new(Named::of(
                &self.listeners,
                &self.serving,
                &self.clusters,
                &self.serving_clusters,
            )),
        }
    }

    /// [`Self::named`], kept for the next change.
    fn gather_names(&mut self) -> Arc<Named> {
        let named = self.named();
        self.gathered = Some((self.name_sources(), Arc::clone(&named)));
        named
    }

    fn name_sources(&self) -> NameSources {
        [
            self.listeners.stamp(),
            self.serving.stamp(),
            self.clusters.stamp(),
            self.serving_clusters.stamp(),
        ]
    }

    /// Forgets route configurations and endpoints nothing names any more: they are
    /// unsubscribed, and would otherwise linger (and show in `/config_dump`) forever.
    pub fn retain_wanted(&mut self) {
        self.drop_gone_serving();
        let named = self.gather_names();
        self.routes
            .retain_changed(|name, _| named.routes.contains(name));
        // A thousand endpoint sets are looked at again only when they or the names changed.
        if self.endpoints_retained != Some((self.endpoints.stamp(), self.name_sources())) {
            self.endpoints
                .retain_changed(|name, _| named.endpoints.contains(name));
            self.endpoints_retained = Some((self.endpoints.stamp(), self.name_sources()));
        }
        self.secrets
            .retain_changed(|name, _| named.names_secret(name));
    }

    /// Forgets the earlier versions of listeners and clusters that are gone; looks again
    /// only when one of those maps changed.
    fn drop_gone_serving(&mut self) {
        let from = |r: &Self| {
            [
                r.listeners.stamp(),
                r.serving.stamp(),
                r.clusters.stamp(),
                r.serving_clusters.stamp(),
            ]
        };
        if self.serving_retained == Some(from(self)) {
            return;
        }
        self.serving
            .retain_changed(|name, _| self.listeners.contains_key(name));
        self.serving_clusters
            .retain_changed(|name, _| self.clusters.contains_key(name));
        self.serving_retained = Some(from(self));
    }

    /// The names to ask the management server for (RDS, EDS and SDS subscriptions), and
    /// the secrets to read from files.
    pub fn subscriptions(&self) -> Arc<Named> {
        self.named()
    }

    /// The secrets read from files that are named, by their keys.
    pub fn file_secret_names(&self) -> BTreeSet<String> {
        self.named().file_secrets.clone()
    }

    fn cluster_sources(&self) -> ClusterSources {
        [
            self.clusters.stamp(),
            self.serving_clusters.stamp(),
            self.endpoints.stamp(),
            self.secrets.stamp(),
            self.checked.stamp(),
        ]
    }

    /// The clusters ready to serve, each checked once per change of what it is made from.
    fn make_clusters(&mut self) -> Result<ClustersMade, ConfigError> {
        use std::hash::Hasher;
        #[cfg(test)]
        CLUSTERS_MADE.with(|n| n.set(n.get() + 1));
        let mut inputs = InputHash::default();
        let mut input = |kind, name: &str, digest| inputs.add(kind, name, digest);
        let mut warming = Vec::new();
        let mut clusters = Vec::with_capacity(self.clusters.len());
        // Clusters checked again, and those in force (sorted: the map's order); the map of
        // checked clusters is changed only when one of them is new or gone.
        let mut rechecked = Vec::new();
        let mut in_force: Vec<&str> = Vec::with_capacity(self.clusters.len());
        for (name, held) in self.clusters.iter() {
            let warm = |c: &XdsCluster| {
                c.secrets_ready(&self.secrets)
                    && c.eds
                        .as_ref()
                        .is_none_or(|s| self.endpoints.contains_key(s))
            };
            let cluster = if warm(&held.value) {
                if self.serving_clusters.get(name).map(|s| s.digest) != Some(held.digest) {
                    self.serving_clusters.insert(name.clone(), held.clone());
                }
                held
            } else {
                warming.push(name.clone());
                match self.serving_clusters.get(name) {
                    Some(previous) if warm(&previous.value) => previous,
                    _ => continue,
                }
            };
            let endpoints = cluster.value.eds.as_ref().and_then(|service| {
                let e = self.endpoints.get(service)?;
                input(0, service, e.digest);
                Some(e)
            });
            input(1, name, cluster.digest);
            let made_from = {
                let mut h = twox_hash::XxHash64::with_seed(0);
                h.write_u64(cluster.digest);
                h.write_u64(endpoints.map_or(0, |e| e.digest));
                for secret in cluster.value.secret_names() {
                    h.write_u64(self.secrets.get(secret).map_or(0, |s| s.digest));
                }
                h.finish()
            };
            match self.checked.get(name) {
                Some(kept) if kept.inputs == made_from => clusters.push(Arc::clone(&kept.config)),
                _ => {
                    let endpoints = endpoints.map(|e| &*e.value);
                    let Some(raw) = cluster.value.section(endpoints, &self.secrets) else {
                        continue;
                    };
                    let checked = crate::cluster::xds::CheckedCluster::new(raw, made_from)?;
                    clusters.push(Arc::clone(&checked.config));
                    rechecked.push((name.clone(), checked));
                }
            }
            in_force.push(name);
        }
        if !rechecked.is_empty() || self.checked.len() != in_force.len() {
            let checked = &mut *self.checked;
            checked.extend(rechecked);
            checked.retain(|name, _| in_force.binary_search(&name.as_str()).is_ok());
        }
        let routing = crate::route::memo::ready_stamp(
            (in_force.iter()).map(|name| (*name, self.checked.http1(name) == Some(true))),
        );
        Ok(ClustersMade {
            from: self.cluster_sources(),
            clusters,
            warming,
            digest: inputs.finish(),
            routing,
        })
    }

    /// The listeners and clusters to put beside the file's, as the file would write them. A
    /// cluster is left out until its endpoints and secrets have arrived, a listener until its
    /// routes and secrets have (an earlier version of it that had them keeps serving
    /// meanwhile); a route to a cluster that is not there answers 503, as Envoy's does.
    /// Clusters are checked here, each once per change of what it is made from; an error
    /// names the cluster.
    pub fn sections(&mut self) -> Result<Sections, ConfigError> {
        let mut inputs = InputHash::default();
        let mut input = |kind, name: &str, digest| inputs.add(kind, name, digest);
        let mut warming = Warming::default();
        // A secret named changes the config when it changes (one nothing names is forgotten
        // after this, and changes nothing).
        if !self.secrets.is_empty() {
            let named = self.gather_names();
            for (name, held) in &self.secrets {
                if named.names_secret(name) {
                    input(4, name, held.digest);
                }
            }
        }
        self.drop_gone_serving();
        let made = match &self.clusters_made {
            Some(made) if made.from == self.cluster_sources() => made,
            _ => {
                let made = self.make_clusters()?;
                &*self.clusters_made.insert(made)
            }
        };
        // What the clusters were made from.
        input(0, "", made.digest);
        warming.clusters.clone_from(&made.warming);
        let clusters = made.clusters.clone();
        let ready: &BTreeMap<String, crate::cluster::xds::CheckedCluster> = &self.checked;
        let mut memo = (self.route_memo.lock()).unwrap_or_else(std::sync::PoisonError::into_inner);
        memo.begin();
        let mut listeners = Vec::with_capacity(self.listeners.len());
        for (name, held) in &self.listeners {
            let warm = |l: &XdsListener| {
                let routes = l.route_names().all(|r| self.routes.contains_key(r));
                let single = |c| ready.single_host(c).is_some();
                let authz = l.authz_clusters().all(single);
                let collector = l.tracing_clusters().all(single);
                let logs = l.log_clusters().all(single);
                let secrets = l.secrets_ready(&self.secrets);
                // A relay's cluster must be there: the config refers to it; so must the
                // clusters key sets are fetched through.
                let tcp = l.tcp_clusters().all(|c| ready.http1(c).is_some());
                let jwks = l.jwks_clusters().all(|c| ready.http1(c).is_some());
                routes && authz && collector && logs && secrets && tcp && jwks
            };
            let listener = if warm(&held.value) {
                if self.serving.get(name).map(|s| s.digest) != Some(held.digest) {
                    self.serving.insert(name.clone(), held.clone());
                }
                held
            } else {
                warming.listeners.push(name.clone());
                match self.serving.get(name) {
                    Some(previous) if warm(&previous.value) => previous,
                    _ => continue,
                }
            };
            input(2, name, listener.digest);
            for name in listener.value.route_names() {
                if let Some(held) = self.routes.get(name) {
                    input(3, name, held.digest);
                }
            }
            let routes = |name: &str| self.routes.get(name).map(|held| &*held.value);
            let made_from = crate::route::memo::Inputs {
                listener: listener.digest,
                clusters: made.routing,
            };
            let memo = Some((&mut *memo, made_from));
            if let Some(section) = listener.value.section(&routes, ready, &self.secrets, memo) {
                listeners.push(section);
            }
        }
        memo.end();
        Ok(Sections {
            listeners,
            clusters,
            warming,
            inputs: inputs.finish(),
        })
    }
}

/// The file's config with `listeners` and `clusters` from the management server beside its
/// own, validated as one. An error names a resource from the server by its name.
pub fn compose(
    origin: &Arc<RawConfig>,
    listeners: Vec<RawListener>,
    clusters: Vec<Arc<ClusterConfig>>,
) -> Result<super::Config, ConfigError> {
    let mut raw = RawConfig::clone(origin);
    let (own_listeners, own_clusters) = (raw.listeners.len(), raw.clusters.len());
    let listener_names = listeners.iter().map(|l| l.name.clone()).collect::<Vec<_>>();
    // Shared, not copied: only an error reads their names.
    let cluster_names = clusters.clone();
    raw.listeners.extend(listeners);
    super::validate::validate(raw, Arc::clone(origin), clusters).map_err(|error| match error {
        ConfigError::Invalid { path, message } => ConfigError::Invalid {
            path: rename(&path, "listeners", own_listeners, "listener", |i| {
                listener_names.get(i).map(String::as_str)
            })
            .or_else(|| {
                rename(&path, "clusters", own_clusters, "cluster", |i| {
                    cluster_names.get(i).map(|c| c.name.as_str())
                })
            })
            .unwrap_or(path),
            message,
        },
        other => other,
    })
}

/// `listeners[7].routes[0]` -> ``listener `web`.routes[0]`` when listener 7 is the server's.
fn rename<'a>(
    path: &str,
    key: &str,
    own: usize,
    kind: &str,
    name_of: impl Fn(usize) -> Option<&'a str>,
) -> Option<String> {
    let rest = path.strip_prefix(key)?.strip_prefix('[')?;
    let (index, rest) = rest.split_once(']')?;
    let name = name_of(index.parse::<usize>().ok()?.checked_sub(own)?)?;
    Some(format!("{kind} `{name}`{rest}"))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNode {
    #[serde(default)]
    pub id: String,
    pub cluster: Option<String>,
    /// Where this proxy runs, for zone-aware routing.
    pub locality: Option<crate::cluster::local::RawLocality>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDynamicResources {
    pub ads: RawAds,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAds {
    /// `IP:PORT` or `unix:/path`.
    pub address: String,
    /// `sotw` (the default) or `delta`.
    pub protocol: Option<String>,
    /// As a cluster's `tls`: `ca`, `client_certificate`, `server_name`, `min_version`.
    pub tls: Option<crate::RawClusterTls>,
    /// A size (`4MiB`): the largest response read.
    #[serde(default, deserialize_with = "crate::units::de_opt_size")]
    pub max_message_size: Option<u64>,
}
