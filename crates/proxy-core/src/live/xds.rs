//! xDS: listeners, routes, clusters, endpoints and secrets from a management server, put in force
//! beside the file's like a reload. The ADS stream is `xds-client`'s; this side decodes each
//! response (`config::xds`), joins what is held into config sections, and swaps the config:
//! a response is ACKed once every worker can use it, and NACKed with the reason if it cannot
//! be put in force (the config in force then stays).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;
use xds_client::{Any, Options, Update, Variant};

use super::{DynamicSections, LiveConfig, XdsResourceStatus, XdsStatus};
use config::xds::{
    AdsProtocol, Held, ResourceError, Resources, XdsCluster, XdsEndpoints, XdsListener, XdsRoutes,
    XdsSecret, digest, type_url,
};

/// The running client; dropping it ends the stream.
pub(crate) struct XdsClient {
    _stop: oneshot::Sender<()>,
}

/// Starts the client on a thread of its own when the config names a management server.
pub(crate) fn start(live: &Arc<LiveConfig>) -> std::io::Result<Option<XdsClient>> {
    let Some(config) = live.current().config.xds.clone() else {
        return Ok(None);
    };
    let variant = match config.protocol {
        AdsProtocol::Sotw => Variant::StateOfTheWorld,
        AdsProtocol::Delta => Variant::Delta,
    };
    let mut options = Options::new(
        config.address,
        variant,
        xds_client::node(&config.node.id, &config.node.cluster),
    );
    options.tls = config.tls.map(ads_tls);
    let applier = Applier::new(live);
    let (stop, stopped) = oneshot::channel::<()>();
    let runtime = crate::runtime::current_thread_runtime()?;
    std::thread::Builder::new()
        .name("legate-xds".into())
        .spawn(move || {
            runtime.block_on(async move {
                tokio::select! {
                    () = xds_client::run(options, applier) => {}
                    _ = stopped => {}
                }
            });
        })?;
    Ok(Some(XdsClient { _stop: stop }))
}

/// TLS to the management server: the files read again for each connection, so that a
/// rotated client certificate or CA is used from the next reconnect on.
fn ads_tls(spec: config::ClusterTlsConfig) -> xds_client::Tls {
    let server_name = spec.server_name.clone();
    let config = move || -> Result<rustls::ClientConfig, String> {
        use config::tls::material::{client_config, load_roots};
        let roots = match &spec.ca {
            Some(ca) => load_roots(ca).map_err(|e| e.to_string())?,
            None => crate::tls::system_roots(),
        };
        client_config(&spec, roots).map_err(|e| e.to_string())
    };
    xds_client::Tls {
        config: Arc::new(config),
        server_name,
    }
}

/// The resource types, for stats labels and `/config_dump`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Listener,
    Route,
    Cluster,
    Endpoint,
    Secret,
}

impl Kind {
    fn of(type_url: &str) -> Option<Kind> {
        Some(match type_url {
            type_url::LISTENER => Kind::Listener,
            type_url::ROUTE => Kind::Route,
            type_url::CLUSTER => Kind::Cluster,
            type_url::ENDPOINT => Kind::Endpoint,
            type_url::SECRET => Kind::Secret,
            _ => return None,
        })
    }

    /// Envoy's short name for the service: the stats label.
    fn label(self) -> &'static str {
        match self {
            Kind::Listener => "lds",
            Kind::Route => "rds",
            Kind::Cluster => "cds",
            Kind::Endpoint => "eds",
            Kind::Secret => "sds",
        }
    }
}

struct Stats {
    connected: stats::Gauge,
    /// attempt, success, rejected; by kind.
    counters: Vec<(Kind, [stats::Counter; 3])>,
    /// attempt, success, rejected; by secret (Envoy's `sds.<name>.update_*`), made as
    /// secrets are first named.
    secrets: BTreeMap<String, [stats::Counter; 3]>,
}

struct Applier {
    live: Weak<LiveConfig>,
    resources: Resources,
    /// [`config::xds::Sections::inputs`] of the sections in force.
    in_force: u64,
    stats: Stats,
    status: XdsStatus,
}

impl Applier {
    fn new(live: &Arc<LiveConfig>) -> Self {
        let process = &live.stats().process;
        let catalog = &live.stats().catalog;
        let kinds = [
            Kind::Listener,
            Kind::Route,
            Kind::Cluster,
            Kind::Endpoint,
            Kind::Secret,
        ];
        let counters = kinds
            .into_iter()
            .map(|kind| {
                let label = [kind.label()];
                (
                    kind,
                    [
                        process.counter(catalog.xds_update_attempt, &label),
                        process.counter(catalog.xds_update_success, &label),
                        process.counter(catalog.xds_update_rejected, &label),
                    ],
                )
            })
            .collect();
        let stats = Stats {
            connected: process.gauge(catalog.control_plane_connected, &[]),
            counters,
            secrets: BTreeMap::new(),
        };
        let applier = Self {
            live: Arc::downgrade(live),
            resources: Resources::default(),
            // Nothing from the server is in force at first: the sections of nothing.
            in_force: Resources::default().sections().inputs,
            stats,
            status: XdsStatus::default(),
        };
        live.set_xds_status(applier.status.clone());
        applier
    }

    fn count(&self, kind: Kind, which: usize) {
        if let Some((_, counters)) = self.stats.counters.iter().find(|(k, _)| *k == kind) {
            counters[which].inc();
        }
    }

    /// Counts `which` (attempt, success, rejected) for each secret in an SDS response.
    fn count_secrets(&mut self, names: &[String], which: usize) {
        let Some(live) = self.live.upgrade() else {
            return;
        };
        let (process, catalog) = (&live.stats().process, &live.stats().catalog);
        for name in names {
            let counters = self.stats.secrets.entry(name.clone()).or_insert_with(|| {
                let label = [name.as_str()];
                [
                    process.counter(catalog.sds_update_attempt, &label),
                    process.counter(catalog.sds_update_success, &label),
                    process.counter(catalog.sds_update_rejected, &label),
                ]
            });
            counters[which].inc();
        }
    }

    fn publish(&mut self) {
        let unix = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
        };
        let mut resources = Vec::new();
        fn list<T>(
            out: &mut Vec<XdsResourceStatus>,
            kind: &'static str,
            map: &BTreeMap<String, Held<T>>,
            unix: impl Fn(std::time::SystemTime) -> u64,
        ) {
            out.extend(map.iter().map(|(name, held)| XdsResourceStatus {
                kind,
                name: name.clone(),
                version: held.version.clone(),
                last_updated_unix: unix(held.updated),
            }));
        }
        list(&mut resources, "listener", &self.resources.listeners, unix);
        list(
            &mut resources,
            "route_configuration",
            &self.resources.routes,
            unix,
        );
        list(&mut resources, "cluster", &self.resources.clusters, unix);
        list(
            &mut resources,
            "cluster_load_assignment",
            &self.resources.endpoints,
            unix,
        );
        list(&mut resources, "secret", &self.resources.secrets, unix);
        self.status.resources = resources;
        if let Some(live) = self.live.upgrade() {
            live.set_xds_status(self.status.clone());
        }
    }

    async fn put_in_force(&mut self, kind: Kind, update: Update) -> Result<(), String> {
        let arrived = std::time::Instant::now();
        let Some(live) = self.live.upgrade() else {
            return Err("the proxy is stopping".into());
        };
        let mut next = self.resources.clone();
        let merged = match kind {
            Kind::Listener => merge(&mut next.listeners, &update, XdsListener::decode, |l| {
                &l.name
            }),
            Kind::Route => merge(&mut next.routes, &update, XdsRoutes::decode, |r| &r.name),
            Kind::Cluster => merge(&mut next.clusters, &update, XdsCluster::decode, |c| &c.name),
            Kind::Endpoint => merge(&mut next.endpoints, &update, XdsEndpoints::decode, |e| {
                &e.name
            }),
            Kind::Secret => merge(&mut next.secrets, &update, XdsSecret::decode, |s| &s.name),
        };
        merged.map_err(|e| e.to_string())?;
        let sections = next.sections();
        next.retain_wanted();
        // The same inputs make the same config: a response that repeats what is held (a
        // resend, a new version of unchanged bytes, a resource nothing uses) swaps nothing.
        if self.in_force != sections.inputs {
            live.put_dynamic(
                DynamicSections {
                    listeners: sections.listeners,
                    clusters: sections.clusters,
                },
                arrived,
            )
            .await
            .map_err(|e| e.to_string())?;
            self.in_force = sections.inputs;
        }
        self.resources = next;
        self.status.warming_clusters = sections.warming.clusters;
        self.status.warming_listeners = sections.warming.listeners;
        Ok(())
    }
}

/// Decodes `update`'s resources into `map`: all of them replace the map when the update is
/// complete; otherwise they are added or replaced, and the removed ones go. A resource whose
/// bytes are unchanged keeps its entry (and its update time).
fn merge<T>(
    map: &mut BTreeMap<String, Held<T>>,
    update: &Update,
    decode: fn(&Any) -> Result<T, ResourceError>,
    name: fn(&T) -> &String,
) -> Result<(), ResourceError> {
    let mut fresh = BTreeMap::new();
    for resource in &update.resources {
        let encoded = &resource.value.value;
        let value = decode(&resource.value)?;
        let key = name(&value).clone();
        // Delta removes and versions resources by the envelope's name: it must be the one
        // inside, or a later removal would miss.
        if !resource.name.is_empty() && resource.name != key {
            return Err(ResourceError::Invalid {
                at: format!("`{}`", resource.name),
                message: format!("the resource inside is named `{key}`"),
            });
        }
        let version = if resource.version.is_empty() {
            update.version_info.clone()
        } else {
            resource.version.clone()
        };
        let held = match map.get(&key) {
            Some(held) if held.digest == digest(encoded) => Held {
                version,
                ..held.clone()
            },
            _ => Held::new(value, version, encoded),
        };
        if fresh.insert(key.clone(), held).is_some() {
            return Err(ResourceError::Invalid {
                at: format!("`{key}`"),
                message: "named twice in one response".into(),
            });
        }
    }
    if update.complete {
        *map = fresh;
    } else {
        map.extend(fresh);
        for name in &update.removed {
            map.remove(name);
        }
    }
    Ok(())
}

impl xds_client::Handler for Applier {
    async fn apply(&mut self, update: Update) -> Result<(), String> {
        let Some(kind) = Kind::of(&update.type_url) else {
            return Err(format!("unexpected resource type {}", update.type_url));
        };
        self.count(kind, 0);
        let secrets: Vec<String> = match kind {
            Kind::Secret => (update.resources.iter())
                .filter_map(|r| {
                    (!r.name.is_empty())
                        .then(|| r.name.clone())
                        .or_else(|| XdsSecret::name_of(&r.value))
                })
                .collect(),
            _ => Vec::new(),
        };
        self.count_secrets(&secrets, 0);
        let result = self.put_in_force(kind, update).await;
        self.count_secrets(&secrets, if result.is_ok() { 1 } else { 2 });
        match &result {
            Ok(()) => {
                self.count(kind, 1);
                tracing::info!(kind = kind.label(), "xDS update applied");
            }
            Err(error) => {
                self.count(kind, 2);
                tracing::warn!(kind = kind.label(), %error, "xDS update rejected; the config in force stays");
                self.status.last_rejected = Some(format!("{}: {error}", kind.label()));
            }
        }
        self.publish();
        result
    }

    fn wanted(&self, type_url: &str) -> BTreeSet<String> {
        match Kind::of(type_url) {
            Some(Kind::Route) => self.resources.route_names(),
            Some(Kind::Endpoint) => self.resources.endpoint_names(),
            Some(Kind::Secret) => self.resources.secret_names(),
            _ => BTreeSet::new(),
        }
    }

    fn connected(&mut self, up: bool) {
        self.stats.connected.set(i64::from(up));
        self.status.connected = up;
        self.publish();
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy;
    use xds_client::Resource;

    use super::*;

    fn update(envelope: &str, inside: &str) -> Update {
        Update {
            type_url: type_url::CLUSTER.into(),
            complete: false,
            resources: vec![Resource {
                name: envelope.into(),
                version: "1".into(),
                value: testbed::xds::any(&testbed::resources::eds_cluster(
                    inside,
                    LbPolicy::RoundRobin,
                )),
            }],
            removed: Vec::new(),
            version_info: String::new(),
        }
    }

    #[test]
    fn a_delta_resource_is_known_by_the_name_inside_it() {
        let mut held = BTreeMap::new();
        merge(&mut held, &update("web", "web"), XdsCluster::decode, |c| {
            &c.name
        })
        .expect("the same name");
        assert_eq!(held["web"].version, "1");
        let error = merge(&mut held, &update("web", "api"), XdsCluster::decode, |c| {
            &c.name
        })
        .expect_err("another name");
        assert_eq!(
            error.to_string(),
            "`web`: the resource inside is named `api`"
        );
        assert_eq!(held.keys().collect::<Vec<_>>(), ["web"]);
    }
}
