//! A listener's HTTP/3 on this worker: a QUIC endpoint on the worker's UDP socket (quinn
//! drives one endpoint from one task), admitting connections under the same limits and
//! overload actions as TCP ones, each then served by `conn::serve_h3` on a task of its own.

use std::net::SocketAddr;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

use super::accept::Accepted;
use super::listener::{Listener, ListenerState};
use crate::conn::{self, ConnSettings};
use crate::context::{ConnCtx, Signal};
use crate::listen::{QuicSockets, WorkerConnectionIds};

/// A listener's HTTP/3 being served on this worker.
pub(super) struct QuicServing {
    /// The sockets it serves on: the same while the listener keeps HTTP/3.
    pub(super) sockets: Arc<QuicSockets>,
    /// Raised to stop accepting: connections say GOAWAY and finish their requests.
    drain: Signal,
    /// Raised when the drain time is up: the connections left are closed.
    close: Signal,
}

impl QuicServing {
    /// Starts serving `listener`'s HTTP/3 on this worker's socket of `sockets`; `None` if the
    /// socket is gone or the endpoint cannot start (logged).
    pub(super) fn start(
        sockets: &Arc<QuicSockets>,
        worker: usize,
        listener: &Rc<Listener>,
        at: &Rc<Accepted>,
    ) -> Option<Self> {
        let state = listener.state();
        let name = &state.ctx.name;
        let mut configs = QuicConfigs {
            migration: sockets.steered,
            destination: sockets.address,
            built_from: None,
            config: None,
        };
        // The endpoint's own config answers first packets (Retry tokens, address validation);
        // each connection is then accepted with the listener's config as of then.
        let (config, _) = configs.for_state(&state)?;
        let Some(socket) = sockets.take(worker) else {
            tracing::error!(worker, listener = %name, "no UDP socket for this worker");
            return None;
        };
        let mut endpoint_config = quinn::EndpointConfig::default();
        if sockets.steered {
            let workers = sockets.workers();
            endpoint_config
                .cid_generator(move || Box::new(WorkerConnectionIds::new(worker, workers)));
        }
        let endpoint = quinn::Endpoint::new(
            endpoint_config,
            Some((*config).clone()),
            socket,
            Arc::new(quinn::TokioRuntime),
        );
        let endpoint = match endpoint {
            Ok(endpoint) => endpoint,
            Err(error) => {
                tracing::error!(worker, listener = %name, %error, "cannot serve HTTP/3 on the UDP socket");
                return None;
            }
        };
        let serving = Self {
            sockets: Arc::clone(sockets),
            drain: Signal::default(),
            close: Signal::default(),
        };
        tokio::task::spawn_local(accept_loop(
            endpoint,
            configs,
            Rc::clone(listener),
            Rc::clone(at),
            serving.drain.clone(),
            serving.close.clone(),
        ));
        Some(serving)
    }

    /// Stops accepting (the listener no longer serves HTTP/3): connections finish their
    /// requests after GOAWAY, and those still open after `drain_timeout` are closed.
    pub(super) fn stop(self, drain_timeout: Duration) {
        self.drain.raise();
        let close = self.close;
        tokio::task::spawn_local(async move {
            tokio::time::sleep(drain_timeout).await;
            close.raise();
        });
    }
}

/// Accepts QUIC connections until the listener drains or `drain` is raised; then the
/// endpoint refuses new ones while those open finish.
async fn accept_loop(
    endpoint: quinn::Endpoint,
    mut configs: QuicConfigs,
    listener: Rc<Listener>,
    at: Rc<Accepted>,
    drain: Signal,
    close: Signal,
) {
    let bound = endpoint
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut stopping = drain.watch();
    let mut listener_drain = listener.drain.watch();
    loop {
        let incoming = tokio::select! {
            incoming = endpoint.accept() => incoming,
            () = stopping.raised() => break,
            () = listener_drain.raised() => break,
        };
        let Some(incoming) = incoming else {
            break;
        };
        let state = listener.state();
        let ctx = &state.ctx;
        if !ctx.bypass_overload && at.worker.overload.refusing_connections() {
            at.worker.stats.overload_cx_refused().inc();
            ctx.stats.cx_http3_refused.inc();
            incoming.refuse();
            continue;
        }
        if !ctx.bypass_overload
            && at.worker.overload.keepalive_disabled()
            && !incoming.remote_address_validated()
            && incoming.may_retry()
        {
            // Under pressure a client proves its address (a Retry token, no state kept here)
            // before a handshake is spent on it: spoofed sources get nothing.
            ctx.stats.cx_http3_retry.inc();
            if let Err(error) = incoming.retry() {
                tracing::debug!(%error, "QUIC Retry not sent");
            }
            continue;
        }
        let Some(permit) = state.limits.try_admit() else {
            ctx.stats.cx_overflow.inc();
            ctx.stats.cx_http3_refused.inc();
            incoming.refuse();
            continue;
        };
        let Some((server_config, changed)) = configs.for_state(&state) else {
            incoming.refuse();
            continue;
        };
        if changed {
            endpoint.set_server_config(Some((*server_config).clone()));
        }
        let peer = incoming.remote_address();
        let local = SocketAddr::new(incoming.local_ip().unwrap_or(bound.ip()), bound.port());
        let connecting = match incoming.accept_with(server_config) {
            Ok(connecting) => connecting,
            Err(error) => {
                // Its first flight failed the handshake (no certificate for its name, no
                // common version or cipher), or the client was gone.
                ctx.stats.cx_http3_handshake_error.inc();
                tracing::debug!(%peer, %error, "QUIC connection not accepted");
                continue;
            }
        };
        tracing::debug!(worker = at.worker_id, listener = %ctx.name, %peer, "accepted QUIC connection");
        at.balance.opened(at.worker_id);
        let closed = at.opened(ctx, permit);
        let conn_ctx = ConnCtx::new(peer, local, Rc::clone(ctx), Rc::clone(&at.worker));
        let target = conn::H3Target {
            http: Rc::clone(&listener.http),
            settings: Rc::clone(&state.conn),
            chains: state.chains.clone(),
        };
        let served = conn::serve_h3(connecting, conn_ctx, target, drain.watch(), close.watch());
        let mut listener_close = listener.close.watch();
        tokio::task::spawn_local(async move {
            // Given back when the connection is over, however it ends.
            let _closed = closed;
            tokio::select! {
                () = served => {}
                () = listener_close.raised() => {}
            }
        });
    }
    // Open connections say GOAWAY. New ones are refused, so their clients go elsewhere (or
    // to TCP) at once; but after a binary upgrade they are ignored: the new process reads the
    // same sockets, and the client's next try may reach it.
    drain.raise();
    let handing_over = crate::live::binary_upgrade::handed_over();
    let mut closing = close.watch();
    loop {
        tokio::select! {
            incoming = endpoint.accept() => match incoming {
                Some(incoming) if handing_over => incoming.ignore(),
                Some(incoming) => incoming.refuse(),
                None => break,
            },
            () = closing.raised() => break,
        }
    }
}

/// The QUIC server config for the listener's connections, made again when its TLS (a
/// certificate reload) or its settings (a new generation) change.
struct QuicConfigs {
    /// Clients may move: their packets reach this worker by connection ID.
    migration: bool,
    /// The listener's address, which its chains' `destination_port` is matched against.
    destination: SocketAddr,
    built_from: Option<BuiltFrom>,
    /// `None` where the listener's TLS cannot serve QUIC (logged once).
    config: Option<Arc<quinn::ServerConfig>>,
}

/// What a QUIC server config was made from: the TLS configs of the listener and its chains,
/// its settings and its chain selector.
struct BuiltFrom {
    tls: Vec<Option<Arc<rustls::ServerConfig>>>,
    settings: Weak<ConnSettings>,
    selector: Option<Arc<crate::conn::ChainSelector>>,
}

impl BuiltFrom {
    fn same_as(&self, other: &BuiltFrom) -> bool {
        self.tls.len() == other.tls.len()
            && self.tls.iter().zip(&other.tls).all(|(a, b)| same(a, b))
            && self.settings.ptr_eq(&other.settings)
            && same(&self.selector, &other.selector)
    }
}

fn same<T>(a: &Option<Arc<T>>, b: &Option<Arc<T>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

impl QuicConfigs {
    /// The config for `state`, and whether it was made anew.
    fn for_state(&mut self, state: &ListenerState) -> Option<(Arc<quinn::ServerConfig>, bool)> {
        let settings = &state.conn;
        let h3 = settings.codecs.h3.as_ref()?;
        let tls_of = |s: &ConnSettings| s.tls.as_ref().map(|t| t.server().config());
        // The listener's own TLS first, then each chain's.
        let mut tls = vec![tls_of(settings)];
        tls.extend(
            state
                .chains
                .iter()
                .flat_map(|c| c.entries.iter().map(|e| tls_of(&e.conn))),
        );
        let now = BuiltFrom {
            tls,
            settings: Rc::downgrade(settings),
            selector: state.chains.as_ref().map(|c| Arc::clone(&c.selector)),
        };
        if self.built_from.as_ref().is_some_and(|b| b.same_as(&now)) {
            return self.config.clone().map(|config| (config, false));
        }
        let server_tls = match &state.chains {
            None => now.tls[0].clone(),
            Some(chains) => crate::conn::quic_chains::server_config(
                Arc::clone(&chains.selector),
                &now.tls[1..],
                now.tls[0].as_ref().filter(|_| chains.default),
                self.destination,
            )
            .map(Arc::new),
        };
        self.built_from = Some(now);
        let Some(server_tls) = server_tls else {
            tracing::error!(listener = %state.ctx.name, "the listener has no TLS to serve QUIC with");
            self.config = None;
            return None;
        };
        let built = h3.server_config(&server_tls, self.config.as_deref(), self.migration);
        match built {
            Ok(config) => {
                let config = Arc::new(config);
                self.config = Some(Arc::clone(&config));
                Some((config, true))
            }
            Err(error) => {
                tracing::error!(listener = %state.ctx.name, %error, "the listener's TLS cannot serve QUIC");
                self.config = None;
                None
            }
        }
    }
}
