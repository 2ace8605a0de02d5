//! The HTTP request path after the codec: route, authorize, forward to a cluster or answer
//! locally (the response body streamed back is `filters::ResponseBody`).
//!
//! ```text
//! handler.rs        one request: route, filters, then a local reply or the forward
//! early_data.rs     requests that came in 0-RTT: safe ones marked, others 425
//! head.rs           the head's checks before anything reads it: size, path, host, route
//! rewrite.rs        the request head as the upstream gets it, and the response head back
//! redirect.rs       a redirect's location; the path a prefix or regex rewrite forwards
//! mirror.rs         copies of requests sent to mirror clusters, their answers discarded
//! internal_redirect.rs  upstream redirects a route follows itself, the request sent on
//! forwarding.rs     hop-by-hop headers, x-forwarded-for and -proto
//! local_reply.rs    responses the proxy writes itself
//! upgrade.rs        upgrades (WebSocket) and CONNECT tunnels: the handshake, then bytes both ways
//! ```

pub(crate) mod client_cert;
mod early_data;
pub(crate) mod forwarding;
pub(crate) mod handler;
mod hash_policy;
pub(crate) mod head;
mod internal_redirect;
pub(crate) mod local_reply;
mod mirror;
mod redirect;
mod rewrite;
mod upgrade;

use std::rc::Rc;

pub use crate::filters::ResponseBody;
pub(crate) use early_data::{ReceivedInEarlyData, is_safe as is_safe_method};
pub(crate) use upgrade::relay as relay_tunnel;

use crate::cluster::Cluster;
use crate::filters::FilterChain;
use crate::router::RouteTable;

/// What the HTTP request path of one listener needs on one worker: its routes, its filter
/// chain, and the worker's clusters the routes forward to.
pub(crate) struct HttpCtx {
    /// Built once per config version, shared by the workers.
    pub(crate) routes: std::sync::Arc<RouteTable>,
    pub(crate) filters: FilterChain,
    /// The worker's clusters, in config order (routes refer to them by index).
    pub(crate) clusters: Rc<[Rc<Cluster>]>,
    /// An upgraded connection with nothing moving for this long is closed.
    pub(crate) upgrade_idle_timeout: std::time::Duration,
    /// Bytes an upgraded connection holds per direction.
    pub(crate) upgrade_buffer: usize,
    /// `alt-svc` for the listener's HTTP/3, on responses over TCP.
    pub(crate) alt_svc: Option<http::HeaderValue>,
    pub(crate) path_normalization: config::PathNormalization,
    /// Starts each request's trace, when `tracing` is configured and the listener traces.
    pub(crate) tracer: Option<Rc<crate::trace::WorkerTracer>>,
    /// The listener's sampling and span tags.
    pub(crate) trace_policy: crate::trace::TracePolicy,
    /// Routes' own policies, by route index in order.
    pub(crate) route_trace_policies: Box<[(usize, crate::trace::TracePolicy)]>,
    /// What a request header named with `_` gets.
    pub(crate) headers_with_underscores: config::HeadersWithUnderscores,
    /// The `server` header of every response.
    pub(crate) server_header: ServerHeader,
    /// The proxy's own response headers (`x-legate-overloaded`) are left out.
    pub(crate) suppress_proxy_headers: bool,
    pub(crate) request_id: RequestIdPolicy,
    /// HTTP/1.0 requests are served (426 otherwise).
    pub(crate) accept_http_10: bool,
    /// A request's body must end within this from its head, unless the response has begun.
    pub(crate) request_timeout: Option<std::time::Duration>,
    /// A request and its response must be done within this from the head (a route may say
    /// otherwise).
    pub(crate) max_stream_duration: Option<std::time::Duration>,
    /// HTTP/1.1 `Upgrade` values dropped, the request then served as a plain one.
    pub(crate) ignore_http11_upgrade: Box<[config::StringMatch]>,
    /// The host of an HTTP/1.0 request that names none.
    pub(crate) default_host_for_http_10: Option<http::HeaderValue>,
    /// What is taken off a request's host (its `local_port` filled in per connection).
    pub(crate) host_rules: head::HostRules,
    /// Request header changes made before routing.
    pub(crate) early_header_mutation: Option<crate::filters::Mutations>,
    /// Rewrites of local replies, when the listener has any.
    pub(crate) local_replies: Option<local_reply::LocalReplies>,
    /// What a request's `x-forwarded-client-cert` gets, and what the element a connection
    /// writes says.
    pub(crate) forward_client_cert: config::listener::client_cert::ForwardClientCert,
    pub(crate) client_cert_details: config::listener::client_cert::ClientCertDetails,
    /// On a `tcp_proxy` listener, where its connections are relayed (there is no HTTP).
    pub(crate) tcp_proxy: Option<crate::tcp_proxy::TcpProxyCtx>,
}

/// What is done with `x-request-id`, decided once per config.
#[derive(Clone, Copy)]
pub(crate) struct RequestIdPolicy {
    /// A request without one gets one (when it is forwarded or a filter needs it).
    pub(crate) generate: bool,
    /// The client's is replaced by a new one, on every request.
    pub(crate) replace_external: bool,
    /// The response carries it.
    pub(crate) in_response: bool,
}

impl RequestIdPolicy {
    pub(crate) fn new(http: &config::HttpConfig) -> Self {
        let id = http.request_id;
        Self {
            generate: id.generate,
            replace_external: id.generate && !id.preserve_external && http.use_remote_address,
            in_response: id.always_set_in_response,
        }
    }
}

/// The `server` header of a listener's responses, as header text made once.
pub(crate) enum ServerHeader {
    PassThrough,
    Overwrite(http::HeaderValue),
    AppendIfAbsent(http::HeaderValue),
}

impl ServerHeader {
    pub(crate) fn new(config: &config::ServerHeader) -> Self {
        // The name was checked as visible ASCII when the config was loaded.
        let value = |name: &str| {
            http::HeaderValue::try_from(name)
                .unwrap_or_else(|_| http::HeaderValue::from_static("legate"))
        };
        match config {
            config::ServerHeader::PassThrough => Self::PassThrough,
            config::ServerHeader::Overwrite(name) => Self::Overwrite(value(name)),
            config::ServerHeader::AppendIfAbsent(name) => Self::AppendIfAbsent(value(name)),
        }
    }

    /// Sets the header on a response about to go to the client.
    pub(crate) fn apply(&self, headers: &mut http::HeaderMap) {
        match self {
            Self::PassThrough => {}
            Self::Overwrite(value) => {
                headers.insert(http::header::SERVER, value.clone());
            }
            Self::AppendIfAbsent(value) => {
                if !headers.contains_key(http::header::SERVER) {
                    headers.insert(http::header::SERVER, value.clone());
                }
            }
        }
    }
}

/// A listener's current [`HttpCtx`] on one worker. A connection reads it once per request,
/// so the next request on a kept-alive connection follows a config change while requests in
/// flight finish on the context they started with.
pub(crate) struct HttpSlot(std::cell::RefCell<Rc<HttpCtx>>);

impl HttpSlot {
    pub(crate) fn new(ctx: HttpCtx) -> Self {
        Self(std::cell::RefCell::new(Rc::new(ctx)))
    }

    pub(crate) fn current(&self) -> Rc<HttpCtx> {
        Rc::clone(&self.0.borrow())
    }

    /// Puts `ctx` in place for the requests that start from now on; returns the one it
    /// replaces (dropped by the caller outside the borrow: its drop may run arbitrary code).
    #[must_use]
    pub(crate) fn replace(&self, ctx: HttpCtx) -> Rc<HttpCtx> {
        self.0.replace(Rc::new(ctx))
    }
}
