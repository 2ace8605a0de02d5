//! One listener on one worker, across config generations: its accept loop, the state new
//! connections are served with (swapped whole by a config change), the routes and filters
//! each request reads (swapped in their slot), and the drain of its connections when the
//! listener is removed or the process stops.

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;

use crate::access_log::{LogSinks, WorkerLog};
use crate::catalog::Catalog;
use crate::cluster::Cluster;
use crate::conn::{ChainEntry, Chains, Codecs, ConnSettings};
use crate::context::{ChainSignals, ForwardedTrust, ListenerCtx, Signal};
use crate::filters::FilterChain;
use crate::http::{HttpCtx, HttpSlot, RequestIdPolicy, ServerHeader};
use crate::listen::ConnectionLimits;
use crate::live::SharedListener;
use crate::tls::{Handshake, ServerTls};
use crate::trace::WorkerTracer;
use config::{ConnectionBalance, ListenerConfig};

pub(super) struct Listener {
    /// Kept across generations; hand-offs between workers name it.
    pub(super) id: u64,
    /// What accepting and new connections use; replaced by a config change.
    state: RefCell<Rc<ListenerState>>,
    /// The routes, filters and clusters of the next request on any of its connections.
    pub(super) http: Rc<HttpSlot>,
    /// The same for each of its filter chains, by name, with the chain's drain: kept across
    /// generations, so a connection follows its chain's changes, and drains when its chain
    /// is removed.
    chain_slots: RefCell<Vec<ChainSlot>>,
    /// The flags of the listener's own settings while they serve as the default chain of a
    /// listener with chains: raised when they stop being the default.
    own_chain: RefCell<Option<ChainSignals>>,
    /// Turned on to stop accepting and drain the listener's connections.
    pub(super) drain: Signal,
    /// Turned on when the drain time is up: the connections left are closed.
    pub(super) close: Signal,
    /// Contexts replaced while connections still held them, so their access log lines keep
    /// being flushed.
    retired: RefCell<Vec<Weak<ListenerCtx>>>,
}

/// A chain's request slot and flags, kept across generations.
struct ChainSlot {
    name: String,
    http: Rc<HttpSlot>,
    signals: ChainSignals,
}

/// What new connections of a listener are served with, as of one generation.
pub(super) struct ListenerState {
    /// `connection_balance: exact`: each connection goes to the least-loaded worker.
    pub(super) exact: bool,
    /// Connections accepted in a row before the worker serves its other tasks; `None`: as
    /// many as are pending.
    pub(super) accept_per_event: Option<u32>,
    pub(super) limits: ConnectionLimits,
    /// What requests need to know about the listener.
    pub(super) ctx: Rc<ListenerCtx>,
    /// How connections are served: codecs and TLS.
    pub(super) conn: Rc<ConnSettings>,
    /// What `ctx` and `conn` were built from, to tell whether a new generation changes them.
    built_from: BuiltFrom,
    /// Its filter chains, when it has several.
    pub(super) chains: Option<Rc<Chains>>,
    /// What each chain's context was built from, in the order of `chains.entries`.
    chains_built_from: Vec<(String, BuiltFrom)>,
}

#[derive(PartialEq)]
struct BuiltFrom {
    conn_key: u64,
    tls: Option<*const ServerTls>,
    log_sinks: *const LogSinks,
}

/// What building a worker's listeners draws on, besides each listener's config.
pub(super) struct Parts<'a> {
    pub(super) catalog: &'a Catalog,
    pub(super) shard: &'a stats::Shard,
    pub(super) log_sinks: &'a Arc<LogSinks>,
    /// The worker's clusters, in config order.
    pub(super) clusters: &'a Rc<[Rc<Cluster>]>,
    /// Whether the worker has a parking lot for idle connections.
    pub(super) park_idle: bool,
    /// The worker's tracer, when `tracing` is configured.
    pub(super) tracer: Option<&'a Rc<WorkerTracer>>,
    /// How long the connections of a removed chain have to finish.
    pub(super) drain_timeout: Duration,
    /// The HTTP contexts the new ones replace: dropped once the worker has reported the
    /// generation applied, as freeing a route table need not hold up the change.
    pub(super) replaced: &'a RefCell<Vec<Rc<HttpCtx>>>,
}

impl Listener {
    pub(super) fn new(config: &ListenerConfig, shared: &SharedListener, parts: &Parts<'_>) -> Self {
        let chain_slots = RefCell::new(Vec::new());
        let own_chain = RefCell::new(None);
        let state = ListenerState::new(config, shared, parts, None, &chain_slots, &own_chain);
        Self {
            id: shared.id,
            state: RefCell::new(Rc::new(state)),
            http: Rc::new(HttpSlot::new(http_ctx(config, shared, parts))),
            chain_slots,
            own_chain,
            drain: Signal::default(),
            close: Signal::default(),
            retired: RefCell::new(Vec::new()),
        }
    }

    pub(super) fn state(&self) -> Rc<ListenerState> {
        Rc::clone(&self.state.borrow())
    }

    /// Takes a new generation's config: new connections get the new state, the next request
    /// on every connection the new routes, filters and clusters.
    pub(super) fn update(
        &self,
        config: &ListenerConfig,
        shared: &SharedListener,
        parts: &Parts<'_>,
    ) {
        let old = self.state();
        let state = ListenerState::new(
            config,
            shared,
            parts,
            Some(&old),
            &self.chain_slots,
            &self.own_chain,
        );
        let kept = |ctx: &Rc<ListenerCtx>| {
            Rc::ptr_eq(ctx, &state.ctx)
                || (state.chains.iter().flat_map(|c| c.entries.iter()))
                    .any(|e| Rc::ptr_eq(ctx, &e.ctx))
        };
        let mut retired = self.retired.borrow_mut();
        retired.retain(|ctx| ctx.strong_count() > 0);
        let old_chains = old
            .chains
            .iter()
            .flat_map(|c| c.entries.iter().map(|e| &e.ctx));
        for ctx in std::iter::once(&old.ctx).chain(old_chains) {
            if !kept(ctx) {
                retired.push(Rc::downgrade(ctx));
            }
        }
        drop(retired);
        self.state.replace(Rc::new(state));
        let replaced = self.http.replace(http_ctx(config, shared, parts));
        parts.replaced.borrow_mut().push(replaced);
    }

    /// Stops accepting and drains the listener's connections; those still open after
    /// `drain_timeout` are closed.
    pub(super) fn remove(self: &Rc<Self>, drain_timeout: Duration) {
        self.start_drain();
        let mut closes = vec![self.close.clone()];
        closes.extend((self.chain_slots.borrow().iter()).map(|slot| slot.signals.close.clone()));
        closes.extend(self.own_chain.borrow().iter().map(|own| own.close.clone()));
        tokio::task::spawn_local(async move {
            tokio::time::sleep(drain_timeout).await;
            for close in closes {
                close.raise();
            }
        });
    }

    /// Stops accepting and tells every connection, whatever its chain, to finish.
    pub(super) fn start_drain(&self) {
        self.drain.raise();
        for slot in self.chain_slots.borrow().iter() {
            slot.signals.drain.raise();
        }
        if let Some(own) = &*self.own_chain.borrow() {
            own.drain.raise();
        }
    }

    /// Hands buffered access log lines to their writer, for this and replaced contexts.
    pub(super) fn flush_logs(&self) {
        let state = self.state();
        let chains = state
            .chains
            .iter()
            .flat_map(|c| c.entries.iter().map(|e| &e.ctx));
        for ctx in std::iter::once(&state.ctx).chain(chains) {
            if let Some(log) = &ctx.access_log {
                log.flush();
            }
        }
        let mut retired = self.retired.borrow_mut();
        retired.retain(|ctx| match ctx.upgrade() {
            Some(ctx) => {
                if let Some(log) = &ctx.access_log {
                    log.flush();
                }
                true
            }
            None => false,
        });
    }
}

impl ListenerState {
    fn new(
        config: &ListenerConfig,
        shared: &SharedListener,
        parts: &Parts<'_>,
        old: Option<&ListenerState>,
        chain_slots: &RefCell<Vec<ChainSlot>>,
        own_chain: &RefCell<Option<ChainSignals>>,
    ) -> Self {
        // The listener's own settings as the default chain: flags of their own, raised
        // (drain, then close at `drain_timeout`) when they stop serving as the default. Made
        // whether or not there are chains yet, so connections from before chains came
        // drain too.
        let own_signals = {
            let mut own = own_chain.borrow_mut();
            match (&*own, config.default_chain) {
                (Some(signals), false) => {
                    closed_after_drain(vec![signals.clone()], parts.drain_timeout);
                    *own = None;
                }
                (None, true) => {
                    *own = Some(ChainSignals::new());
                }
                _ => {}
            }
            own.clone()
        };
        let old_own = old.map(|o| (&o.built_from, &o.ctx, &o.conn));
        let (ctx, conn, built_from) =
            served_with(config, shared, parts, old_own, own_signals.as_ref());
        let mut chains_built_from = Vec::with_capacity(config.filter_chains.len());
        let mut slots = chain_slots.borrow_mut();
        let mut next_slots = Vec::with_capacity(config.filter_chains.len());
        let chains = shared.selector.as_ref().map(|selector| {
            let entries = (config.filter_chains.iter().zip(&shared.chains))
                .map(|(chain, shared_chain)| {
                    let settings = &*chain.settings;
                    let old_entry = old.and_then(|o| {
                        let at = o
                            .chains_built_from
                            .iter()
                            .position(|(n, _)| *n == chain.name)?;
                        let entry = o.chains.as_ref()?.entries.get(at)?;
                        Some((&o.chains_built_from[at].1, &entry.ctx, &entry.conn))
                    });
                    let http_ctx = http_ctx(settings, shared_chain, parts);
                    let slot = match slots.iter().position(|s| s.name == chain.name) {
                        Some(at) => {
                            let slot = slots.swap_remove(at);
                            parts
                                .replaced
                                .borrow_mut()
                                .push(slot.http.replace(http_ctx));
                            slot
                        }
                        None => ChainSlot {
                            name: chain.name.clone(),
                            http: Rc::new(HttpSlot::new(http_ctx)),
                            signals: ChainSignals::new(),
                        },
                    };
                    // A context kept from before has the same slot's flags.
                    let (ctx, conn, built_from) = served_with(
                        settings,
                        shared_chain,
                        parts,
                        old_entry,
                        Some(&slot.signals),
                    );
                    chains_built_from.push((chain.name.clone(), built_from));
                    let entry = ChainEntry {
                        ctx,
                        conn,
                        http: Rc::clone(&slot.http),
                    };
                    next_slots.push(slot);
                    entry
                })
                .collect();
            Rc::new(Chains {
                selector: Arc::clone(selector),
                entries,
                default: config.default_chain,
                inspect_timeout: config.listener_filters_timeout,
                continue_on_timeout: config.continue_on_listener_filters_timeout,
            })
        });
        // The connections of chains gone are drained (their requests in flight finish), and
        // those left when the drain time is up are closed.
        let gone: Vec<ChainSlot> = std::mem::replace(&mut *slots, next_slots);
        if !gone.is_empty() {
            closed_after_drain(
                gone.into_iter().map(|s| s.signals).collect(),
                parts.drain_timeout,
            );
        }
        Self {
            exact: config.connection_balance == ConnectionBalance::Exact,
            accept_per_event: config.max_connections_to_accept_per_socket_event,
            limits: shared.limits.clone(),
            ctx,
            conn,
            built_from,
            chains,
            chains_built_from,
        }
    }
}

/// Drains the connections of chains that are gone, and closes those left at `drain_timeout`.
fn closed_after_drain(chains: Vec<ChainSignals>, drain_timeout: Duration) {
    for chain in &chains {
        chain.drain.raise();
    }
    tokio::task::spawn_local(async move {
        tokio::time::sleep(drain_timeout).await;
        for chain in chains {
            chain.close.raise();
        }
    });
}

/// A chain's (or the listener's own) connection context and settings, those of `old` kept
/// when nothing they are built from changed (and with them their stats handles).
fn served_with(
    config: &ListenerConfig,
    shared: &SharedListener,
    parts: &Parts<'_>,
    old: Option<(&BuiltFrom, &Rc<ListenerCtx>, &Rc<ConnSettings>)>,
    chain: Option<&ChainSignals>,
) -> (Rc<ListenerCtx>, Rc<ConnSettings>, BuiltFrom) {
    let built_from = BuiltFrom {
        conn_key: shared.conn_key,
        tls: shared.tls.as_ref().map(Arc::as_ptr),
        log_sinks: Arc::as_ptr(parts.log_sinks),
    };
    // A kept context must carry the same chain flags.
    let same_chain = |ctx: &ListenerCtx| ctx.chain.as_ref().map(|c| c.id) == chain.map(|c| c.id);
    match old {
        Some((from, ctx, conn)) if *from == built_from && same_chain(ctx) => {
            (Rc::clone(ctx), Rc::clone(conn), built_from)
        }
        _ => (
            Rc::new(listener_ctx(config, shared.tls.as_ref(), parts, chain)),
            Rc::new(conn_settings(config, shared.tls.as_ref(), parts)),
            built_from,
        ),
    }
}

fn listener_ctx(
    config: &ListenerConfig,
    tls: Option<&Arc<ServerTls>>,
    parts: &Parts<'_>,
    chain: Option<&ChainSignals>,
) -> ListenerCtx {
    let name = &config.name;
    let log_sinks = parts.log_sinks;
    let loggers: Vec<_> = config
        .access_logs
        .iter()
        .filter_map(|log| Some((log, log_sinks.sender(&log.target)?)))
        .collect();
    let access_log =
        (!loggers.is_empty()).then(|| WorkerLog::new(loggers, Arc::clone(&log_sinks.dropped)));
    ListenerCtx {
        name: name.clone(),
        tls: tls.is_some(),
        forwarded_proto: HeaderValue::from_static(if tls.is_some() { "https" } else { "http" }),
        forwarded_trust: ForwardedTrust {
            use_remote_address: config.http.use_remote_address,
            trusted_hops: config.http.xff_num_trusted_hops,
        },
        client_detection: config.http.original_ip_detection.clone().into_boxed_slice(),
        max_requests_per_connection: config.http.max_requests_per_connection,
        max_connection_duration: config.http.max_connection_duration,
        head_limit: Codecs::head_limit_to_check(config),
        bypass_overload: config.bypass_overload_manager,
        stats: parts.catalog.listener(parts.shard, name),
        access_log,
        chain: chain.cloned(),
    }
}

fn conn_settings(
    config: &ListenerConfig,
    tls: Option<&Arc<ServerTls>>,
    parts: &Parts<'_>,
) -> ConnSettings {
    ConnSettings {
        codecs: Codecs::new(
            config,
            parts
                .catalog
                .stream_idle_timeouts(parts.shard, &config.name),
        ),
        tls: tls.map(|server| {
            Handshake::new(
                Arc::clone(server),
                parts.catalog.tls(parts.shard, &config.name),
                config.buffer_limit,
            )
        }),
        proxy_protocol: config.proxy_protocol,
        tcp_proxy: config.tcp_proxy.is_some(),
        tcp_keepalive: config.tcp_keepalive.map(crate::listen::tcp_keepalive),
        // A TLS connection never parks (its session would have to be kept whole): decided
        // here, not found out at each idle gap.
        park_idle: parts.park_idle && tls.is_none(),
    }
}

/// The routes' own tracing policies (Envoy's route `tracing`), by route index; none where
/// the listener is not traced.
fn route_trace_policies(
    config: &ListenerConfig,
    shared: &SharedListener,
    traced: bool,
) -> Box<[(usize, crate::trace::TracePolicy)]> {
    if !traced || !config.tracing.enabled {
        return Box::default();
    }
    (shared.routes.config().routes.iter().enumerate())
        .filter_map(|(i, route)| {
            let own = route.tracing.as_deref()?;
            Some((
                i,
                crate::trace::TracePolicy::for_route(&config.tracing, own),
            ))
        })
        .collect()
}

fn http_ctx(config: &ListenerConfig, shared: &SharedListener, parts: &Parts<'_>) -> HttpCtx {
    HttpCtx {
        routes: Arc::clone(&shared.routes),
        filters: FilterChain::new(
            config,
            &shared.filters,
            (parts.catalog, parts.shard),
            parts.clusters,
        ),
        clusters: Rc::clone(parts.clusters),
        upgrade_idle_timeout: config.http.idle_timeout,
        upgrade_buffer: config.buffer_limit as usize,
        alt_svc: alt_svc(config, shared),
        path_normalization: config.http.path_normalization,
        tracer: parts.tracer.filter(|_| config.tracing.enabled).cloned(),
        trace_policy: crate::trace::TracePolicy::new(&config.tracing),
        route_trace_policies: route_trace_policies(config, shared, parts.tracer.is_some()),
        headers_with_underscores: config.http.headers_with_underscores_action,
        server_header: ServerHeader::new(&config.http.server_header),
        suppress_proxy_headers: config.http.suppress_proxy_headers,
        request_id: RequestIdPolicy::new(&config.http),
        accept_http_10: config.http.accept_http_10,
        request_timeout: config.http.request_timeout,
        max_stream_duration: config.http.max_stream_duration,
        ignore_http11_upgrade: config.http.ignore_http11_upgrade.clone().into(),
        // Checked as a host at load.
        default_host_for_http_10: config
            .http
            .default_host_for_http_10
            .as_deref()
            .and_then(|h| HeaderValue::from_str(h).ok()),
        host_rules: crate::http::head::HostRules {
            strip_port: config.http.strip_host_port,
            strip_trailing_dot: config.http.strip_trailing_host_dot,
            local_port: 0,
        },
        local_replies: (config.http.local_reply.as_ref())
            .filter(|r| !r.mappers.is_empty())
            .map(crate::http::local_reply::LocalReplies::new),
        early_header_mutation: config
            .http
            .early_header_mutation
            .as_ref()
            .map(crate::filters::Mutations::new),
        forward_client_cert: config.http.forward_client_cert,
        client_cert_details: config.http.set_current_client_cert_details,
        tcp_proxy: config.tcp_proxy.as_ref().map(|tcp| {
            crate::tcp_proxy::TcpProxyCtx::new(
                tcp,
                config.buffer_limit,
                parts.catalog.tcp_proxy(parts.shard, &config.name),
            )
        }),
    }
}

/// `h3=":PORT"; ma=SECONDS` for a listener serving HTTP/3 that advertises it.
fn alt_svc(config: &ListenerConfig, shared: &SharedListener) -> Option<HeaderValue> {
    let max_age = config.http3.as_ref()?.alt_svc_max_age?;
    let port = shared.quic.as_ref()?.address.port();
    let text = format!("h3=\":{port}\"; ma={}", max_age.as_secs());
    HeaderValue::from_str(&text).ok()
}
