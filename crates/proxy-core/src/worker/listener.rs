//! One listener on one worker: what accepting needs, and the three contexts its connections
//! are served with, built from the listener's config.

use std::rc::Rc;
use std::sync::Arc;

use http::HeaderValue;

use crate::access_log::{LogSinks, WorkerLog};
use crate::catalog::Catalog;
use crate::cluster::Cluster;
use crate::config::{ConnectionBalance, ListenerConfig};
use crate::conn::{Codecs, ConnSettings};
use crate::context::ListenerCtx;
use crate::filters::{FilterChain, SharedFilters};
use crate::http::HttpCtx;
use crate::listener::ConnectionLimits;
use crate::router::RouteTable;
use crate::tls::{Handshake, ServerTls};

pub(super) struct Listener {
    /// Position in the config, which hand-offs between workers refer to.
    pub(super) index: usize,
    /// `connection_balance: exact`: each connection goes to the least-loaded worker.
    pub(super) exact: bool,
    pub(super) limits: ConnectionLimits,
    /// What requests need to know about the listener.
    pub(super) ctx: Rc<ListenerCtx>,
    /// The HTTP request path: routes, authorization, clusters.
    pub(super) http: Rc<HttpCtx>,
    /// How connections are served: codecs and TLS.
    pub(super) conn: Rc<ConnSettings>,
}

/// What building a worker's listeners draws on, besides each listener's config.
pub(super) struct Parts<'a> {
    pub(super) catalog: &'a Catalog,
    pub(super) shard: &'a stats::Shard,
    pub(super) log_sinks: &'a LogSinks,
    /// The worker's clusters, in config order.
    pub(super) clusters: &'a Rc<[Cluster]>,
}

impl Listener {
    pub(super) fn new(
        index: usize,
        config: &ListenerConfig,
        limits: &ConnectionLimits,
        tls: Option<&Arc<ServerTls>>,
        filters: &SharedFilters,
        parts: &Parts<'_>,
    ) -> Self {
        let Parts {
            catalog,
            shard,
            log_sinks,
            clusters,
        } = parts;
        let name = &config.name;
        let access_log = config.access_log.as_ref().and_then(|log| {
            let tx = log_sinks.sender(&log.target)?;
            Some(WorkerLog::new(
                log.format.clone(),
                tx,
                Arc::clone(&log_sinks.dropped),
            ))
        });
        Self {
            index,
            exact: config.connection_balance == ConnectionBalance::Exact,
            limits: limits.clone(),
            ctx: Rc::new(ListenerCtx {
                name: name.clone(),
                tls: tls.is_some(),
                forwarded_proto: HeaderValue::from_static(if tls.is_some() {
                    "https"
                } else {
                    "http"
                }),
                max_requests_per_connection: config.http.max_requests_per_connection,
                head_limit: Codecs::head_limit_to_check(config),
                stats: catalog.listener(shard, name),
                access_log,
            }),
            http: Rc::new(HttpCtx {
                routes: RouteTable::new(config.routes.clone()),
                filters: FilterChain::new(config, filters, catalog, shard),
                clusters: Rc::clone(clusters),
                upgrade_idle_timeout: config.http.idle_timeout,
                upgrade_buffer: config.buffer_limit as usize,
            }),
            conn: Rc::new(ConnSettings {
                codecs: Codecs::new(config),
                tls: tls.map(|server| {
                    Handshake::new(
                        Arc::clone(server),
                        catalog.tls(shard, name),
                        config.buffer_limit,
                    )
                }),
            }),
        }
    }
}
