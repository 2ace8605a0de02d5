//! Upgrades: a client switching a connection to another protocol (WebSocket), on routes that
//! list it in `upgrades`. The request goes to the upstream on a connection of its own; if the
//! upstream answers `101 Switching Protocols`, the client gets the `101` and from then on
//! bytes are relayed both ways, within the buffer limit and the idle timeout.
//!
//! Two ways in: HTTP/1.1 `Upgrade:` (RFC 9110 section 7.8), and WebSocket over HTTP/2 by
//! extended CONNECT (RFC 8441), turned into an HTTP/1.1 WebSocket handshake upstream.
//!
//! CONNECT (RFC 9110 section 9.3.6, over HTTP/1.1 and HTTP/2) opens a tunnel the same way, on
//! routes with `connect`: forwarded, the upstream's 2xx opens it; terminated, a TCP connection
//! to a host of the cluster does (handler.rs).

use std::cell::Cell;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HeaderName, HeaderValue, UPGRADE};
use http::{Method, Request, StatusCode, Version};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use crate::context::stream_tunnel::StreamTunnel;
use crate::context::{ConnCtx, RequestBody, Tunnel, TunnelIo};
use crate::random::next_u64;

static SEC_WEBSOCKET_KEY: HeaderName = HeaderName::from_static("sec-websocket-key");
static SEC_WEBSOCKET_ACCEPT: HeaderName = HeaderName::from_static("sec-websocket-accept");

/// An upgrade a request asks for, on a route that allows it.
pub(crate) enum Asked {
    /// HTTP/1.1 `Upgrade:` with this header value.
    Http1(HeaderValue),
    /// HTTP/2 extended CONNECT for WebSocket: the stream becomes the tunnel once answered.
    ExtendedConnect(ClientStream),
    /// CONNECT, sent on as it is; over HTTP/2, the client's stream to await.
    Connect(Option<ClientStream>),
}

/// An HTTP/2 stream that becomes the client's side of a tunnel once answered: hyper's, or one
/// of Legate's own codec.
pub(crate) enum ClientStream {
    Hyper(OnUpgrade),
    Own(Box<StreamTunnel>),
}

impl ClientStream {
    /// The client's stream of `req`, which takes it: Legate's own codec leaves it in the body.
    fn of(req: &mut Request<RequestBody>) -> Self {
        match req.body_mut().take_stream_tunnel() {
            Some(own) => ClientStream::Own(own),
            None => ClientStream::Hyper(hyper::upgrade::on(req)),
        }
    }

    /// The stream once its 2xx has gone; `None` if it went away first.
    async fn opened(self) -> Option<Box<dyn TunnelIo>> {
        match self {
            ClientStream::Hyper(on_upgrade) => match on_upgrade.await {
                Ok(stream) => Some(Box::new(TokioIo::new(stream))),
                Err(error) => {
                    tracing::debug!(%error, "the client's stream went away before the tunnel opened");
                    None
                }
            },
            ClientStream::Own(stream) => {
                if stream.opened().await {
                    Some(stream)
                } else {
                    tracing::debug!("the client's stream was answered without its tunnel");
                    None
                }
            }
        }
    }
}

/// Whether `req` is a CONNECT for a tunnel (not an extended CONNECT, which names a protocol).
pub(crate) fn is_connect<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT && req.extensions().get::<hyper::ext::Protocol>().is_none()
}

/// The client's side of a CONNECT's tunnel: on HTTP/2 its stream, once answered; on HTTP/1.1
/// `None` (the connection takes the tunnel once the 2xx is written).
pub(crate) fn connect_stream(req: &mut Request<RequestBody>) -> Option<ClientStream> {
    (req.version() == Version::HTTP_2).then(|| ClientStream::of(req))
}

/// Whether `req` is an HTTP/2 extended CONNECT (`:protocol`).
pub(crate) fn is_extended_connect<B>(req: &Request<B>) -> bool {
    req.method() == Method::CONNECT && req.extensions().get::<hyper::ext::Protocol>().is_some()
}

/// The upgrade `req` asks for, if `allowed` lists it. A request asking for one the route does
/// not allow is forwarded as a plain request (its `Upgrade` header is hop-by-hop and goes).
pub(crate) fn asked(req: &mut Request<RequestBody>, allowed: &[String]) -> Option<Asked> {
    if allowed.is_empty() {
        return None;
    }
    if is_extended_connect(req) {
        let protocol = req.extensions().get::<hyper::ext::Protocol>()?;
        if !protocol.as_str().eq_ignore_ascii_case("websocket")
            || !allowed.iter().any(|a| a == "websocket")
        {
            return None;
        }
        return Some(Asked::ExtendedConnect(ClientStream::of(req)));
    }
    if req.version() != Version::HTTP_11 || !connection_has_upgrade(req.headers()) {
        return None;
    }
    let upgrade = req.headers().get(UPGRADE)?;
    // The first protocol offered: `websocket`, `h2c`, `spdy/3.1`. A route's name without a
    // version takes any version of it; one with a version, that version alone.
    let first = upgrade.to_str().ok()?.split(',').next()?.trim();
    let name = first.split('/').next()?.trim();
    allowed
        .iter()
        .any(|a| {
            if a.contains('/') {
                a.eq_ignore_ascii_case(first)
            } else {
                a.eq_ignore_ascii_case(name)
            }
        })
        .then(|| Asked::Http1(upgrade.clone()))
}

/// Drops an `Upgrade` whose value one of `ignored` matches (and `upgrade` from `Connection`):
/// the request is then a plain one (Envoy's `ignore_http_11_upgrade`).
pub(crate) fn ignore_listed(headers: &mut http::HeaderMap, ignored: &[config::StringMatch]) {
    let listed = headers
        .get(UPGRADE)
        .is_some_and(|v| ignored.iter().any(|m| m.matches(v.as_bytes())));
    if !listed {
        return;
    }
    headers.remove(UPGRADE);
    let others: Vec<String> = crate::header_list::items(headers, CONNECTION)
        .filter(|t| !t.eq_ignore_ascii_case("upgrade"))
        .map(str::to_owned)
        .collect();
    headers.remove(CONNECTION);
    if let Ok(value) = HeaderValue::from_str(&others.join(", "))
        && !others.is_empty()
    {
        headers.insert(CONNECTION, value);
    }
}

fn connection_has_upgrade(headers: &http::HeaderMap) -> bool {
    crate::header_list::contains(headers, CONNECTION, "upgrade")
}

impl Asked {
    /// Makes the (already rewritten) upstream request an HTTP/1.1 upgrade request.
    pub(crate) fn prepare(&self, parts: &mut http::request::Parts) {
        if let Asked::Connect(_) = self {
            return;
        }
        parts
            .headers
            .insert(CONNECTION, HeaderValue::from_static("upgrade"));
        match self {
            Asked::Http1(upgrade) => {
                parts.headers.insert(UPGRADE, upgrade.clone());
            }
            Asked::Connect(_) => {}
            Asked::ExtendedConnect(_) => {
                // RFC 8441 section 5: the HTTP/1.1 handshake's GET, key and version.
                parts.method = Method::GET;
                parts
                    .headers
                    .insert(UPGRADE, HeaderValue::from_static("websocket"));
                parts
                    .headers
                    .insert(SEC_WEBSOCKET_KEY.clone(), websocket_key());
            }
        }
    }

    /// The client's answer to the upstream's `101`: a `101` on HTTP/1.1, a `200` on an HTTP/2
    /// stream. `head` is the upstream's, hop-by-hop headers already gone.
    pub(crate) fn client_head(
        &self,
        head: &mut http::response::Parts,
        upstream_upgrade: Option<HeaderValue>,
    ) {
        match self {
            Asked::Http1(asked) => {
                head.headers
                    .insert(CONNECTION, HeaderValue::from_static("upgrade"));
                head.headers
                    .insert(UPGRADE, upstream_upgrade.unwrap_or_else(|| asked.clone()));
            }
            Asked::ExtendedConnect(_) => {
                head.status = StatusCode::OK;
                head.headers.remove(&SEC_WEBSOCKET_ACCEPT);
            }
            // A 2xx to CONNECT frames no body (RFC 9110 section 9.3.6).
            Asked::Connect(_) => {
                head.headers.remove(http::header::CONTENT_LENGTH);
                head.headers.remove(http::header::TRANSFER_ENCODING);
            }
        }
    }

    /// Whether the upstream's answer opens the tunnel: a `101`, or a 2xx to CONNECT.
    pub(crate) fn opened_by(&self, status: StatusCode) -> bool {
        match self {
            Asked::Connect(_) => status.is_success(),
            _ => status == StatusCode::SWITCHING_PROTOCOLS,
        }
    }

    /// The client's stream to await for the tunnel (HTTP/2); `None` on HTTP/1.1.
    pub(crate) fn into_client_stream(self) -> Option<ClientStream> {
        match self {
            Asked::Http1(_) => None,
            Asked::ExtendedConnect(on_upgrade) => Some(on_upgrade),
            Asked::Connect(on_upgrade) => on_upgrade,
        }
    }
}

/// 16 random bytes in base64, as a WebSocket key is written.
fn websocket_key() -> HeaderValue {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bytes = [0u8; 18];
    bytes[..8].copy_from_slice(&next_u64().to_le_bytes());
    bytes[8..16].copy_from_slice(&next_u64().to_le_bytes());
    let mut text = [0u8; 24];
    for (i, chunk) in bytes.chunks(3).enumerate() {
        let n = u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8 | u32::from(chunk[2]);
        for j in 0..4 {
            text[i * 4 + j] = ALPHABET[(n >> (18 - 6 * j) & 63) as usize];
        }
    }
    // 16 bytes end in one padded group: the last two characters are padding.
    text[22] = b'=';
    text[23] = b'=';
    HeaderValue::from_bytes(&text).expect("base64 is valid header text")
}

/// Relays bytes between the client and the upstream until both are done, either side fails,
/// or neither sends for `idle_timeout`. `prefix` is what the client sent after its request
/// head, which goes upstream first. At most `buffer` bytes are held per direction: a slow
/// reader makes the relay stop reading the other side.
pub(crate) async fn relay<D>(
    downstream: D,
    prefix: Bytes,
    tunnel: Tunnel,
    conn: &ConnCtx,
    idle_timeout: Duration,
    buffer: usize,
) where
    D: AsyncRead + AsyncWrite + Unpin,
{
    let Tunnel {
        upstream,
        mut in_flight,
    } = tunnel;
    let stats = &conn.listener.stats;
    stats.upgrades.inc();
    // Counted down however the relay ends, also when its future is dropped mid-way.
    let _active = ActiveUpgrade::enter(&stats.upgrades_active);
    let mut upstream = upstream;
    let activity = Cell::new(Instant::now());
    let received = in_flight.received_counter();
    let sent = Cell::new(0u64);
    let outcome = async {
        if !prefix.is_empty() {
            upstream.write_all(&prefix).await?;
            count(&received, prefix.len());
        }
        let (down_read, down_write) = tokio::io::split(downstream);
        let (up_read, up_write) = tokio::io::split(upstream);
        let to_upstream = crate::relay::pipe(down_read, up_write, buffer, &activity, |n| {
            count(&received, n)
        });
        let to_client = crate::relay::pipe(up_read, down_write, buffer, &activity, |n| {
            sent.set(sent.get() + n as u64);
        });
        tokio::try_join!(to_upstream, to_client).map(drop)
    };
    tokio::select! {
        result = outcome => {
            if let Err(error) = result {
                tracing::debug!(%error, "upgraded connection ended with an error");
            }
        }
        () = crate::runtime::idle_for(idle_timeout, &activity) => stats.cx_idle_timeout.inc(),
    }
    in_flight.sent(sent.get() as usize);
    drop(in_flight);
}

/// One relay counted in `downstream_cx_upgrades_active` while it lives.
struct ActiveUpgrade<'a>(&'a stats::Gauge);

impl<'a> ActiveUpgrade<'a> {
    fn enter(gauge: &'a stats::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for ActiveUpgrade<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn count(counter: &Option<std::rc::Rc<Cell<u64>>>, n: usize) {
    if let Some(counter) = counter {
        counter.set(counter.get() + n as u64);
    }
}

/// Runs the relay of an HTTP/2 stream that a CONNECT or an extended CONNECT made a tunnel,
/// once its 2xx has gone.
pub(crate) async fn relay_h2_stream(
    stream: ClientStream,
    tunnel: Tunnel,
    conn: std::rc::Rc<ConnCtx>,
    idle_timeout: Duration,
    buffer: usize,
) {
    match stream.opened().await {
        Some(stream) => relay(stream, Bytes::new(), tunnel, &conn, idle_timeout, buffer).await,
        None => conn.listener.stats.upgrades_failed.inc(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_keys_are_16_bytes_of_base64() {
        let a = websocket_key();
        let b = websocket_key();
        assert_ne!(a, b);
        let text = a.to_str().unwrap();
        assert_eq!(text.len(), 24);
        assert!(text.ends_with("=="));
        assert!(
            text[..22]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
        );
    }

    #[test]
    fn a_route_names_a_protocol_with_or_without_its_version() {
        let asks = |upgrade: &str, allowed: &[&str]| {
            let mut req = Request::get("/")
                .header("connection", "upgrade")
                .header("upgrade", upgrade)
                .body(RequestBody::empty())
                .unwrap();
            let allowed: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
            asked(&mut req, &allowed).is_some()
        };
        assert!(asks("websocket", &["websocket"]));
        assert!(asks("spdy/3.1", &["spdy"]), "any version");
        assert!(asks("SPDY/3.1", &["spdy/3.1"]));
        assert!(!asks("spdy/2", &["spdy/3.1"]), "that version alone");
        assert!(!asks("h2c", &["spdy/3.1"]));
    }
}
