//! HTTP filters: the extension seam of the request path.
//!
//! A listener's `http_filters` become a [`FilterChain`], built once per worker from config.
//! Requests and responses pass through fixed phases:
//!
//! ```text
//! request headers   in chain order; a filter continues, answers locally, or asks for the body
//! request body      the start of the body, read ahead for the filters that asked (ext_authz)
//!    ... route action: the upstream's response, a direct response or an error reply ...
//! response headers  in reverse order, over the filters whose request phase let the request on
//! response body     frames through the body filter a response phase set up (compression)
//! log               once the response is done with, however it ended
//! ```
//!
//! Every phase can change what it sees. A filter answering locally (a denial, a 429, a CORS
//! preflight) stops the request phase there; the answer then passes the response phases of
//! the filters before it, so their headers (CORS, `headers`) still apply. Routes can turn a
//! filter off or give it settings of their own; each filter resolves that by route index.
//!
//! Dispatch is static: the chain is a slice of [`Filter`], an enum with one variant per
//! filter, matched in each phase. A request through a chain of filters that do nothing costs
//! a loop over the slice and no allocation. `docs/architecture.md` says how to add a filter.

mod body;
mod compression;
mod cors;
mod ext_authz;
mod headers;
mod local_rate_limit;
mod per_route;
mod token_bucket;

use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, StatusCode};

pub(crate) use body::BodyFilter;
use compression::Compression;
use cors::Cors;
use ext_authz::ExtAuthz;
use headers::Headers;
use local_rate_limit::LocalRateLimit;
pub(crate) use local_rate_limit::SharedLimits;
use per_route::PerRouteSettings;

use crate::catalog::Catalog;
use crate::context::request_id::X_REQUEST_ID;
use crate::context::{Client, ConnCtx, RequestBody, RequestTrace};
use crate::error::{ProxyError, ResponseFlag};
use config::{HttpFilterConfig, ListenerConfig};

/// One filter of a chain.
pub(crate) enum Filter {
    /// Boxed: its client state is large, and the others are a few words.
    ExtAuthz(Box<ExtAuthz>),
    LocalRateLimit(LocalRateLimit),
    Headers(Headers),
    Compression(Compression),
    Cors(Cors),
}

/// A listener's filters on one worker, in order.
pub(crate) struct FilterChain {
    filters: Box<[Filter]>,
    /// A filter reads the request id (ext_authz sends it, `%REQ_ID%` in a header rule): the
    /// id is then made before the filters run, and kept for the response phase.
    uses_request_id: bool,
}

/// An answer a filter gives instead of letting the request on.
pub(crate) struct LocalReply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// The response flag for the access log.
    pub(crate) flag: Option<ResponseFlag>,
}

impl LocalReply {
    pub(crate) fn new(status: StatusCode, body: Bytes) -> Self {
        Self {
            status,
            headers: HeaderMap::new(),
            body,
            flag: None,
        }
    }
}

/// What a request phase decided.
pub(crate) enum Flow {
    Continue,
    /// Answer with this; the route is not taken. Boxed: the rare case.
    Respond(Box<LocalReply>),
}

/// What one filter's request-headers phase decided.
enum HeadersFlow {
    Flow(Flow),
    /// Read up to this many bytes of the body ahead, then run the request-body phase.
    ReadBody(usize),
}

/// The exchange as the phases see it.
pub(crate) struct Exchange<'a> {
    pub(crate) conn: &'a ConnCtx,
    /// Where the request comes from (the peer, or behind trusted proxies an address from
    /// `x-forwarded-for`).
    pub(crate) client: &'a Client,
    /// The host the client asked for (`host`, or the authority of the request target).
    pub(crate) host: Option<&'a HeaderValue>,
    /// The index of the virtual host the request's host picked; `None` when none did.
    pub(crate) virtual_host: Option<usize>,
    /// The matched route's index; `None` when no route matched (filters use the host's or
    /// the listener's settings, then the client gets 404).
    pub(crate) route: Option<usize>,
    /// The request's trace, when the listener traces: calls a filter makes join it.
    pub(crate) trace: Option<&'a RequestTrace>,
}

impl Exchange<'_> {
    /// The host the client asked for, as text (empty when none). Read only by the filters
    /// that need it.
    pub(crate) fn host_text(&self) -> &str {
        self.host.and_then(|h| h.to_str().ok()).unwrap_or("")
    }
}

/// What the filters remember about one exchange between its phases. Small and allocation-free
/// unless a filter has something to keep.
#[derive(Default)]
pub(crate) struct FilterState {
    /// How many filters let the request on: the response phases run over these.
    entered: usize,
    /// Headers the authorization service asked to add to the response.
    authz_response: Option<Box<authz_client::Allowed>>,
    /// The rate limit's verdict, for `x-ratelimit-*` headers on the response.
    rate_limit: Option<local_rate_limit::Verdict>,
    /// The encodings the client accepts, for compression.
    accept: compression::Accepted,
    /// The request's allowed `Origin`, for CORS response headers.
    cors_origin: Option<HeaderValue>,
    /// The request's `x-request-id`, for `%REQ_ID%` in response header rules.
    request_id: Option<HeaderValue>,
}

/// The response head as the response phases see it: changed in place, not taken apart.
pub(crate) struct ResponseHead<'a> {
    pub(crate) status: StatusCode,
    pub(crate) headers: &'a mut HeaderMap,
}

/// What a response phase needs besides the response.
pub(crate) struct ResponseInfo<'a> {
    /// The upstream host that answered, as text; `None` for local replies.
    pub(crate) upstream: Option<&'a HeaderValue>,
    /// The request was a HEAD: the response has no body to change.
    pub(crate) head_request: bool,
}

/// State the filters share across workers, built once per listener.
pub(crate) struct SharedFilters {
    limits: Option<Arc<SharedLimits>>,
}

impl SharedFilters {
    pub(crate) fn new(listener: &ListenerConfig) -> Self {
        let limits = listener.http_filters.iter().find_map(|f| match f {
            HttpFilterConfig::LocalRateLimit(config) => {
                Some(Arc::new(SharedLimits::new(config, &listener.route_config)))
            }
            _ => None,
        });
        Self { limits }
    }
}

impl FilterChain {
    /// The chain of `listener`'s `http_filters` for one worker.
    pub(crate) fn new(
        listener: &ListenerConfig,
        shared: &SharedFilters,
        catalog: &Catalog,
        shard: &stats::Shard,
    ) -> Self {
        let name = listener.name.as_str();
        let table = &listener.route_config;
        let filters = listener
            .http_filters
            .iter()
            .map(|config| match config {
                HttpFilterConfig::ExtAuthz(config) => Filter::ExtAuthz(Box::new(ExtAuthz::new(
                    config,
                    &table.routes,
                    catalog.authz(shard, name),
                ))),
                HttpFilterConfig::LocalRateLimit(config) => {
                    Filter::LocalRateLimit(LocalRateLimit::new(
                        config,
                        table,
                        shared.limits.as_ref(),
                        catalog.rate_limit(shard, name),
                    ))
                }
                HttpFilterConfig::Headers(config) => Filter::Headers(Headers::new(config, table)),
                HttpFilterConfig::Compression(config) => Filter::Compression(Compression::new(
                    config,
                    table,
                    Rc::new(catalog.compression(shard, name)),
                )),
                HttpFilterConfig::Cors(config) => Filter::Cors(Cors::new(config, table)),
            })
            .collect::<Box<[Filter]>>();
        let uses_request_id = filters.iter().any(|f| match f {
            Filter::ExtAuthz(_) => true,
            Filter::Headers(headers) => headers.uses_request_id(),
            _ => false,
        });
        Self {
            filters,
            uses_request_id,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// The request phases: headers in chain order, and the body for the filters that ask.
    /// Stops at the first filter that answers.
    pub(crate) async fn on_request(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut FilterState,
    ) -> Result<Flow, ProxyError> {
        for filter in self.filters.iter() {
            let flow = match filter.on_request_headers(req, exchange, state).await? {
                HeadersFlow::Flow(flow) => flow,
                HeadersFlow::ReadBody(max) => {
                    let (start, whole) = req
                        .body_mut()
                        .read_ahead(max)
                        .await
                        .map_err(|source| ProxyError::ClientAborted { source })?;
                    filter
                        .on_request_body(req, &start, whole, exchange, state)
                        .await?
                }
            };
            match flow {
                Flow::Continue => state.entered += 1,
                respond => return Ok(respond),
            }
        }
        Ok(Flow::Continue)
    }

    /// Whether a filter reads the request id: if so the request gets one before the filters.
    pub(crate) fn uses_request_id(&self) -> bool {
        self.uses_request_id
    }

    /// Remembers the request id the exchange ended up with, for response rules.
    pub(crate) fn note_request_id(&self, state: &mut FilterState, headers: &HeaderMap) {
        if self.uses_request_id {
            state.request_id = headers.get(&X_REQUEST_ID).cloned();
        }
    }

    /// The response-headers phase, in reverse order over the filters the request passed. A
    /// filter that wants to change the body returns the body filter for it.
    pub(crate) fn on_response<B>(
        &self,
        response: &mut http::Response<B>,
        exchange: &Exchange<'_>,
        info: &ResponseInfo<'_>,
        state: &mut FilterState,
    ) -> Option<BodyFilter> {
        let status = response.status();
        let head = &mut ResponseHead {
            status,
            headers: response.headers_mut(),
        };
        let mut body = None;
        for filter in self.filters[..state.entered].iter().rev() {
            match filter {
                Filter::ExtAuthz(f) => f.on_response(head, state),
                Filter::LocalRateLimit(f) => f.on_response(head, state),
                Filter::Headers(f) => f.on_response(head, exchange, info, state),
                Filter::Compression(f) => {
                    if let Some(compress) = f.on_response(head, exchange, info, state) {
                        body = Some(compress);
                    }
                }
                Filter::Cors(f) => f.on_response(head, exchange, state),
            }
        }
        body
    }
}

impl Filter {
    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut FilterState,
    ) -> Result<HeadersFlow, ProxyError> {
        Ok(match self {
            // Boxed: the check's state is large, and only this filter needs it.
            Filter::ExtAuthz(f) => Box::pin(f.on_request_headers(req, exchange, state)).await?,
            Filter::LocalRateLimit(f) => HeadersFlow::Flow(f.on_request(req, exchange, state)),
            Filter::Headers(f) => {
                f.on_request(req, exchange);
                HeadersFlow::Flow(Flow::Continue)
            }
            Filter::Compression(f) => {
                f.on_request(req, exchange, state);
                HeadersFlow::Flow(Flow::Continue)
            }
            Filter::Cors(f) => HeadersFlow::Flow(f.on_request(req, exchange, state)),
        })
    }

    async fn on_request_body(
        &self,
        req: &mut Request<RequestBody>,
        start: &Bytes,
        whole: bool,
        exchange: &Exchange<'_>,
        state: &mut FilterState,
    ) -> Result<Flow, ProxyError> {
        match self {
            Filter::ExtAuthz(f) => {
                Box::pin(f.on_request_body(req, start, whole, exchange, state)).await
            }
            // Only filters that asked for the body get here.
            _ => Ok(Flow::Continue),
        }
    }
}

#[cfg(any(test, feature = "bench"))]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
