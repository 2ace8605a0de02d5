//! HTTP filters: the extension seam of the request path.
//!
//! A listener's `http_filters` become a [`FilterChain`], built once per worker from config.
//! Requests and responses pass through fixed phases, each a method of [`HttpFilter`] whose
//! default does nothing:
//!
//! ```text
//! request headers   in chain order; a filter continues, answers locally, or asks for the body
//! request body      the start of the body, read ahead for the filters that asked (ext_authz)
//!    ... route action: the upstream's response, a direct response or an error reply ...
//! response headers  in reverse order, over the filters whose request phase let the request on
//! response body     frames through the body filter a response phase set up (compression)
//! ```
//!
//! Every phase can change what it sees. A filter answering locally (a denial, a 429, a CORS
//! preflight) stops the request phase there; the answer then passes the response phases of
//! the filters before it, so their headers (CORS, `headers`) still apply. Routes can turn a
//! filter off or give it settings of their own; each filter resolves that by route index.
//!
//! A filter is one module here: a type implementing [`HttpFilter`], with its settings from its
//! config topic (`crates/config/src/filters/<name>.rs`), its per-exchange state and its stats.
//! It is registered by one line in the `filters!` list below, which writes the chain's
//! [`Filter`] enum, the per-exchange [`FilterState`], the per-listener [`SharedFilters`] and
//! the dispatch of each phase. Dispatch is static (a match over the enum, no boxing, no
//! dynamic call): a request through filters that do nothing costs a loop over the slice and
//! no allocation.

mod body;
mod grpc_service;
mod per_route;
mod rate_limit_actions;
mod reply_rewrite;
mod response_body;
mod token_bucket;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};

pub(crate) use body::BodyFilter;
pub(crate) use headers::Mutations;
use per_route::PerRouteSettings;
pub(crate) use rbac::decide_connection;
pub(crate) use reply_rewrite::ReplyRewrite;
pub use response_body::ResponseBody;

use std::rc::Rc;

use crate::catalog::Catalog;
use crate::cluster::Cluster;
use crate::context::request_id::X_REQUEST_ID;
use crate::context::{Client, ConnCtx, RequestBody};
use crate::error::{ProxyError, ResponseFlag};
use crate::trace::RequestTrace;
use config::{ChainFilter, HttpFilterConfig, ListenerConfig, RouteConfiguration};

/// An HTTP filter on one worker. Only [`HttpFilter::new`] must be written; each phase it does
/// not take part in keeps its default, which lets the exchange on untouched.
pub(crate) trait HttpFilter: Sized {
    /// Its settings, validated (the filter's config topic).
    type Config;
    /// What the workers share for one listener (process-wide buckets, say); `()` for none.
    type Shared;
    /// What it remembers about one exchange between its phases; `()` for nothing. Small and
    /// allocation-free by default: every exchange makes one.
    type State: Default;

    /// The shared part, built once per listener and generation; `filter` is the filter's
    /// name in the chain.
    fn shared(
        _config: &Self::Config,
        _listener: &ListenerConfig,
        _filter: &str,
    ) -> Option<Self::Shared> {
        None
    }

    /// The filter on one worker.
    fn new(config: &Self::Config, shared: Option<&Self::Shared>, ctx: &BuildCtx<'_>) -> Self;

    /// Whether it reads the request id: the request then gets one before the filters run.
    fn uses_request_id(&self) -> bool {
        false
    }

    /// The request's head: continue, answer, or ask for the start of the body.
    async fn on_request_headers(
        &self,
        _req: &mut Request<RequestBody>,
        _exchange: &Exchange<'_>,
        _state: &mut Self::State,
    ) -> Result<HeadersFlow, ProxyError> {
        Ok(HeadersFlow::Flow(Flow::Continue))
    }

    /// The start of the body (`whole`: all of it), for a filter that asked for it.
    async fn on_request_body(
        &self,
        _req: &mut Request<RequestBody>,
        _start: &Bytes,
        _whole: bool,
        _exchange: &Exchange<'_>,
        _state: &mut Self::State,
    ) -> Result<Flow, ProxyError> {
        Ok(Flow::Continue)
    }

    /// Whether the response phase of this exchange waits on something (an external
    /// processor): [`HttpFilter::on_response`] then runs instead of the response-headers phase.
    fn waits_on_response(&self, _state: &Self::State) -> bool {
        false
    }

    /// The response phase of a filter that waits (see [`HttpFilter::waits_on_response`]): it
    /// may read the body, and change or replace the whole response.
    async fn on_response(
        &self,
        _response: &mut Response<ResponseBody>,
        _ctx: &ResponseCtx<'_>,
        _state: &mut Self::State,
    ) {
    }

    /// The response's head, changed in place; a filter that changes the body returns the
    /// body filter that does it.
    fn on_response_headers(
        &self,
        _head: &mut ResponseHead<'_>,
        _ctx: &ResponseCtx<'_>,
        _state: &mut Self::State,
    ) -> Option<BodyFilter> {
        None
    }
}

/// What a filter is built from on a worker, besides its settings.
pub(crate) struct BuildCtx<'a> {
    pub(crate) listener: &'a ListenerConfig,
    /// The listener's route table: per-route settings are resolved against it.
    pub(crate) table: &'a RouteConfiguration,
    /// The filter's name in the chain (`TYPE` or `TYPE/INSTANCE`): routes' settings for it
    /// are found by it.
    pub(crate) filter: &'a str,
    pub(crate) catalog: &'a Catalog,
    /// The worker's stats shard.
    pub(crate) shard: &'a stats::Shard,
    /// The worker's clusters, in config order: those a filter calls (a JWKS server).
    pub(crate) clusters: &'a [Rc<Cluster>],
}

/// The filters, one line each: `Variant(module::Type)`, the variant named as in
/// `config::HttpFilterConfig`. Writes the modules, [`Filter`], [`FilterState`],
/// [`SharedFilters`] and each phase's dispatch.
macro_rules! filters {
    ($($variant:ident($module:ident::$filter:ident)),* $(,)?) => {
        $(mod $module;)*

        /// One filter of a chain.
        pub(crate) enum Filter {
            $($variant($module::$filter),)*
        }

        /// What the filters remember about one exchange between its phases.
        #[derive(Default)]
        pub(crate) struct FilterState {
            /// How many filters let the request on: the response phases run over these.
            entered: usize,
            /// The request's `x-request-id`, for filters that write it into the response.
            request_id: Option<HeaderValue>,
            $($module: Instances<<$module::$filter as HttpFilter>::State>,)*
        }

        /// State the filters share across workers, built once per listener: per type, one
        /// entry per filter of the type, in chain order.
        pub(crate) struct SharedFilters {
            $($module: Vec<Option<<$module::$filter as HttpFilter>::Shared>>,)*
        }

        impl SharedFilters {
            pub(crate) fn new(listener: &ListenerConfig) -> Self {
                let mut shared = Self { $($module: Vec::new(),)* };
                for ChainFilter { name, config } in &listener.http_filters {
                    match config {
                        $(HttpFilterConfig::$variant(config) => {
                            shared.$module.push(<$module::$filter as HttpFilter>::shared(config, listener, name));
                        })*
                    }
                }
                shared
            }
        }

        impl Filter {
            /// `ordinal`: its place among the chain's filters of its type.
            fn new(config: &HttpFilterConfig, shared: &SharedFilters, ordinal: usize, ctx: &BuildCtx<'_>) -> Self {
                match config {
                    $(HttpFilterConfig::$variant(config) => Filter::$variant(
                        <$module::$filter as HttpFilter>::new(
                            config,
                            shared.$module.get(ordinal).and_then(Option::as_ref),
                            ctx,
                        ),
                    ),)*
                }
            }

            fn uses_request_id(&self) -> bool {
                match self {
                    $(Filter::$variant(f) => f.uses_request_id(),)*
                }
            }

            async fn on_request_headers(
                &self,
                req: &mut Request<RequestBody>,
                exchange: &Exchange<'_>,
                state: &mut FilterState,
                ordinal: usize,
            ) -> Result<HeadersFlow, ProxyError> {
                match self {
                    $(Filter::$variant(f) => {
                        f.on_request_headers(req, exchange, state.$module.get_mut(ordinal)).await
                    })*
                }
            }

            async fn on_request_body(
                &self,
                req: &mut Request<RequestBody>,
                start: &Bytes,
                whole: bool,
                exchange: &Exchange<'_>,
                state: &mut FilterState,
                ordinal: usize,
            ) -> Result<Flow, ProxyError> {
                match self {
                    $(Filter::$variant(f) => {
                        f.on_request_body(req, start, whole, exchange, state.$module.get_mut(ordinal)).await
                    })*
                }
            }

            fn waits_on_response(&self, state: &mut FilterState, ordinal: usize) -> bool {
                match self {
                    $(Filter::$variant(f) => f.waits_on_response(state.$module.get_mut(ordinal)),)*
                }
            }

            async fn on_response(
                &self,
                response: &mut Response<ResponseBody>,
                ctx: &ResponseCtx<'_>,
                state: &mut FilterState,
                ordinal: usize,
            ) {
                match self {
                    $(Filter::$variant(f) => {
                        f.on_response(response, ctx, state.$module.get_mut(ordinal)).await
                    })*
                }
            }

            fn on_response_headers(
                &self,
                head: &mut ResponseHead<'_>,
                ctx: &ResponseCtx<'_>,
                state: &mut FilterState,
                ordinal: usize,
            ) -> Option<BodyFilter> {
                match self {
                    $(Filter::$variant(f) => {
                        f.on_response_headers(head, ctx, state.$module.get_mut(ordinal))
                    })*
                }
            }
        }
    };
}

filters! {
    ExtAuthz(ext_authz::ExtAuthz),
    LocalRateLimit(local_rate_limit::LocalRateLimit),
    Buffer(buffer::Buffer),
    Headers(headers::Headers),
    HeaderMutation(header_mutation::HeaderMutation),
    Compression(compression::Compression),
    Cors(cors::Cors),
    Csrf(csrf::Csrf),
    GrpcWeb(grpc_web::GrpcWeb),
    Fault(fault::Fault),
    HealthCheck(health_check::HealthCheck),
    CustomResponse(custom_response::CustomResponse),
    Rbac(rbac::Rbac),
    JwtAuthn(jwt_authn::JwtAuthn),
    BasicAuth(basic_auth::BasicAuth),
    ApiKeyAuth(api_key_auth::ApiKeyAuth),
    GlobalRateLimit(global_rate_limit::GlobalRateLimit),
    ExtProc(ext_proc::ExtProc),
}

/// One filter's state per exchange, per type: the first two filters' inline (a chain with
/// two of a type costs no allocation); a further one's in a list made when first used.
#[derive(Default)]
struct Instances<T> {
    first: T,
    second: T,
    more: Vec<T>,
}

impl<T: Default> Instances<T> {
    /// The state of the type's filter at `ordinal` in the chain.
    fn get_mut(&mut self, ordinal: usize) -> &mut T {
        match ordinal {
            0 => &mut self.first,
            1 => &mut self.second,
            _ => {
                let i = ordinal - 2;
                if self.more.len() <= i {
                    self.more.resize_with(i + 1, T::default);
                }
                &mut self.more[i]
            }
        }
    }
}

/// A filter of a chain and its place among the chain's filters of its type (which tells
/// their shared parts and states apart).
struct Placed {
    filter: Filter,
    ordinal: usize,
}

/// A listener's filters on one worker, in order.
pub(crate) struct FilterChain {
    filters: Box<[Placed]>,
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
    /// The gRPC status a gRPC request gets, where not the one `status` maps to.
    pub(crate) grpc_status: Option<u32>,
}

impl LocalReply {
    pub(crate) fn new(status: StatusCode, body: Bytes) -> Self {
        Self {
            status,
            headers: HeaderMap::new(),
            body,
            flag: None,
            grpc_status: None,
        }
    }
}

/// What a request phase decided.
pub(crate) enum Flow {
    Continue,
    /// Continue, after matching the route again: the filter changed what routing reads
    /// (Envoy's `clearRouteCache`). The filters after it and the route's action follow the
    /// new match.
    ClearRoute,
    /// Answer with this; the route is not taken. Boxed: the rare case.
    Respond(Box<LocalReply>),
}

/// What one filter's request-headers phase decided.
pub(crate) enum HeadersFlow {
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
    /// The cluster drawn from the route's `weighted_clusters` (its place in the list).
    pub(crate) weighted_cluster: Option<usize>,
    /// The request's trace, when the listener traces: calls a filter makes join it.
    pub(crate) trace: Option<&'a RequestTrace>,
}

impl Exchange<'_> {
    /// The host the client asked for, as text (empty when none). Read only by the filters
    /// that need it.
    pub(crate) fn host_text(&self) -> &str {
        self.host.and_then(|h| h.to_str().ok()).unwrap_or("")
    }

    /// The URL the client asked for, without its query (a credential in a parameter is not
    /// echoed): the `realm` of an authentication challenge.
    pub(crate) fn realm(&self, uri: &http::Uri) -> String {
        let scheme = if self.conn.listener.tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}{}", self.host_text(), uri.path())
    }
}

/// The response head as the response phases see it: changed in place, not taken apart.
pub(crate) struct ResponseHead<'a> {
    pub(crate) status: StatusCode,
    pub(crate) headers: &'a mut HeaderMap,
    /// A filter gave the response a body of its own (`custom_response`): the filters after
    /// it leave the body alone.
    pub(crate) replaced: bool,
}

/// What a response phase needs besides the response.
pub(crate) struct ResponseInfo<'a> {
    /// The upstream host that answered, as text; `None` for local replies.
    pub(crate) upstream: Option<&'a HeaderValue>,
    /// The request was a HEAD: the response has no body to change.
    pub(crate) head_request: bool,
    /// The upstream accepted an upgrade: the response opens a tunnel and is not to be
    /// replaced.
    pub(crate) upgraded: bool,
    /// The request is a gRPC call: a filter's own answer takes gRPC's form.
    pub(crate) grpc_request: bool,
}

/// The exchange as a response phase sees it.
pub(crate) struct ResponseCtx<'a> {
    pub(crate) exchange: &'a Exchange<'a>,
    pub(crate) info: &'a ResponseInfo<'a>,
    /// The request's `x-request-id`, when a filter of the chain reads it.
    pub(crate) request_id: Option<&'a HeaderValue>,
}

impl FilterChain {
    /// The chain of `listener`'s `http_filters` for one worker.
    pub(crate) fn new(
        listener: &ListenerConfig,
        shared: &SharedFilters,
        (catalog, shard): (&Catalog, &stats::Shard),
        clusters: &[Rc<Cluster>],
    ) -> Self {
        let chain = &listener.http_filters;
        let filters = (chain.iter().enumerate())
            .map(|(i, ChainFilter { name, config })| {
                let ctx = BuildCtx {
                    listener,
                    table: &listener.route_config,
                    filter: name,
                    catalog,
                    shard,
                    clusters,
                };
                let kind = config.name();
                let ordinal = chain[..i]
                    .iter()
                    .filter(|f| f.config.name() == kind)
                    .count();
                Placed {
                    filter: Filter::new(config, shared, ordinal, &ctx),
                    ordinal,
                }
            })
            .collect::<Box<[Placed]>>();
        let uses_request_id = filters.iter().any(|p| p.filter.uses_request_id());
        Self {
            filters,
            uses_request_id,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.filters.is_empty()
    }

    /// The request phases: headers in chain order, and the body for the filters that ask.
    /// Stops at the first filter that answers, and after one that clears the route: the
    /// caller matches it again and calls this once more, which goes on with the next filter.
    pub(crate) async fn on_request(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut FilterState,
    ) -> Result<Flow, ProxyError> {
        let from = state.entered;
        for Placed { filter, ordinal } in self.filters[from..].iter() {
            let ordinal = *ordinal;
            let flow = match filter
                .on_request_headers(req, exchange, state, ordinal)
                .await?
            {
                HeadersFlow::Flow(flow) => flow,
                HeadersFlow::ReadBody(max) => {
                    let (start, whole) = req
                        .body_mut()
                        .read_ahead(max)
                        .await
                        .map_err(|source| ProxyError::ClientAborted { source })?;
                    filter
                        .on_request_body(req, &start, whole, exchange, state, ordinal)
                        .await?
                }
            };
            match flow {
                Flow::Continue => state.entered += 1,
                Flow::ClearRoute => {
                    state.entered += 1;
                    return Ok(Flow::ClearRoute);
                }
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

    /// The response phases, in reverse order over the filters the request passed: each
    /// filter's response-headers phase, or its whole response phase where it waits on
    /// something (an external processor). A filter that wants to change the body returns the
    /// body filter for it.
    pub(crate) async fn on_response(
        &self,
        response: &mut Response<ResponseBody>,
        exchange: &Exchange<'_>,
        info: &ResponseInfo<'_>,
        state: &mut FilterState,
    ) -> Option<BodyFilter> {
        let request_id = state.request_id.take();
        let ctx = ResponseCtx {
            exchange,
            info,
            request_id: request_id.as_ref(),
        };
        let mut body = None;
        let mut replaced = false;
        for Placed { filter, ordinal } in self.filters[..state.entered].iter().rev() {
            if filter.waits_on_response(state, *ordinal) {
                // It sees the body as the filters after it left it.
                if let Some(filter) = body.take() {
                    response.body_mut().filter(filter);
                }
                filter.on_response(response, &ctx, state, *ordinal).await;
                continue;
            }
            let head = &mut ResponseHead {
                status: response.status(),
                headers: response.headers_mut(),
                replaced,
            };
            if let Some(filter) = filter.on_response_headers(head, &ctx, state, *ordinal) {
                body = Some(filter);
            }
            // A filter may have given the response another status (custom_response).
            let (status, now_replaced) = (head.status, head.replaced);
            replaced = now_replaced;
            *response.status_mut() = status;
        }
        state.request_id = request_id;
        body
    }
}

#[cfg(any(test, feature = "bench"))]
pub(crate) mod testing;
#[cfg(test)]
mod tests;
