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
            ..QuicConfigs::default()
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
                tracing::debug!(%peer, %error, "QUIC connection not accepted");
                continue;
            }
        };
        tracing::debug!(worker = at.worker_id, listener = %ctx.name, %peer, "accepted QUIC connection");
        at.balance.opened(at.worker_id);
        let closed = at.opened(ctx, permit);
        let conn_ctx = ConnCtx::new(peer, local, Rc::clone(ctx), Rc::clone(&at.worker));
        let served = conn::serve_h3(
            connecting,
            conn_ctx,
            Rc::clone(&listener.http),
            Rc::clone(&state.conn),
            drain.watch(),
            close.watch(),
        );
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
#[derive(Default)]
struct QuicConfigs {
    /// Clients may move: their packets reach this worker by connection ID.
    migration: bool,
    built_from: Option<(Arc<rustls::ServerConfig>, Weak<ConnSettings>)>,
    /// `None` where the listener's TLS cannot serve QUIC (logged once).
    config: Option<Arc<quinn::ServerConfig>>,
}

impl QuicConfigs {
    /// The config for `state`, and whether it was made anew.
    fn for_state(&mut self, state: &ListenerState) -> Option<(Arc<quinn::ServerConfig>, bool)> {
        let settings = &state.conn;
        let h3 = settings.codecs.h3.as_ref()?;
        let tls = settings.tls.as_ref()?.server().config();
        if let Some((built_tls, built_settings)) = &self.built_from
            && Arc::ptr_eq(built_tls, &tls)
            && Weak::ptr_eq(built_settings, &Rc::downgrade(settings))
        {
            return self.config.clone().map(|config| (config, false));
        }
        let built = h3.server_config(&tls, self.config.as_deref(), self.migration);
        self.built_from = Some((tls, Rc::downgrade(settings)));
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
