//! One downstream connection: the TLS handshake on TLS listeners, protocol detection (ALPN or
//! the first bytes), then the HTTP/1.1 or HTTP/2 codec until the client is done or the drain
//! asks it to finish.
//!
//! ```text
//! mod.rs            accept-side setup: PROXY protocol, the filter chain, TLS, sniffing,
//!                   choosing the codec
//! proxy_protocol.rs the PROXY protocol header a TCP load balancer sends first
//! client_hello.rs   the ClientHello's SNI and ALPN, peeked to pick a filter chain
//! chains.rs         picking the filter chain by SNI, ALPN, addresses and ports
//! codecs.rs         the HTTP/1.1 codec's limits and hyper's HTTP/2 builder, per listener
//! http1/            HTTP/1.1 on crates/h1, with idle connections parked without a buffer
//! http2.rs          HTTP/2 (hyper), GOAWAY on drain or max_requests_per_connection
//! http2_frames.rs   the HTTP/2 input's frame headers, metered for PING, SETTINGS and
//!                   CONTINUATION floods
//! http3.rs          HTTP/3 (quinn and h3): the QUIC handshake, the connection's requests,
//!                   GOAWAY on drain
//! http3_bounds.rs   quinn's streams as h3 sees them, a request stream ending inside a frame
//!                   made an error
//! http3_stream.rs   one HTTP/3 request: its body piped to the handler, its response written
//! quic_chains.rs    a QUIC-only listener's chains: the certificate by SNI, the chain after
//!                   the handshake
//! service.rs        the per-connection service: one call per request, into http/handler.rs
//! stream_exec.rs    HTTP/2 stream tasks, each ended after stream_idle_timeout without a wake
//! io.rs             the socket as the codec sees it, with a lingering close
//! ```

pub(crate) mod chains;
mod client_hello;
mod codecs;
mod http1;
mod http2;
mod http2_frames;
mod http3;
mod http3_bounds;
mod http3_stream;
mod io;
pub(crate) mod proxy_protocol;
pub(crate) mod quic_chains;
mod service;
mod stream_exec;

use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::Either;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

pub(crate) use chains::{ChainEntry, ChainSelector, Chains};
pub(crate) use codecs::Codecs;
pub(crate) use http3::{H3Settings, H3Target, serve_h3};
use io::DownstreamIo;
use service::ProxyService;

use crate::context::{ConnCtx, ParkedCtx, SignalWatch};
use crate::http::HttpSlot;
use crate::tls::Handshake;

/// The first bytes of every HTTP/2 prior-knowledge connection (RFC 9113 section 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How one listener's connections are served on one worker: its codecs, and its TLS.
pub(crate) struct ConnSettings {
    pub(crate) codecs: Codecs,
    /// The TLS handshake, on a TLS listener.
    pub(crate) tls: Option<Handshake>,
    /// The PROXY protocol header expected before anything else.
    pub(crate) proxy_protocol: Option<config::ProxyProtocolConfig>,
    /// Bytes relayed to a cluster (`tcp_proxy`), not HTTP.
    pub(crate) tcp_proxy: bool,
    /// TCP keep-alive set on each accepted connection.
    pub(crate) tcp_keepalive: Option<socket2::TcpKeepalive>,
    /// Idle HTTP/1.1 connections are handed back as [`Parked`] (the worker has a lot for
    /// them); otherwise they stay with their task.
    pub(crate) park_idle: bool,
}

/// How long a connection accepted before a drain has to start its first request.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// Serves `stream` until the client is done or, after `drain` turns true, until the requests
/// in flight are answered: HTTP/1.1 then closes with `connection: close`, HTTP/2 sends GOAWAY.
///
/// Two stages, the second started when the first is over: the handshake and sniffing, then
/// the codec. As one `async` block the connection's state would hold the arguments and the
/// socket a second time beside the codec's state, for the connection's whole life, and every
/// idle connection holds this state.
///
/// Ends with the connection closed, or with it [`Parked`]: idle, handed back to be held as its
/// socket alone until the client sends again.
pub(crate) fn serve(
    stream: TcpStream,
    ctx: Rc<ConnCtx>,
    served: Served,
    drain: SignalWatch,
) -> impl Future<Output = Option<Parked>> {
    // Boxed: the handshake's and sniffing's state is over once the codec starts, and would
    // otherwise take room in every connection for its whole life.
    Box::pin(prepare(stream, ctx, served, drain)).then(move |prepared| {
        let Some(Prepared {
            io,
            sniffed,
            ctx,
            settings,
            http,
            drain,
            close,
        }) = prepared
        else {
            return Either::Right(
                Box::pin(std::future::ready(None)) as Pin<Box<dyn Future<Output = Option<Parked>>>>
            );
        };
        let service = ProxyService { conn: ctx, http };
        let served: Either<_, Pin<Box<dyn Future<Output = Option<Parked>>>>> = match sniffed {
            Sniffed::Http1 => Either::Left(http1::serve_h1(io, service, settings, drain)),
            // Boxed: HTTP/2's connection state is large, and most connections are HTTP/1.1.
            Sniffed::Http2 => Either::Right(Box::pin(async move {
                http2::serve_h2(io, service, &settings.codecs, drain).await;
                None
            })),
            // Boxed: few listeners relay TCP.
            Sniffed::Tcp => Either::Right(Box::pin(async move {
                let http = service.http.current();
                if let Some(tcp) = &http.tcp_proxy {
                    crate::tcp_proxy::serve(io.relay(), service.conn, tcp, &http.clusters).await;
                }
                None
            })),
            Sniffed::Closed => Either::Right(Box::pin(async move {
                let mut io = io;
                let _ = io.shutdown().await;
                None
            })),
        };
        // A chain's connection also ends when the chain's drain time is up (the chain was
        // removed): its relays and long streams do not outlive it.
        match close {
            None => Either::Left(served),
            Some(mut close) => Either::Right(Box::pin(async move {
                tokio::select! {
                    parked = served => parked,
                    () = close.raised() => None,
                }
            })
                as Pin<Box<dyn Future<Output = Option<Parked>>>>),
        }
    })
}

/// An idle HTTP/1.1 connection as its task hands it back: the socket alone (no task, no
/// buffer, no registration with the runtime) and what serving it again needs. A worker holds
/// many of these for the price of few connections (see `worker/parking.rs`).
pub(crate) struct Parked {
    pub(crate) socket: std::net::TcpStream,
    pub(crate) ctx: ParkedCtx,
    pub(crate) http: Rc<HttpSlot>,
    pub(crate) settings: Rc<ConnSettings>,
    /// Closed then if the client sends nothing (idle timeout, maximum duration).
    pub(crate) close_at: Instant,
}

impl Parked {
    /// When the connection is due to close: `None` if now (counted as an idle timeout or a
    /// maximum duration reached), else a later time.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        http1::parked_deadline(
            self.ctx.last_active(),
            self.ctx.expires_at(),
            self.ctx.listener(),
            &self.settings.codecs,
        )
    }
}

/// Serves a [`Parked`] connection whose client has sent again, on `stream` (its socket, back
/// with the runtime).
pub(crate) fn resume(
    stream: TcpStream,
    ctx: ParkedCtx,
    http: Rc<HttpSlot>,
    settings: Rc<ConnSettings>,
    drain: SignalWatch,
) -> impl Future<Output = Option<Parked>> {
    let service = ProxyService {
        conn: ctx.resume(),
        http,
    };
    http1::serve_h1(DownstreamIo::plain(stream), service, settings, drain)
}

/// What a new connection of a listener is served with: its own settings (its default
/// chain), and its other filter chains if it has any.
pub(crate) struct Served {
    pub(crate) http: Rc<HttpSlot>,
    pub(crate) settings: Rc<ConnSettings>,
    pub(crate) chains: Option<Rc<Chains>>,
}

/// A connection past its handshake, with the protocol it speaks.
struct Prepared {
    io: DownstreamIo,
    sniffed: Sniffed,
    ctx: Rc<ConnCtx>,
    settings: Rc<ConnSettings>,
    http: Rc<HttpSlot>,
    drain: SignalWatch,
    /// The chain's close flag, for a connection a chain serves.
    close: Option<SignalWatch>,
}

/// The PROXY protocol header, the filter chain and the TLS handshake where the listener has
/// them, then the protocol: `None` when the connection ended before it.
async fn prepare(
    mut stream: TcpStream,
    mut ctx: Rc<ConnCtx>,
    served: Served,
    mut drain: SignalWatch,
) -> Option<Prepared> {
    let Served {
        mut http,
        mut settings,
        chains,
    } = served;
    let _ = stream.set_nodelay(true);
    if let Some(probes) = &settings.tcp_keepalive
        && let Err(error) = socket2::SockRef::from(&stream).set_tcp_keepalive(probes)
    {
        tracing::debug!(peer = %ctx.peer, %error, "cannot set TCP keep-alive on a connection");
    }
    let mut taken = Vec::new();
    if let Some(expected) = &settings.proxy_protocol {
        let timeout = settings.codecs.request_headers_timeout;
        match proxy_protocol::read(&mut stream, expected, timeout).await {
            Ok(proxy_protocol::Header::Client {
                source,
                destination,
            }) => match Rc::get_mut(&mut ctx) {
                Some(ctx) => ctx.set_addresses(source, destination),
                // Nothing else holds the context before the codec starts.
                None => unreachable_shared(),
            },
            Ok(proxy_protocol::Header::Local) => {}
            Ok(proxy_protocol::Header::Absent { taken: first }) => taken = first,
            Err(error) => {
                ctx.listener.stats.cx_proxy_proto_error.inc();
                tracing::debug!(peer = %ctx.peer, %error, "connection closed");
                return None;
            }
        }
    }
    let mut close = None;
    if let Some(chains) = &chains {
        // Bytes taken while they could have begun a PROXY header are not peeked again.
        let picked = choose_chain(&stream, &ctx, chains, taken.is_empty()).await?;
        if let Some(entry) = picked {
            match Rc::get_mut(&mut ctx) {
                Some(ctx) => ctx.listener = Rc::clone(&entry.ctx),
                None => unreachable_shared(),
            }
            settings = Rc::clone(&entry.conn);
            http = Rc::clone(&entry.http);
            if let Some(chain) = &entry.ctx.chain {
                drain = chain.drain.watch();
                close = Some(chain.close.watch());
            }
        } else if let Some(own) = &ctx.listener.chain {
            // The listener's own settings as its default chain.
            drain = own.drain.watch();
            close = Some(own.close.watch());
        }
    } else if let Some(own) = &ctx.listener.chain {
        // No chains (yet): the listener's own flags, so that the connection drains if chains
        // come and the own settings stop being the default. Its relays and long streams are
        // left to the listener's close (no per-connection watch where there are no chains).
        drain = own.drain.watch();
    }
    let mut io = match &settings.tls {
        None => {
            let mut io = DownstreamIo::plain(stream);
            io.set_prefix(&taken);
            io
        }
        // Bytes taken while they could have begun a PROXY header (`PRO`, `\r\n`) begin no
        // TLS handshake.
        Some(_) if !taken.is_empty() => {
            ctx.listener.stats.cx_proxy_proto_error.inc();
            return None;
        }
        // Boxed: the handshake's state is large and over once it is done.
        Some(tls) => {
            let stream = Box::pin(tls.accept(stream)).await?;
            let session = stream.get_ref().1;
            let client_cert = crate::http::client_cert::of_connection(
                session.peer_certificates(),
                || tls.server().local_certificate(session.server_name()),
                http.current().forward_client_cert.writes_element(),
            );
            // The context is this task's alone until the connection is served. Were it not,
            // the certificate would be left out, and the header removed (the safe side).
            match Rc::get_mut(&mut ctx) {
                Some(ctx) => {
                    ctx.client_cert = client_cert;
                    ctx.server_name = session.server_name().map(Box::from);
                }
                // Nothing else holds the context before the codec starts.
                None => unreachable_shared(),
            }
            DownstreamIo::tls(stream)
        }
    };
    // ALPN, when it chose, says the protocol; otherwise the first bytes do. A relay does
    // not wait for the client to speak first: some protocols start with the server.
    let sniffed = match io.alpn() {
        _ if settings.tcp_proxy => Sniffed::Tcp,
        Some(b"h2") => Sniffed::Http2,
        Some(b"http/1.1") => Sniffed::Http1,
        _ => sniff(&mut io, &ctx, settings.codecs.idle_timeout, &mut drain).await,
    };
    Some(Prepared {
        io,
        sniffed,
        ctx,
        settings,
        http,
        drain,
        close,
    })
}

/// The chain that serves the connection: `Some(None)` for the listener's own settings,
/// `None` when the connection is closed (no chain fits, or its first bytes never came).
async fn choose_chain<'c>(
    stream: &TcpStream,
    ctx: &ConnCtx,
    chains: &'c Chains,
    may_peek: bool,
) -> Option<Option<&'c ChainEntry>> {
    let stats = &ctx.listener.stats;
    let hello = if chains.selector.inspects() && may_peek {
        let http = chains.selector.inspects_http();
        match client_hello::inspect(stream, chains.inspect_timeout, http).await {
            Ok(hello) => hello,
            Err(client_hello::HelloError::Timeout) if chains.continue_on_timeout => {
                stats.cx_pre_timeout.inc();
                client_hello::Hello::default()
            }
            Err(error) => {
                match error {
                    client_hello::HelloError::TooLarge => stats.cx_client_hello_too_large.inc(),
                    client_hello::HelloError::Timeout => stats.cx_pre_timeout.inc(),
                    client_hello::HelloError::Closed => {}
                }
                tracing::debug!(peer = %ctx.peer, ?error, "connection closed before its filter chain");
                return None;
            }
        }
    } else {
        client_hello::Hello::default()
    };
    let shown = chains::Shown {
        destination: ctx.local,
        source: ctx.peer,
        hello: &hello,
        quic: false,
    };
    match chains.selector.select(&shown) {
        Some(i) => Some(chains.entries.get(i)),
        None if chains.default => Some(None),
        None => {
            stats.cx_no_filter_chain_match.inc();
            tracing::debug!(peer = %ctx.peer, server_name = ?hello.server_name, "no filter chain matches the connection");
            None
        }
    }
}

/// `expect: 100-continue` (any case) on an HTTP/2 or HTTP/3 request that declares no empty
/// body: the codec tells the client to go on at once, as Envoy does.
fn expects_continue(headers: &http::HeaderMap) -> bool {
    let empty = (headers.get(http::header::CONTENT_LENGTH)).is_some_and(|v| v.as_bytes() == b"0");
    !empty
        && headers
            .get(http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

#[cold]
fn unreachable_shared() {
    tracing::warn!(
        "what the connection's start learned (PROXY protocol, chain, TLS peer) was not applied: the connection context is shared"
    );
}

enum Sniffed {
    Http1,
    Http2,
    /// Relayed to a cluster (`tcp_proxy`).
    Tcp,
    Closed,
}

/// Tells HTTP/2 prior knowledge from HTTP/1.1 by its first bytes, which are kept for the
/// codec. Nothing is allocated while the client says nothing.
///
/// A drain does not close a connection that has not spoken yet at once: it was accepted
/// before the drain, so its client is about to send a request, which is served (then the
/// connection closes). It has [`FIRST_REQUEST_GRACE`] to start.
async fn sniff(
    io: &mut DownstreamIo,
    ctx: &ConnCtx,
    idle_timeout: Duration,
    drain: &mut SignalWatch,
) -> Sniffed {
    let mut head = [0u8; H2_PREFACE.len()];
    let mut len = 0;
    let deadline = tokio::time::sleep(idle_timeout);
    tokio::pin!(deadline);
    let mut draining = false;
    loop {
        let read = tokio::select! {
            read = io.read(&mut head[len..]) => read,
            () = drain.raised(), if !draining => {
                draining = true;
                let grace = tokio::time::Instant::now() + FIRST_REQUEST_GRACE;
                if grace < deadline.deadline() {
                    deadline.as_mut().reset(grace);
                }
                continue;
            }
            _ = &mut deadline => {
                if !draining {
                    ctx.listener.stats.cx_idle_timeout.inc();
                }
                return Sniffed::Closed;
            }
        };
        match read {
            Ok(0) | Err(_) => return Sniffed::Closed,
            Ok(n) => len += n,
        }
        let sniffed = if head[..len] != H2_PREFACE[..len] {
            Sniffed::Http1
        } else if len == H2_PREFACE.len() {
            Sniffed::Http2
        } else {
            continue;
        };
        io.set_prefix(&head[..len]);
        return sniffed;
    }
}
