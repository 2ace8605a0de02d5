//! HTTP/3 connections: the QUIC handshake, then the h3 codec's requests, each served by
//! [`super::http3_stream`] on this connection's task, until the client is done. GOAWAY on
//! drain, once the connection has served its `max_requests_per_connection`, when the
//! overload manager asks, or once it is `max_connection_duration` old; the QUIC idle timeout
//! (the listener's `idle_timeout`) closes a quiet connection.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use super::service::ProxyService;
use super::{Chains, ConnSettings};
use crate::context::{ConnCtx, SignalWatch};
use crate::http::HttpSlot;
use config::ListenerConfig;

/// The h3 connection over quinn, as the codec sees it.
type H3Connection = h3::server::Connection<super::http3_bounds::Connection, Bytes>;

/// How a listener's QUIC connections are served: their transport limits and the largest
/// request head.
pub(crate) struct H3Settings {
    pub(crate) transport: Arc<quinn::TransportConfig>,
    pub(crate) max_field_section_size: u64,
    /// How long a stream may take to send its request head.
    request_headers_timeout: Duration,
    /// How long a stream's body may stand still, either way.
    stream_idle_timeout: Duration,
    /// How long a connection may go without a request before GOAWAY (the listener's, or its
    /// chain's, `http.idle_timeout`; QUIC's own idle timeout is the transport's).
    connection_idle: Duration,
    /// 0-RTT (`http3.early_data`): requests may come before the handshake ends.
    pub(crate) early_data: bool,
}

/// HTTP/3's unidirectional streams a client may open: its control stream and QPACK's two,
/// with room for reserved (grease) ones.
const MAX_UNI_STREAMS: u32 = 8;

/// Bytes of a client's first packets held before its connection is accepted, each and in all.
const INCOMING_BUFFER: u64 = 64 << 10;
const INCOMING_BUFFER_TOTAL: u64 = 8 << 20;

impl H3Settings {
    /// The limits of HTTP/2 on the same listener: streams, windows bounded by the buffer
    /// limit (or the windows it sets), the idle timeout and the request-head limit; streams
    /// and the idle timeout as `http3` sets them, where it does.
    pub(crate) fn new(listener: &ListenerConfig) -> Self {
        let limit = listener.buffer_limit;
        let http = &listener.http;
        let stream_window = http.initial_stream_window_size.unwrap_or(limit);
        let connection_window = http
            .initial_connection_window_size
            .unwrap_or(limit.max(65_535));
        let http3 = listener.http3.as_ref();
        let max_streams = http3
            .and_then(|h| h.max_concurrent_streams)
            .unwrap_or(http.max_concurrent_streams);
        let idle_timeout = http3
            .and_then(|h| h.idle_timeout)
            .unwrap_or(http.idle_timeout);
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(max_streams.into())
            .max_concurrent_uni_streams(MAX_UNI_STREAMS.into())
            .stream_receive_window(stream_window.into())
            .receive_window(connection_window.into())
            // What is sent and not yet acknowledged, for the whole connection.
            .send_window(u64::from(limit.max(65_535)))
            .max_idle_timeout(quinn::IdleTimeout::try_from(idle_timeout).ok());
        Self {
            transport: Arc::new(transport),
            max_field_section_size: u64::from(http.max_request_headers_kb) * 1024,
            request_headers_timeout: http.request_headers_timeout,
            stream_idle_timeout: http.stream_idle_timeout,
            connection_idle: http.idle_timeout,
            early_data: http3.is_some_and(|h| h.early_data),
        }
    }

    /// QUIC's server config from the listener's TLS as it is now: its certificates and SNI
    /// selection, with ALPN `h3`, and 0-RTT only if `early_data` asks (QUIC takes early data
    /// up to the flow-control limits, or none; rustls says so as `u32::MAX`). `previous`, if
    /// any, lends its address-validation token key, so tokens it gave stay good. `migration`:
    /// whether clients may change address.
    pub(crate) fn server_config(
        &self,
        tls: &rustls::ServerConfig,
        previous: Option<&quinn::ServerConfig>,
        migration: bool,
    ) -> Result<quinn::ServerConfig, quinn::crypto::rustls::NoInitialCipherSuite> {
        let mut tls = tls.clone();
        tls.alpn_protocols = vec![b"h3".to_vec()];
        if self.early_data {
            tls.max_early_data_size = u32::MAX;
            // Early data only on sessions this process holds, each resumed once (RFC 8446
            // section 8.1): a first flight sent again resumes nothing, here or elsewhere.
            tls.ticketer = Arc::new(SessionsHeldHere);
        } else {
            tls.max_early_data_size = 0;
        }
        let crypto = Arc::new(quinn::crypto::rustls::QuicServerConfig::try_from(
            Arc::new(tls),
        )?);
        let mut config = match previous {
            Some(previous) => {
                let mut config = previous.clone();
                config.crypto = crypto;
                config
            }
            None => quinn::ServerConfig::with_crypto(crypto),
        };
        config
            .transport_config(Arc::clone(&self.transport))
            // Without steering by connection ID a connection's packets reach this worker by
            // their source address (the `SO_REUSEPORT` hash): a client that moved would reach
            // another worker's endpoint, which does not know it.
            .migration(migration)
            .incoming_buffer_size(INCOMING_BUFFER)
            .incoming_buffer_size_total(INCOMING_BUFFER_TOTAL);
        Ok(config)
    }
}

/// No stateless tickets: rustls then hands out tickets naming sessions in its session cache,
/// each taken from it when resumed, which is what 0-RTT needs.
#[derive(Debug)]
struct SessionsHeldHere;

impl rustls::server::ProducesTickets for SessionsHeldHere {
    fn enabled(&self) -> bool {
        false
    }

    fn lifetime(&self) -> u32 {
        0
    }

    fn encrypt(&self, _plain: &[u8]) -> Option<Vec<u8>> {
        None
    }

    fn decrypt(&self, _cipher: &[u8]) -> Option<Vec<u8>> {
        None
    }
}

/// What serves a QUIC connection: the listener's settings, or one of its chains'.
pub(crate) struct H3Target {
    pub(crate) http: Rc<HttpSlot>,
    pub(crate) settings: Rc<ConnSettings>,
    /// A QUIC-only listener's chains, one picked once the handshake shows the SNI.
    pub(crate) chains: Option<Rc<Chains>>,
}

/// Serves a QUIC connection being accepted until the client is done, or until `drain` asks it
/// to finish (GOAWAY, then the requests in flight are answered) or `close` ends it.
pub(crate) async fn serve_h3(
    connecting: quinn::Connecting,
    mut ctx: ConnCtx,
    target: H3Target,
    drain: SignalWatch,
    mut close: SignalWatch,
) {
    let H3Target {
        mut http,
        mut settings,
        chains,
    } = target;
    let listener = Rc::clone(&ctx.listener);
    let stats = &listener.stats;
    // The listener's TLS, or (chains only) its first chain's: the chain is not known yet.
    let first_tls = (settings.tls.iter())
        .chain(
            chains
                .iter()
                .flat_map(|c| c.entries.iter().filter_map(|e| e.conn.tls.as_ref())),
        )
        .next();
    let Some(handshake_timeout) = first_tls.map(|tls| tls.server().spec().handshake_timeout) else {
        return;
    };
    let early_data = settings.codecs.h3.as_ref().is_some_and(|h3| h3.early_data);
    let (connection, handshake) = tokio::select! {
        done = tokio::time::timeout(handshake_timeout, established(connecting, early_data)) => match done {
            Ok(Ok(established)) => established,
            Ok(Err(error)) => {
                stats.cx_http3_handshake_error.inc();
                tracing::debug!(peer = %ctx.peer, %error, "QUIC handshake failed");
                return;
            }
            Err(_) => {
                stats.cx_http3_handshake_error.inc();
                tracing::debug!(peer = %ctx.peer, "QUIC handshake timed out");
                return;
            }
        },
        () = close.raised() => return,
    };
    ctx.server_name = server_name(&connection).map(Box::from);
    // The chain's flags, where a chain serves it: its drain and close end the connection too.
    let mut chain = None;
    if let Some(chains) = &chains {
        let hello = super::quic_chains::quic_hello(ctx.server_name.as_deref());
        let shown = super::chains::Shown {
            destination: ctx.local,
            source: ctx.peer,
            hello: &hello,
            quic: true,
        };
        let entry = match chains.selector.select(&shown) {
            Some(i) => chains.entries.get(i),
            None if chains.default => None,
            None => {
                stats.cx_no_filter_chain_match.inc();
                connection.close(0u32.into(), b"");
                return;
            }
        };
        if let Some(entry) = entry {
            ctx.listener = Rc::clone(&entry.ctx);
            settings = Rc::clone(&entry.conn);
            http = Rc::clone(&entry.http);
        }
        chain = (ctx.listener.chain.as_ref()).map(|c| (c.drain.watch(), c.close.watch()));
    }
    learn_client_cert(&mut ctx, &connection, &settings, &http);
    let Some(h3) = settings.codecs.h3.as_ref() else {
        return;
    };
    let (chain_drain, mut chain_close) = chain.unzip();
    let ctx = Rc::new(ctx);
    let mut active = Active::new(&ctx, &connection);
    let signals = Signals {
        drain,
        chain_drain,
        close: &mut close,
        chain_close: &mut chain_close,
    };
    // With 0-RTT the connection serves before its handshake ends, which must still end in
    // time: a first flight sent again by someone else never ends it.
    let early = super::http3_stream::EarlyData::new(handshake.map(|end| (end, connection.clone())));
    let handshake_by = tokio::time::Instant::now() + handshake_timeout;
    let served = serve_requests(
        connection.clone(),
        &ctx,
        http,
        h3,
        (early.clone(), handshake_by),
        signals,
    )
    .await;
    if early.pending() {
        // Lost before its handshake ended, or out of time for it: closed now, no grace.
        stats.cx_http3_handshake_error.inc();
        tracing::debug!(peer = %ctx.peer, "QUIC handshake not finished after 0-RTT");
        connection.close(0u32.into(), b"");
    }
    // Dropping the codec closed the connection, which throws away what the client has not
    // yet acknowledged: the last responses could be lost. So the codec is kept until the
    // client closes (it does once GOAWAY's requests are answered), or for a moment.
    tokio::select! {
        _ = connection.closed() => {}
        () = tokio::time::sleep(QUIET_CLOSE_GRACE) => {}
        () = close.raised() => {}
        () = raised(&mut chain_close) => {}
    }
    // Read before the codec goes: its close would take the place of the peer's reason.
    active.reason = Some(match connection.close_reason() {
        _ if served.peer_broke_http3 => HTTP3_ERROR,
        Some(error) => close_reason(&error),
        None => CLOSED_HERE,
    });
    drop(served.codec);
}

/// The connection once its client may send requests: after the handshake; or, with 0-RTT,
/// once the client's first flight has shown its SNI, with the handshake's end still to come
/// (`Some`; the client's 0-RTT requests are read meanwhile). A handshake that then fails, or
/// a replayed first flight that never completes one, ends the connection like any other.
async fn established(
    mut connecting: quinn::Connecting,
    early_data: bool,
) -> Result<(quinn::Connection, Option<quinn::ZeroRttAccepted>), quinn::ConnectionError> {
    if !early_data {
        return Ok((connecting.await?, None));
    }
    connecting.handshake_data().await?;
    match connecting.into_0rtt() {
        Ok((connection, handshake)) => Ok((connection, Some(handshake))),
        // A server's connection always converts; were it not to, the handshake is waited for.
        Err(connecting) => Ok((connecting.await?, None)),
    }
}

/// Index of `closed_here` in [`crate::catalog::QUIC_CLOSE_REASONS`].
const CLOSED_HERE: usize = 1;
/// Index of `http3_error`: the codec closed the connection for the client's fault.
const HTTP3_ERROR: usize = 8;

/// Why a connection ended, as an index into [`crate::catalog::QUIC_CLOSE_REASONS`].
fn close_reason(error: &quinn::ConnectionError) -> usize {
    use quinn::ConnectionError;
    match error {
        ConnectionError::TimedOut => 0,
        ConnectionError::LocallyClosed => CLOSED_HERE,
        ConnectionError::ApplicationClosed(_) => 2,
        ConnectionError::ConnectionClosed(_) => 3,
        ConnectionError::TransportError(_) => 4,
        ConnectionError::Reset => 5,
        ConnectionError::VersionMismatch => 6,
        ConnectionError::CidsExhausted => 7,
    }
}

/// How long a finished connection waits for the client to close it, so that its last
/// responses are acknowledged before the connection is closed from here.
const QUIET_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Counts an HTTP/3 connection as open while it is held, and why it ended and the packets it
/// lost when it goes, however its task ends (a listener's close drops it mid-way).
struct Active {
    ctx: Rc<ConnCtx>,
    connection: quinn::Connection,
    /// Why it ended, when the task learned it; otherwise it was closed here.
    reason: Option<usize>,
}

impl Active {
    fn new(ctx: &Rc<ConnCtx>, connection: &quinn::Connection) -> Self {
        ctx.listener.stats.cx_http3_total.inc();
        ctx.listener.stats.cx_http3_active.inc();
        Self {
            ctx: Rc::clone(ctx),
            connection: connection.clone(),
            reason: None,
        }
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let stats = &self.ctx.listener.stats;
        stats.cx_http3_active.dec();
        let reason = self.reason.unwrap_or(CLOSED_HERE);
        stats.cx_http3_close[reason].inc();
        stats
            .cx_http3_lost_packets
            .add(self.connection.stats().path.lost_packets);
        tracing::debug!(peer = %self.ctx.peer, reason = crate::catalog::QUIC_CLOSE_REASONS[reason], "HTTP/3 connection closed");
    }
}

/// How the codec's work on a connection ended.
struct Served {
    /// The codec, whose drop closes the connection; `None` if it could not start.
    codec: Option<H3Connection>,
    /// The client broke HTTP/3 and the codec closed the connection.
    peer_broke_http3: bool,
}

/// What ends a connection: the listener's (or its HTTP/3's) drain and close, and those of
/// the chain serving it, where one does.
struct Signals<'a> {
    drain: SignalWatch,
    chain_drain: Option<SignalWatch>,
    close: &'a mut SignalWatch,
    chain_close: &'a mut Option<SignalWatch>,
}

/// Until `watch` is raised; never without one.
async fn raised(watch: &mut Option<SignalWatch>) {
    match watch {
        Some(watch) => watch.raised().await,
        None => std::future::pending().await,
    }
}

/// The h3 codec on an established connection, until the client is done or GOAWAY's
/// requests are answered.
async fn serve_requests(
    connection: quinn::Connection,
    ctx: &Rc<ConnCtx>,
    http: Rc<HttpSlot>,
    h3: &H3Settings,
    (early, handshake_by): (super::http3_stream::EarlyData, tokio::time::Instant),
    signals: Signals<'_>,
) -> Served {
    let Signals {
        mut drain,
        mut chain_drain,
        close,
        chain_close,
    } = signals;
    let built = h3::server::builder()
        .max_field_section_size(h3.max_field_section_size)
        .build::<_, Bytes>(super::http3_bounds::Connection::new(connection))
        .await;
    let mut conn: H3Connection = match built {
        Ok(conn) => conn,
        Err(error) => {
            tracing::debug!(peer = %ctx.peer, %error, "HTTP/3 connection failed to start");
            return Served {
                codec: None,
                peer_broke_http3: false,
            };
        }
    };
    let service = ProxyService {
        conn: Rc::clone(ctx),
        http,
    };
    let timers = super::http3_stream::StreamTimers {
        head: h3.request_headers_timeout,
        idle: h3.stream_idle_timeout,
    };
    let mut handshaking = early.pending();
    // One timer for the connection, not one made with each turn of the loop.
    let handshake_deadline = tokio::time::sleep_until(handshake_by);
    tokio::pin!(handshake_deadline);
    // The requests in flight, each served on this task: the codec must outlive them.
    let mut requests = FuturesUnordered::new();
    let expires = ctx.expires_at();
    let mut going_away = false;
    // Runs while no request is in flight.
    let idle = tokio::time::sleep(h3.connection_idle);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            // Not after GOAWAY: a stream the client opened before it saw GOAWAY is past the
            // last one GOAWAY names, so the client knows to send it again elsewhere.
            accepted = conn.accept(), if !going_away => match accepted {
                Ok(Some(resolver)) => {
                    let served = super::http3_stream::serve_request(
                        resolver,
                        service.clone(),
                        timers,
                        early.clone(),
                    );
                    requests.push(served);
                }
                // The client said GOAWAY and its requests are answered.
                Ok(None) => break,
                Err(error) => {
                    tracing::debug!(peer = %ctx.peer, %error, "HTTP/3 connection ended");
                    let peer_broke_http3 =
                        matches!(error, h3::error::ConnectionError::Local { .. });
                    return Served {
                        codec: Some(conn),
                        peer_broke_http3,
                    };
                }
            },
            Some(()) = requests.next(), if !requests.is_empty() => {
                if requests.is_empty() {
                    idle.as_mut().reset(tokio::time::Instant::now() + h3.connection_idle);
                }
            }
            () = &mut handshake_deadline, if handshaking => {
                handshaking = early.pending();
                if handshaking {
                    // Ended here, counted by the caller (the handshake is still pending).
                    return Served {
                        codec: Some(conn),
                        peer_broke_http3: false,
                    };
                }
            }
            () = &mut idle, if requests.is_empty() && !going_away => {
                ctx.listener.stats.cx_idle_timeout.inc();
                go_away(&mut conn).await;
                going_away = true;
            }
            () = crate::context::sleep_until_some(expires), if !going_away => {
                ctx.listener.stats.cx_max_duration.inc();
                go_away(&mut conn).await;
                going_away = true;
            }
            () = drain.raised(), if !going_away => {
                go_away(&mut conn).await;
                going_away = true;
            }
            () = raised(&mut chain_drain), if !going_away => {
                go_away(&mut conn).await;
                going_away = true;
            }
            _ = ctx.retire.notified(), if !going_away => {
                go_away(&mut conn).await;
                going_away = true;
            }
            () = close.raised() => break,
            () = raised(chain_close) => break,
        }
        if going_away && requests.is_empty() {
            break;
        }
    }
    Served {
        codec: Some(conn),
        peer_broke_http3: false,
    }
}

/// GOAWAY naming the stream after the last one taken: every request already begun is served,
/// none after (a connection gone ends them too).
async fn go_away(conn: &mut H3Connection) {
    if let Err(error) = conn.shutdown(1).await {
        tracing::debug!(%error, "HTTP/3 GOAWAY not sent");
    }
}

/// The server name the client asked for.
fn server_name(connection: &quinn::Connection) -> Option<String> {
    connection
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
}

/// The client's certificate, for its requests.
fn learn_client_cert(
    ctx: &mut ConnCtx,
    connection: &quinn::Connection,
    settings: &ConnSettings,
    http: &HttpSlot,
) {
    let peer = connection.peer_identity().and_then(|p| {
        p.downcast::<Vec<rustls::pki_types::CertificateDer<'static>>>()
            .ok()
    });
    if let (Some(tls), Some(peer)) = (&settings.tls, peer) {
        let server_name = ctx.server_name.clone();
        ctx.client_cert = crate::http::client_cert::of_connection(
            Some(peer.as_slice()),
            || tls.server().local_certificate(server_name.as_deref()),
            http.current().forward_client_cert.writes_element(),
        );
    }
}
