//! Building a generation from a validated config and the generation in force. Everything
//! that can fail (binding new listeners, loading TLS files, opening access logs) happens here,
//! before anything changes; what must change shared state in place (a kept cluster's
//! endpoints, a kept listener's certificates) is returned as a [`Commit`] to run once the
//! whole generation is known to be good.

use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;

use super::BuildError;
use super::generation::{BoundSockets, Generation, SharedListener};
use super::sockets::Sockets;
use crate::access_log::LogSinks;
use crate::catalog::ProxyStats;
use crate::cluster::SharedCluster;
use crate::filters::SharedFilters;
use crate::listen::{ConnectionLimits, Limit, reuse_port_supported};
use crate::router::RouteTable;
use crate::tls::{ServerTls, TlsListeners, UpstreamTls, UpstreamTransports};
use crate::trace::SharedTracer;
use config::{ClusterConfig, Config, ConnectionBalance, Endpoint, ListenerConfig};

/// What a build draws on besides the config.
pub(crate) struct BuildCtx<'a> {
    pub(crate) workers: usize,
    pub(crate) stats: &'a Arc<ProxyStats>,
    pub(crate) number: u64,
    /// The id the next new listener gets.
    pub(crate) next_listener_id: &'a mut u64,
    pub(crate) sockets: &'a mut Sockets,
}

/// Changes to state the generation in force shares, made only once the new one is built.
#[derive(Default)]
pub(crate) struct Commit {
    endpoints: Vec<(Arc<SharedCluster>, Vec<Endpoint>)>,
    certificates: Vec<Arc<ServerTls>>,
    /// Sockets of listeners the new config removes.
    released: Vec<Arc<BoundSockets>>,
}

impl Commit {
    /// Makes the in-place changes `generation` needs.
    pub(crate) fn run(self, generation: &Generation) {
        for (cluster, endpoints) in self.endpoints {
            cluster.set_endpoints(&endpoints);
        }
        for sockets in self.released {
            sockets.release();
        }
        // Logged and counted (ssl_certificate_reload) per listener.
        let _ = generation
            .tls
            .reload_some(|tls| self.certificates.iter().any(|c| Arc::ptr_eq(c, tls)));
    }
}

pub(crate) fn build(
    mut config: Config,
    previous: Option<&Generation>,
    ctx: BuildCtx<'_>,
) -> Result<(Generation, Commit), BuildError> {
    if let Some(previous) = previous {
        check_fixed(&previous.config, &config)?;
    }
    // Without SO_REUSEPORT, every listener falls back to one shared socket.
    if !reuse_port_supported() {
        if previous.is_none() {
            tracing::warn!(
                "SO_REUSEPORT is not available here: every listener uses `connection_balance: exact`"
            );
        }
        for listener in &mut config.listeners {
            listener.connection_balance = ConnectionBalance::Exact;
        }
    }
    let mut commit = Commit::default();
    let stats = ctx.stats;

    let log_sinks = match previous {
        Some(p) if p.log_sinks.targets_are(log_targets(&config)) => Arc::clone(&p.log_sinks),
        _ => Arc::new(
            LogSinks::open(log_targets(&config))
                .map_err(|source| BuildError::AccessLog { source })?,
        ),
    };

    let node = config.xds.as_ref().map(|x| x.node.id.as_str());
    let tracer = match (&config.tracing, previous) {
        (None, _) => None,
        (Some(tracing), Some(p)) if p.tracer.as_ref().is_some_and(|t| t.is_for(tracing, node)) => {
            p.tracer.clone()
        }
        (Some(tracing), _) => Some(Arc::new(
            SharedTracer::start(tracing, node, stats)
                .map_err(|source| BuildError::Tracing { source })?,
        )),
    };

    // Every cluster the very same checked config, in the same order (a change to routes
    // alone from a management server): the list is kept whole, and so the workers and the
    // monitor have nothing to follow.
    let unchanged = previous.filter(|p| {
        p.config.clusters.len() == config.clusters.len()
            && (p.config.clusters.iter().zip(&config.clusters)).all(|(a, b)| Arc::ptr_eq(a, b))
    });
    // The previous generation's clusters by name: a control plane may send 100,000.
    let before: HashMap<&str, (&Arc<ClusterConfig>, &Arc<SharedCluster>)> = previous
        .filter(|_| unchanged.is_none())
        .map(|p| {
            (p.config.clusters.iter().zip(p.clusters.iter()))
                .map(|(c, shared)| (c.name.as_str(), (c, shared)))
                .collect()
        })
        .unwrap_or_default();
    let mut clusters = Vec::with_capacity(config.clusters.len());
    for cluster in config.clusters.iter().filter(|_| unchanged.is_none()) {
        let previous_version = before.get(cluster.name.as_str()).copied();
        let kept = previous_version.and_then(|(old_config, shared)| {
            // The same checked config (one a management server left unchanged): kept whole.
            if Arc::ptr_eq(old_config, cluster) {
                return Some(Arc::clone(shared));
            }
            same_but_endpoints(old_config, cluster).then(|| {
                if old_config.endpoints != cluster.endpoints {
                    commit
                        .endpoints
                        .push((Arc::clone(shared), cluster.endpoints.clone()));
                }
                Arc::clone(shared)
            })
        });
        let shared = match kept {
            Some(shared) => shared,
            None => {
                let transports = upstream_transports(cluster)?;
                let shared = SharedCluster::new(cluster, ctx.workers, stats, transports).map_err(
                    |source| BuildError::Dns {
                        cluster: cluster.name.clone(),
                        source,
                    },
                )?;
                // Envoy's "had traffic" is its cluster's `upstream_cx_total`, which a changed
                // cluster keeps (its stats are kept by name): so is the flag here.
                let had_traffic =
                    previous_version.is_some_and(|(_, s)| s.had_traffic.load(Relaxed));
                shared.had_traffic.store(had_traffic, Relaxed);
                Arc::new(shared)
            }
        };
        clusters.push(shared);
    }

    let process_limit = match previous {
        // Kept, with its count of the connections open.
        Some(p) if p.config.max_connections == config.max_connections => p.process_limit.clone(),
        _ => config.max_connections.map(Limit::new),
    };
    let mut listeners: Vec<SharedListener> = Vec::with_capacity(config.listeners.len());
    // Sockets bound here are closed again if the build fails.
    for listener in &config.listeners {
        let old = previous.and_then(|p| {
            p.config
                .listeners
                .iter()
                .zip(&p.listeners)
                .filter(|(_, shared)| listeners.iter().all(|l| l.id != shared.id))
                .find(|(l, _)| same_socket(l, listener))
        });
        let mut fresh_quic = None;
        let (id, sockets) = match old {
            Some((_, shared)) => (shared.id, Arc::clone(&shared.sockets)),
            None => {
                let bound = if listener.serves_tcp() {
                    ctx.sockets.bind(listener, ctx.workers)
                } else {
                    // QUIC alone: its UDP sockets give the address (the port, when any was
                    // asked for).
                    quic_sockets(ctx.sockets, listener.address, ctx.workers).map(|quic| {
                        let address = quic.address;
                        fresh_quic = Some(Arc::new(quic));
                        BoundSockets::none(address)
                    })
                }
                .map_err(|source| BuildError::Bind {
                    listener: listener.name.clone(),
                    address: listener.address,
                    source,
                })?;
                let id = *ctx.next_listener_id;
                *ctx.next_listener_id += 1;
                (id, Arc::new(bound))
            }
        };
        // HTTP/3's sockets: kept while the listener keeps it, bound when it starts to.
        let quic = match (
            &listener.http3,
            old.and_then(|(_, shared)| shared.quic.as_ref()),
        ) {
            (None, _) => None,
            (Some(_), Some(kept)) => Some(Arc::clone(kept)),
            (Some(_), None) => match fresh_quic.take() {
                Some(bound) => Some(bound),
                None => {
                    let bound = quic_sockets(ctx.sockets, sockets.address, ctx.workers).map_err(
                        |source| BuildError::Bind {
                            listener: listener.name.clone(),
                            address: sockets.address,
                            source,
                        },
                    )?;
                    Some(Arc::new(bound))
                }
            },
        };
        let body =
            |config: &ListenerConfig,
             chain: Option<&str>,
             old: Option<(&ListenerConfig, &SharedListener)>,
             commit: &mut Commit| { chain_body(config, chain, old, commit) };
        let own = body(listener, None, old, &mut commit)?;
        let mut chains = Vec::with_capacity(listener.filter_chains.len());
        for chain in &listener.filter_chains {
            let old_chain = old.and_then(|(old_config, shared)| {
                (old_config.filter_chains.iter().zip(&shared.chains))
                    .find(|(c, _)| c.name == chain.name)
                    .map(|(c, shared)| (&*c.settings, shared))
            });
            chains.push(body(
                &chain.settings,
                Some(&chain.name),
                old_chain,
                &mut commit,
            )?);
        }
        let listener_limit = match old {
            Some((old_config, shared))
                if old_config.connection_limit == listener.connection_limit =>
            {
                shared.limits.listener.clone()
            }
            _ => listener.connection_limit.map(Limit::new),
        };
        let limits = ConnectionLimits {
            process: process_limit
                .clone()
                .filter(|_| !listener.ignore_global_conn_limit),
            listener: listener_limit,
        };
        let shared = |config: &ListenerConfig, body: ChainBody| SharedListener {
            id,
            sockets: Arc::clone(&sockets),
            quic: None,
            limits: limits.clone(),
            tls: body.tls,
            routes: body.routes,
            filters: body.filters,
            conn_key: conn_key(config),
            chains: Vec::new(),
            selector: None,
        };
        let chains: Vec<SharedListener> = (listener.filter_chains.iter())
            .zip(chains)
            .map(|(chain, body)| shared(&chain.settings, body))
            .collect();
        let selector = (!chains.is_empty()).then(|| {
            let matches = listener.filter_chains.iter().map(|c| c.matcher.clone());
            Arc::new(crate::conn::ChainSelector::new(
                matches.collect(),
                listener.http_inspector,
            ))
        });
        listeners.push(SharedListener {
            chains,
            selector,
            quic,
            ..shared(listener, own)
        });
    }

    if let Some(previous) = previous {
        commit.released = previous
            .listeners
            .iter()
            .filter(|old| listeners.iter().all(|l| l.id != old.id))
            .map(|old| Arc::clone(&old.sockets))
            .collect();
    }
    let tls = {
        let shard = &stats.process;
        let (servers, counters) = config
            .listeners
            .iter()
            .zip(&listeners)
            .flat_map(|(l, shared)| {
                (std::iter::once(shared).chain(&shared.chains)).filter_map(move |s| {
                    // Made only for TLS: a handle dropped at once would be retired.
                    let tls = s.tls.as_ref()?;
                    let counters = stats.catalog.certificate_reloads(shard, &l.name);
                    Some((Arc::clone(tls), counters))
                })
            })
            .unzip();
        Arc::new(TlsListeners::new(servers, counters))
    };
    let clusters = match unchanged {
        Some(previous) => Arc::clone(&previous.clusters),
        None => Arc::new(clusters),
    };
    let mut generation = Generation::new(
        ctx.number,
        Arc::new(config),
        clusters,
        listeners,
        log_sinks,
        tls,
        tracer,
        ctx.workers,
    );
    generation.process_limit = process_limit;
    Ok((generation, commit))
}

/// What [`build`] makes of `config` that needs no socket, thread or resolver: each cluster's
/// TLS contexts and host set and a worker's view of it, each listener's and filter chain's
/// TLS, routes and filters. For the xDS fuzz target: an error is a refusal (the response is
/// NACKed), a panic a bug.
#[cfg(feature = "fuzzing")]
pub(crate) fn build_without_sockets(
    config: &Config,
    stats: &Arc<ProxyStats>,
    shard: &stats::Shard,
) -> Result<(), BuildError> {
    for cluster in &config.clusters {
        let transports = upstream_transports(cluster)?;
        if cluster.has_names() {
            continue; // a resolver starts with it
        }
        let shared = SharedCluster::new(cluster, 1, stats, transports).map_err(|source| {
            BuildError::Dns {
                cluster: cluster.name.clone(),
                source,
            }
        })?;
        let shared = Arc::new(shared);
        crate::cluster::Cluster::new(cluster, &shared, None, &stats.catalog, shard);
    }
    let mut commit = Commit::default();
    for listener in &config.listeners {
        chain_body(listener, None, None, &mut commit)?;
        for chain in &listener.filter_chains {
            chain_body(&chain.settings, Some(&chain.name), None, &mut commit)?;
        }
    }
    Ok(())
}

/// What a listener's chain (or its own settings) is served with, besides the socket.
struct ChainBody {
    tls: Option<Arc<ServerTls>>,
    routes: Arc<RouteTable>,
    filters: Arc<SharedFilters>,
}

/// Builds a chain's TLS, routes and filters, keeping those of `old` that did not change.
/// `chain`: the filter chain's name, `None` for the listener's own settings; `old` is the
/// same chain's (or the listener's own) in force before.
fn chain_body(
    listener: &ListenerConfig,
    chain: Option<&str>,
    old: Option<(&ListenerConfig, &SharedListener)>,
    commit: &mut Commit,
) -> Result<ChainBody, BuildError> {
    // TLS to an authorization service: its files read now, so a bad one fails the load by
    // name rather than every check later.
    for filter in &listener.http_filters {
        if let config::HttpFilterConfig::ExtAuthz(authz) = &filter.config
            && let config::filters::AuthzService::Grpc {
                tls: Some(spec), ..
            }
            | config::filters::AuthzService::Http {
                tls: Some(spec), ..
            } = &authz.service
        {
            config::tls::material::check_cluster(spec).map_err(|source| BuildError::Tls {
                scope: format!("listener `{}` ext_authz", listener.name),
                source: Box::new(source),
            })?;
        }
    }
    let tls = match (&listener.tls, old) {
        (None, _) => None,
        (Some(spec), Some((_, shared)))
            if shared.tls.as_ref().is_some_and(|t| t.spec() == spec) =>
        {
            // Same files: read them again (new certificates are picked up), keeping the
            // session tickets and cache.
            config::tls::material::check_listener(spec).map_err(|source| BuildError::Tls {
                scope: format!("listener `{}`", listener.name),
                source: Box::new(source),
            })?;
            let kept = shared.tls.clone();
            commit.certificates.extend(kept.clone());
            kept
        }
        (Some(spec), _) => Some(Arc::new(
            ServerTls::new(&listener.name, chain, spec).map_err(|source| BuildError::Tls {
                scope: format!("listener `{}`", listener.name),
                source: Box::new(source),
            })?,
        )),
    };
    // Unchanged routes and filters keep their table (tens of milliseconds to build at
    // 100,000 routes) and their rate-limit buckets. Compared, not hashed: a comparison
    // stops at the first route that differs, and it sees the cluster indices routes hold
    // (a cluster added before another changes them, and the table is built again).
    let (routes, filters) = match old {
        Some((old, shared))
            if old.http_filters == listener.http_filters
                && old.route_config == listener.route_config =>
        {
            (Arc::clone(&shared.routes), Arc::clone(&shared.filters))
        }
        _ => (
            Arc::new(RouteTable::after(
                listener.route_config.clone(),
                old.map(|(_, shared)| &*shared.routes),
            )),
            Arc::new(SharedFilters::new(listener)),
        ),
    };
    Ok(ChainBody {
        tls,
        routes,
        filters,
    })
}

fn log_targets(config: &Config) -> impl Iterator<Item = config::LogTarget> + '_ {
    config
        .listeners
        .iter()
        .flat_map(|l| std::iter::once(l).chain(l.filter_chains.iter().map(|c| &*c.settings)))
        .flat_map(|l| l.access_logs.iter().map(|a| a.target.clone()))
}

/// Settings the running process is built around: they take a restart (or a binary upgrade).
fn check_fixed(running: &Config, new: &Config) -> Result<(), BuildError> {
    let fixed = |key: &'static str| BuildError::Fixed { key };
    if running.concurrency != new.concurrency {
        return Err(fixed("concurrency"));
    }
    // Who may use the admin follows reloads (the access check reads the config in force);
    // where it listens does not.
    let address = |c: &Config| c.admin.as_ref().map(|a| a.address);
    if address(running) != address(new) {
        return Err(fixed("admin.address"));
    }
    if running.xds != new.xds {
        return Err(fixed("node and dynamic_resources"));
    }
    Ok(())
}

/// HTTP/3's sockets on `address`: in an upgrade, the running process's (the group stays the
/// same), otherwise bound now.
fn quic_sockets(
    sockets: &mut Sockets,
    address: std::net::SocketAddr,
    workers: usize,
) -> std::io::Result<crate::listen::QuicSockets> {
    let inherited = sockets.take_udp(address);
    if inherited.is_empty() {
        crate::listen::QuicSockets::bind(address, workers)
    } else {
        crate::listen::QuicSockets::adopt(inherited, workers)
    }
}

/// The same listening socket serves both: same address, protocol and balancing, so a
/// listener may be renamed or reconfigured and keep its socket (no connection is refused).
/// With port 0 (any free port) the name must match too.
fn same_socket(a: &ListenerConfig, b: &ListenerConfig) -> bool {
    a.address == b.address
        && a.serves_tcp() == b.serves_tcp()
        && a.connection_balance == b.connection_balance
        && (a.address.port() != 0 || a.name == b.name)
}

/// A cluster's TLS contexts, its own and its transport socket matches'.
fn upstream_transports(cluster: &ClusterConfig) -> Result<UpstreamTransports, BuildError> {
    let context = |tls: Option<&config::ClusterTlsConfig>, scope: String| {
        tls.map(|tls| UpstreamTls::new(tls, cluster.protocol.alpn()))
            .transpose()
            .map_err(|source| BuildError::Tls {
                scope,
                source: Box::new(source),
            })
    };
    let own = context(cluster.tls.as_ref(), format!("cluster `{}`", cluster.name))?;
    let matches = (cluster.transport_socket_matches.iter())
        .map(|m| {
            let scope = format!(
                "cluster `{}` transport socket match `{}`",
                cluster.name, m.name
            );
            Ok((m.name.clone(), context(m.tls.as_ref(), scope)?))
        })
        .collect::<Result<Vec<_>, BuildError>>()?;
    Ok(UpstreamTransports::new(own, matches))
}

/// Whether two configs of a cluster differ at most in their endpoints (the cluster is then
/// kept, with its pools, health and breakers, and only its hosts change). A cluster that gains
/// its first DNS name, or loses its last, is built anew: it needs a resolver, or not.
fn same_but_endpoints(a: &ClusterConfig, b: &ClusterConfig) -> bool {
    // Every field is named, so a new one must be placed here; compared as values (inline PEM
    // from SDS by its text: a rotated certificate or CA makes a new cluster with it), with no
    // copy made, as a control plane may send 100,000 clusters with each change.
    let ClusterConfig {
        name,
        endpoints: _,
        lb_policy,
        lb_settings,
        hash_key,
        hash_policy,
        protocol,
        connect_timeout,
        max_requests_per_connection,
        idle_timeout,
        max_connection_duration,
        per_endpoint_stats,
        tcp_keepalive,
        preserve_header_case,
        initial_stream_window_size,
        initial_connection_window_size,
        max_concurrent_streams,
        http2_keepalive,
        stream_error_on_invalid_http_message,
        close_connections_on_host_health_failure,
        preconnect,
        buffer_limit,
        circuit_breakers,
        health_check,
        outlier_detection,
        tls,
        auto_sni,
        transport_socket_matches,
        dns,
    } = a;
    a.has_names() == b.has_names()
        && *name == b.name
        && *lb_policy == b.lb_policy
        && *lb_settings == b.lb_settings
        && *hash_key == b.hash_key
        && *hash_policy == b.hash_policy
        && *protocol == b.protocol
        && *connect_timeout == b.connect_timeout
        && *max_requests_per_connection == b.max_requests_per_connection
        && *idle_timeout == b.idle_timeout
        && *max_connection_duration == b.max_connection_duration
        && *per_endpoint_stats == b.per_endpoint_stats
        && *tcp_keepalive == b.tcp_keepalive
        && *preserve_header_case == b.preserve_header_case
        && *initial_stream_window_size == b.initial_stream_window_size
        && *initial_connection_window_size == b.initial_connection_window_size
        && *max_concurrent_streams == b.max_concurrent_streams
        && *http2_keepalive == b.http2_keepalive
        && *stream_error_on_invalid_http_message == b.stream_error_on_invalid_http_message
        && *close_connections_on_host_health_failure == b.close_connections_on_host_health_failure
        && *preconnect == b.preconnect
        && *buffer_limit == b.buffer_limit
        && *circuit_breakers == b.circuit_breakers
        && *health_check == b.health_check
        && *outlier_detection == b.outlier_detection
        && *tls == b.tls
        && *auto_sni == b.auto_sni
        && *transport_socket_matches == b.transport_socket_matches
        && *dns == b.dns
}

/// What a connection of `listener` is served with: all of it but routes and filters, which
/// apply per request. Every field is named (a new one must be placed on one side or the
/// other), and the routes are not serialized: at 100,000 routes that would cost more than
/// building their table.
fn conn_key(listener: &ListenerConfig) -> u64 {
    let ListenerConfig {
        name,
        address,
        connection_limit,
        connection_balance,
        max_connections_to_accept_per_socket_event,
        bypass_overload_manager,
        ignore_global_conn_limit,
        tcp_keepalive,
        buffer_limit,
        http,
        access_logs,
        proxy_protocol,
        tls,
        http3,
        tracing,
        tcp_proxy,
        http_filters: _,
        route_config: _,
        filter_chains: _,
        default_chain: _,
        listener_filters_timeout: _,
        continue_on_listener_filters_timeout: _,
        http_inspector: _,
    } = listener;
    hash_of(&(
        name,
        address,
        connection_limit,
        (
            connection_balance,
            max_connections_to_accept_per_socket_event,
            bypass_overload_manager,
            ignore_global_conn_limit,
            tcp_keepalive,
        ),
        buffer_limit,
        http,
        access_logs,
        proxy_protocol,
        (tls, http3, tracing, tcp_proxy),
    ))
}

/// A stable hash of a config value's serialized form.
pub(super) fn hash_of(value: &impl Serialize) -> u64 {
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    // The serializer writes a few bytes at a time: hashed in blocks instead (a 1,001-route
    // table's key takes about 3 million fewer instructions).
    let mut writer = std::io::BufWriter::with_capacity(8192, HashWriter(&mut hasher));
    if serde_json::to_writer(&mut writer, value).is_err()
        || std::io::Write::flush(&mut writer).is_err()
    {
        return 0;
    }
    drop(writer);
    hasher.finish()
}

struct HashWriter<'a>(&'a mut twox_hash::XxHash64);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::same_but_endpoints;

    /// A change that keeps every cluster's checked config (routes alone, from a management
    /// server) keeps the generation's cluster list itself; any other makes a new one, which
    /// keeps the clusters that stayed the same. The route table is kept while the routes
    /// stay the same.
    #[test]
    fn a_generation_keeps_the_cluster_list_when_no_cluster_changed() {
        let config = config::Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes: [{ match: { prefix: / }, cluster: a }]\nclusters:\n  - name: a\n    endpoints: [127.0.0.1:1]\n  - name: b\n    endpoints: [127.0.0.1:2]\n",
        )
        .expect("valid");
        let stats = crate::catalog::ProxyStats::new();
        let mut next_listener_id = 0;
        let mut sockets = super::Sockets::default();
        let mut build = |config: config::Config, previous: Option<&super::Generation>| {
            let ctx = super::BuildCtx {
                workers: 1,
                stats: &stats,
                number: 1,
                next_listener_id: &mut next_listener_id,
                sockets: &mut sockets,
            };
            super::build(config, previous, ctx).expect("built").0
        };
        let first = build(config.clone(), None);
        let mut routes_only = config.clone();
        routes_only.drain_timeout = std::time::Duration::from_secs(1);
        let second = build(routes_only, Some(&first));
        assert!(Arc::ptr_eq(&first.clusters, &second.clusters));

        // One cluster's config is another (checked again): a new list, the other kept.
        let mut one_changed = config.clone();
        let mut b = config::ClusterConfig::clone(&one_changed.clusters[1]);
        b.buffer_limit += 1;
        one_changed.clusters[1] = Arc::new(b);
        let third = build(one_changed, Some(&second));
        assert!(!Arc::ptr_eq(&second.clusters, &third.clusters));
        assert!(Arc::ptr_eq(&second.clusters[0], &third.clusters[0]));
        assert!(!Arc::ptr_eq(&second.clusters[1], &third.clusters[1]));

        // The routes did not change: their table is kept throughout.
        let routes = |g: &super::Generation| Arc::clone(&g.listeners[0].routes);
        assert!(Arc::ptr_eq(&routes(&first), &routes(&second)));
        assert!(Arc::ptr_eq(&routes(&second), &routes(&third)));
        // A route to the other cluster is another table.
        let mut other_route = config.clone();
        other_route.listeners[0].route_config = config::Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes: [{ match: { prefix: / }, cluster: b }]\nclusters:\n  - name: a\n    endpoints: [127.0.0.1:1]\n  - name: b\n    endpoints: [127.0.0.1:2]\n",
        )
        .expect("valid")
        .listeners[0]
            .route_config
            .clone();
        let fourth = build(other_route, Some(&third));
        assert!(!Arc::ptr_eq(&routes(&third), &routes(&fourth)));
    }

    /// A CA or client certificate from SDS is inline PEM, which serializes as `inline`: a
    /// rotated one must still make a new cluster.
    #[test]
    fn a_cluster_with_other_inline_pem_is_not_the_same() {
        let config = config::Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:0\n    routes: [{ match: { prefix: / }, cluster: c }]\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:1]\n",
        )
        .expect("valid");
        let pem = |name: &str| {
            let pair = rcgen::generate_simple_self_signed(vec![name.to_string()]).expect("ca");
            config::PemSource::Inline(pair.cert.pem().into())
        };
        let with_ca = |ca| {
            let mut cluster = config::ClusterConfig::clone(&config.clusters[0]);
            cluster.tls = Some(config::ClusterTlsConfig {
                ca: Some(ca),
                server_name: None,
                client_certificate: None,
                min_version: config::TlsVersion::Tls12,
                subject_alt_names: Vec::new(),
                auto_host_sni: false,
            });
            cluster
        };
        let (one, two) = (pem("one"), pem("two"));
        assert!(same_but_endpoints(
            &with_ca(one.clone()),
            &with_ca(one.clone())
        ));
        assert!(!same_but_endpoints(&with_ca(one), &with_ca(two)));
    }
}
