//! A listener's chain and a made-up connection, built from YAML: for the chain's unit tests and
//! the `bench` feature's measurements.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use http::HeaderValue;

use super::{FilterChain, SharedFilters};
use crate::catalog::ProxyStats;
use crate::context::{ConnCtx, ListenerCtx, WorkerCtx};
use config::Config;

/// A listener with `filters` (YAML list items) and `routes`, its chain and a connection.
pub(crate) struct Setup {
    #[cfg(test)]
    pub(crate) config: Config,
    pub(crate) chain: FilterChain,
    pub(crate) conn: Rc<ConnCtx>,
    /// The connection's peer, as the client of every request.
    pub(crate) client: crate::context::Client,
    /// The registry the chain's stats record into.
    pub(crate) _stats: Arc<ProxyStats>,
}

/// Panics on a config that does not load: the callers write it.
pub(crate) fn setup(filters: &str, routes: &str) -> Setup {
    setup_with(filters, &format!("    routes:\n{routes}"))
}

/// [`setup`] with the listener's `virtual_hosts` (YAML list items).
#[cfg(test)]
pub(crate) fn setup_hosts(filters: &str, virtual_hosts: &str) -> Setup {
    setup_with(filters, &format!("    virtual_hosts:\n{virtual_hosts}"))
}

fn setup_with(filters: &str, routing: &str) -> Setup {
    let yaml = format!(
        "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    http_filters:\n{filters}\n{routing}\n"
    );
    let config = Config::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let stats = ProxyStats::new();
    let shard = stats.registry.shard(&[]);
    let listener = &config.listeners[0];
    let chain = FilterChain::new(
        listener,
        &SharedFilters::new(listener),
        (&stats.catalog, &shard),
        &[],
    );
    let peer = SocketAddr::from(([192, 0, 2, 7], 4321));
    let conn = Rc::new(ConnCtx::new(
        peer,
        SocketAddr::from(([127, 0, 0, 1], 1)),
        Rc::new(ListenerCtx {
            name: "l".into(),
            tls: false,
            forwarded_proto: HeaderValue::from_static("http"),
            client_detection: Box::default(),
            forwarded_trust: crate::context::ForwardedTrust {
                use_remote_address: true,
                trusted_hops: 0,
            },
            max_requests_per_connection: None,
            max_connection_duration: None,
            bypass_overload: false,
            head_limit: None,
            stats: stats.catalog.listener(&shard, "l"),
            access_log: None,
            chain: None,
        }),
        Rc::new(WorkerCtx {
            stats: stats.catalog.worker(&shard),
            draining: Cell::new(false),
            overload: Default::default(),
            health: Default::default(),
        }),
    ));
    Setup {
        #[cfg(test)]
        config,
        chain,
        client: crate::context::Client::peer(),
        conn,
        _stats: stats,
    }
}
