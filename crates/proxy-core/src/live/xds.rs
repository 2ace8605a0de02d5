//! xDS: listeners, routes, clusters, endpoints and secrets from a management server, put in force
//! beside the file's like a reload. The ADS stream is `xds-client`'s; this side decodes each
//! response (`config::xds`), joins what is held into config sections, and swaps the config:
//! a response is ACKed once every worker can use it, and NACKed with the reason if it cannot
//! be put in force (the config in force then stays).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use tokio::sync::oneshot;
use xds_client::{Any, Options, Update, Variant};

use super::{HeldResources, LiveConfig, XdsStatus};
use config::xds::{
    AdsProtocol, Held, ResourceError, Resources, SharedMap, XdsCluster, XdsEndpoints, XdsListener,
    XdsRoutes, XdsSecret, digest, type_url,
};

/// How often the files of secrets read from files are read again for changes.
const FILE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

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
    // Validated at load to at most 2GiB.
    options.max_message_size = usize::try_from(config.max_message_size).unwrap_or(usize::MAX);
    let handler = Shared::new(live, Applier::new(live));
    let applier = Arc::clone(&handler.applier);
    let (stop, stopped) = oneshot::channel::<()>();
    let runtime = crate::runtime::current_thread_runtime()?;
    std::thread::Builder::new()
        .name("legate-xds".into())
        .spawn(move || {
            runtime.block_on(async move {
                // Secrets read from files change without the management server: polled.
                let files = async move {
                    let mut tick = tokio::time::interval(FILE_POLL);
                    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    loop {
                        tick.tick().await;
                        applier.lock().await.read_files().await;
                    }
                };
                tokio::select! {
                    () = xds_client::run(options, handler) => {}
                    () = files => {}
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
    /// attempt, success, rejected; by kind.
    counters: Vec<(Kind, [stats::Counter; 3])>,
    /// attempt, success, rejected; by secret (Envoy's `sds.<name>.update_*`), made as
    /// secrets are first named.
    secrets: BTreeMap<String, [stats::Counter; 3]>,
}

struct Applier {
    live: Weak<LiveConfig>,
    /// Shared with the config in force, which makes their sections again in a reload.
    resources: Arc<Resources>,
    /// [`config::xds::Sections::inputs`] of the sections in force.
    in_force: u64,
    stats: Stats,
    status: XdsStatus,
    /// Whether a stream is up; set by the stream's side, which does not wait for the lock.
    connected: Arc<std::sync::atomic::AtomicBool>,
    /// For each file secret whose files could not be read or checked, the digest of the
    /// error: a bad file is counted and logged once, not at every poll.
    file_rejected: BTreeMap<String, u64>,
    /// For each file secret whose checked contents the config could not take, their digest:
    /// not tried again until they change or the server sends an update.
    file_blocked: BTreeMap<String, u64>,
}

/// The stream's handler: the xDS state, shared with the poll of secrets read from files.
struct Shared {
    applier: Arc<tokio::sync::Mutex<Applier>>,
    /// What to subscribe to, as of the last update (asked between updates, without waiting).
    wanted: BTreeMap<&'static str, Arc<BTreeSet<String>>>,
    connected: Arc<std::sync::atomic::AtomicBool>,
    connected_gauge: stats::Gauge,
    too_large: stats::Counter,
    live: Weak<LiveConfig>,
}

impl Shared {
    fn new(live: &Arc<LiveConfig>, applier: Applier) -> Self {
        let (process, catalog) = (&live.stats().process, &live.stats().catalog);
        let mut shared = Self {
            wanted: BTreeMap::new(),
            connected: Arc::clone(&applier.connected),
            connected_gauge: process.gauge(catalog.control_plane_connected, &[]),
            too_large: process.counter(catalog.xds_response_too_large, &[]),
            live: Arc::downgrade(live),
            applier: Arc::new(tokio::sync::Mutex::new(applier)),
        };
        if let Ok(applier) = shared.applier.try_lock() {
            applier.refresh_wanted(&mut shared.wanted);
        }
        shared
    }
}

impl xds_client::Handler for Shared {
    async fn apply(&mut self, update: Update) -> Result<(), String> {
        let mut applier = self.applier.lock().await;
        let result = applier.apply(update, Source::Server).await;
        // A listener or cluster that names a secret in a file has it read at once.
        applier.read_files().await;
        applier.refresh_wanted(&mut self.wanted);
        result
    }

    fn wanted(&self, type_url: &str) -> Arc<BTreeSet<String>> {
        self.wanted.get(type_url).cloned().unwrap_or_default()
    }

    fn stream_ended(&mut self, error: &xds_client::StreamError) {
        if matches!(error, xds_client::StreamError::TooLarge(_)) {
            self.too_large.inc();
        }
    }

    fn connected(&mut self, up: bool) {
        self.connected_gauge.set(i64::from(up));
        self.connected
            .store(up, std::sync::atomic::Ordering::Relaxed);
        if let Some(live) = self.live.upgrade() {
            live.set_xds_connected(up);
        }
    }
}

/// Where an update comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The management server.
    Server,
    /// Files of secrets read from files.
    Files,
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
            counters,
            secrets: BTreeMap::new(),
        };
        let applier = Self {
            live: Arc::downgrade(live),
            resources: Arc::default(),
            // Nothing from the server is in force at first: the sections of nothing.
            in_force: Resources::default()
                .sections()
                .map_or(0, |sections| sections.inputs),
            stats,
            status: XdsStatus::default(),
            connected: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            file_rejected: BTreeMap::new(),
            file_blocked: BTreeMap::new(),
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
        self.status.resources = HeldResources(Arc::clone(&self.resources));
        self.status.connected = self.connected.load(std::sync::atomic::Ordering::Relaxed);
        if let Some(live) = self.live.upgrade() {
            live.set_xds_status(self.status.clone());
        }
    }

    async fn put_in_force(
        &mut self,
        kind: Kind,
        update: Update,
        source: Source,
    ) -> Result<(), String> {
        let arrived = std::time::Instant::now();
        let Some(live) = self.live.upgrade() else {
            return Err("the proxy is stopping".into());
        };
        let mut next = Resources::clone(&self.resources);
        let merged = match kind {
            Kind::Listener => merge(
                &mut next.listeners,
                &update,
                alone(XdsListener::decode),
                |l| &l.name,
            ),
            // A changed route table keeps what its unchanged routes were translated to.
            Kind::Route => merge(
                &mut next.routes,
                &update,
                |value, held| {
                    XdsRoutes::decode_after(value, |name| held.get(name).map(|h| &*h.value))
                },
                |r| &r.name,
            ),
            Kind::Cluster => merge(
                &mut next.clusters,
                &update,
                alone(XdsCluster::decode),
                |c| &c.name,
            ),
            Kind::Endpoint => merge(
                &mut next.endpoints,
                &update,
                alone(XdsEndpoints::decode),
                |e| &e.name,
            ),
            Kind::Secret if source == Source::Files => {
                merge(&mut next.secrets, &update, alone(XdsSecret::decode), |s| {
                    &s.name
                })
            }
            Kind::Secret => merge(&mut next.secrets, &update, alone(server_secret), |s| {
                &s.name
            }),
        };
        merged.map_err(|e| e.to_string())?;
        let sections = next.sections().map_err(|e| e.to_string())?;
        next.retain_wanted();
        let next = Arc::new(next);
        // The same inputs make the same config: a response that repeats what is held (a
        // resend, a new version of unchanged bytes, a resource nothing uses) swaps nothing.
        if self.in_force != sections.inputs {
            let dynamic = super::DynamicSections {
                resources: Arc::clone(&next),
                listeners: sections.listeners,
                clusters: sections.clusters,
            };
            live.put_dynamic(dynamic, arrived)
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

/// A decoder that does not look at what is held.
fn alone<T>(
    decode: fn(&Any) -> Result<T, ResourceError>,
) -> impl Fn(&Any, &SharedMap<String, Held<T>>) -> Result<T, ResourceError> {
    move |value, _| decode(value)
}

/// Decodes `update`'s resources into `map`: all of them replace the map when the update is
/// complete; otherwise they are added or replaced, and the removed ones go. A resource whose
/// bytes are unchanged keeps its entry (and its update time) and is not decoded again: a
/// state-of-the-world response repeats every resource to change one. `decode` is given
/// the resources held before.
fn merge<T>(
    map: &mut SharedMap<String, Held<T>>,
    update: &Update,
    decode: impl Fn(&Any, &SharedMap<String, Held<T>>) -> Result<T, ResourceError>,
    name: fn(&T) -> &String,
) -> Result<(), ResourceError> {
    // State of the world names resources only inside them: the same bytes are the same
    // resource, name included. Secrets (few, small) are always decoded: a server's must be
    // checked not to stand for a file's.
    let shortcut = update.type_url != type_url::SECRET;
    let by_digest: std::collections::HashMap<u64, (&String, &Held<T>)> =
        if shortcut && update.resources.iter().any(|r| r.name.is_empty()) {
            map.iter()
                .map(|(name, held)| (held.digest, (name, held)))
                .collect()
        } else {
            std::collections::HashMap::new()
        };
    let mut fresh = BTreeMap::new();
    for resource in &update.resources {
        let encoded = &resource.value.value;
        let seen = digest(encoded);
        let version = if resource.version.is_empty() {
            update.version_info.clone()
        } else {
            resource.version.clone()
        };
        // Decoding checks the type too: the same bytes under another type are decoded (and
        // refused) as before.
        let unchanged = match resource.name.as_str() {
            _ if !shortcut || resource.value.type_url != update.type_url => None,
            "" => by_digest.get(&seen).copied(),
            named => map.get_key_value(named),
        }
        .filter(|(_, held)| held.digest == seen);
        let (key, held) = match unchanged {
            Some((key, held)) => (
                key.clone(),
                Held {
                    version,
                    ..held.clone()
                },
            ),
            None => {
                let value = decode(&resource.value, map)?;
                let key = name(&value).clone();
                // Delta removes and versions resources by the envelope's name: it must be
                // the one inside, or a later removal would miss.
                if !resource.name.is_empty() && resource.name != key {
                    return Err(ResourceError::Invalid {
                        at: format!("`{}`", resource.name),
                        message: format!("the resource inside is named `{key}`"),
                    });
                }
                (key, Held::new(value, version, encoded))
            }
        };
        if fresh.insert(key.clone(), held).is_some() {
            return Err(ResourceError::Invalid {
                at: format!("`{key}`"),
                message: "named twice in one response".into(),
            });
        }
    }
    if update.complete {
        *map = SharedMap::from(fresh);
    } else {
        map.extend(fresh);
        for name in &update.removed {
            map.remove(name);
        }
    }
    Ok(())
}

/// A secret from the management server: never one that stands for a file's.
fn server_secret(value: &Any) -> Result<XdsSecret, ResourceError> {
    let secret = XdsSecret::decode(value)?;
    if config::tls::sds_file::is_file_secret(&secret.name) {
        return Err(ResourceError::Invalid {
            at: format!("secret `{}`", secret.name),
            message: "a name of the form of a secret read from a file".into(),
        });
    }
    Ok(secret)
}

impl Applier {
    async fn apply(&mut self, update: Update, source: Source) -> Result<(), String> {
        let Some(kind) = Kind::of(&update.type_url) else {
            return Err(format!("unexpected resource type {}", update.type_url));
        };
        // A file's secret counts as its secret's update, not as one of the server's.
        let from_server = source == Source::Server;
        if from_server {
            self.count(kind, 0);
        }
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
        let before = Arc::clone(&self.resources);
        let result = self.put_in_force(kind, update, source).await;
        self.count_secrets(&secrets, if result.is_ok() { 1 } else { 2 });
        match &result {
            Ok(()) if from_server => {
                self.count(kind, 1);
                tracing::info!(kind = kind.label(), "xDS update applied");
                // What the config could not take before may fit now.
                self.file_blocked.clear();
            }
            Ok(()) => tracing::info!(secrets = ?secrets, "secret file applied"),
            Err(error) if from_server => {
                self.count(kind, 2);
                tracing::warn!(kind = kind.label(), %error, "xDS update rejected; the config in force stays");
                self.status.last_rejected = Some(format!("{}: {error}", kind.label()));
            }
            Err(error) => {
                tracing::warn!(secrets = ?secrets, %error, "secret file not applied; the secret held before stays");
            }
        }
        self.publish();
        // The resources a change replaced, held by nothing else once the status no longer
        // shows them: freed off the ACK's path (unchanged, this is one count less).
        crate::retire::retire(before);
        result
    }

    /// The names to subscribe to, by type: routes and endpoints named, and the secrets
    /// named that are not read from files.
    /// A set is replaced only when its names changed: a fleet's thousand endpoint names are
    /// neither copied nor compared again by the client for a change that names the same.
    fn refresh_wanted(&self, wanted: &mut BTreeMap<&'static str, Arc<BTreeSet<String>>>) {
        let named = self.resources.subscriptions();
        for (type_url, names) in [
            (type_url::ROUTE, &named.routes),
            (type_url::ENDPOINT, &named.endpoints),
            (type_url::SECRET, &named.secrets),
        ] {
            // The same set (most often the very one held) keeps the one held.
            if wanted.get(type_url) != Some(names) {
                wanted.insert(type_url, Arc::clone(names));
            }
        }
    }

    /// Reads the files of the secrets named that are read from files, and puts those whose
    /// contents changed in force. A file that cannot be read or whose secret fails its
    /// checks keeps the secret held before; it is counted and logged once per change of its
    /// contents. One the config could not take (its listener's address taken, say) is tried
    /// again after the next update from the server.
    async fn read_files(&mut self) {
        let mut changed = Vec::new();
        for key in self.resources.file_secret_names() {
            let read = config::tls::sds_file::read(&key).and_then(|any| {
                // Checked here, so that a bad file is told from a config that cannot take it.
                XdsSecret::decode(&any)?;
                Ok(any)
            });
            let (any, seen) = match read {
                Ok(any) => {
                    let seen = config::xds::digest(&any.value);
                    (Some(any), seen)
                }
                Err(error) => {
                    let seen = config::xds::digest(error.to_string().as_bytes());
                    if self.file_rejected.insert(key.clone(), seen) != Some(seen) {
                        self.count_secrets(std::slice::from_ref(&key), 0);
                        self.count_secrets(std::slice::from_ref(&key), 2);
                        tracing::warn!(secret = %key, %error, "secret file rejected; the secret held before stays");
                    }
                    (None, seen)
                }
            };
            let Some(any) = any else {
                continue;
            };
            self.file_rejected.remove(&key);
            let held = self.resources.secrets.get(&key).map(|h| h.digest);
            if held != Some(seen) && self.file_blocked.get(&key) != Some(&seen) {
                changed.push((key, any, seen));
            }
        }
        // One update per file, so that one the config cannot take does not hold the others.
        for (key, any, seen) in changed {
            let update = Update {
                type_url: type_url::SECRET.into(),
                complete: false,
                resources: vec![xds_client::Resource {
                    name: key.clone(),
                    version: "file".into(),
                    value: any,
                }],
                removed: Vec::new(),
                version_info: String::new(),
            };
            match self.apply(update, Source::Files).await {
                Ok(()) => {
                    self.file_blocked.remove(&key);
                }
                Err(_) => {
                    self.file_blocked.insert(key, seen);
                }
            }
        }
        let named = self.resources.file_secret_names();
        self.file_rejected.retain(|key, _| named.contains(key));
        self.file_blocked.retain(|key, _| named.contains(key));
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
        let mut held = SharedMap::default();
        merge(
            &mut held,
            &update("web", "web"),
            alone(XdsCluster::decode),
            |c| &c.name,
        )
        .expect("the same name");
        assert_eq!(held["web"].version, "1");
        let error = merge(
            &mut held,
            &update("web", "api"),
            alone(XdsCluster::decode),
            |c| &c.name,
        )
        .expect_err("another name");
        assert_eq!(
            error.to_string(),
            "`web`: the resource inside is named `api`"
        );
        assert_eq!(held.keys().collect::<Vec<_>>(), ["web"]);
    }

    /// State of the world: every resource again to change one. Those whose bytes are the
    /// same keep what was decoded from them; the changed one is decoded again.
    #[test]
    fn unchanged_bytes_are_not_decoded_again() {
        let sotw = |policies: [(&str, LbPolicy); 2]| Update {
            type_url: type_url::CLUSTER.into(),
            complete: true,
            resources: (policies.into_iter())
                .map(|(name, policy)| Resource {
                    name: String::new(),
                    version: String::new(),
                    value: testbed::xds::any(&testbed::resources::eds_cluster(name, policy)),
                })
                .collect(),
            removed: Vec::new(),
            version_info: "1".into(),
        };
        let mut held = SharedMap::default();
        let decode = alone(XdsCluster::decode);
        let first = sotw([("web", LbPolicy::RoundRobin), ("api", LbPolicy::RoundRobin)]);
        merge(&mut held, &first, &decode, |c| &c.name).expect("valid");
        let before = held.clone();
        let mut second = sotw([("web", LbPolicy::RoundRobin), ("api", LbPolicy::Random)]);
        second.version_info = "2".into();
        merge(&mut held, &second, &decode, |c| &c.name).expect("valid");
        assert!(Arc::ptr_eq(&before["web"].value, &held["web"].value));
        assert_eq!(held["web"].updated, before["web"].updated);
        assert_eq!(held["web"].version, "2");
        assert!(!Arc::ptr_eq(&before["api"].value, &held["api"].value));
        assert_ne!(held["api"].digest, before["api"].digest);

        // The same bytes under another type are checked, and refused, as before.
        let mut retyped = second.clone();
        retyped.resources[0].value.type_url = type_url::LISTENER.into();
        let error = merge(&mut held, &retyped, &decode, |c| &c.name).expect_err("typed");
        assert!(error.to_string().contains("expected"), "{error}");
        assert!(Arc::ptr_eq(&before["web"].value, &held["web"].value));

        // The same bytes twice in one response are still one name given twice.
        let twice = sotw([("web", LbPolicy::RoundRobin), ("web", LbPolicy::RoundRobin)]);
        let error = merge(&mut held, &twice, &decode, |c| &c.name).expect_err("twice");
        assert_eq!(error.to_string(), "`web`: named twice in one response");
    }
}
