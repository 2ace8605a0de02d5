//! External authorization (Envoy's `ext_authz` filter): before a request is routed on, the
//! listener's authorization service decides whether it goes, with which header changes, or
//! what the client gets instead. One client per worker and listener, so one connection to
//! the service per worker. With `with_request_body`, the check waits for the body's start
//! (the request-body phase) and sends it along.

use authz_client::{
    AuthzClient, AuthzError, CheckInput, CheckRetry, Decision, HttpOptions, TryFailure,
};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, StatusCode};
use tokio::time::Instant;

use super::{
    BodyFilter, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, ResponseCtx,
    ResponseHead,
};
use crate::catalog::AuthzStats;
use crate::context::request_id::X_REQUEST_ID;
use crate::context::{ConnCtx, RequestBody};
use crate::trace::TRACESTATE;
use crate::error::{ProxyError, ResponseFlag};
use crate::throttle::LogThrottle;
use config::{AuthzService, ExtAuthzConfig, RouteAuthz, RouteConfiguration};

static X_LEGATE_AUTH_FAILURE_MODE_ALLOWED: HeaderName =
    HeaderName::from_static("x-legate-auth-failure-mode-allowed");

/// A worker's authorization client for one listener. Boxed: its client state is large, and
/// the chain's other filters are a few words.
pub(crate) struct ExtAuthz(Box<Inner>);

struct Inner {
    client: AuthzClient,
    config: ExtAuthzConfig,
    /// Per route, in the route table's order.
    routes: Vec<RouteAuthz>,
    /// Per virtual host, for requests it took that no route matched.
    hosts: Vec<RouteAuthz>,
    /// Per route, its metadata in the namespaces the checks send, encoded once (gRPC).
    route_metadata: Vec<Option<Box<[u8]>>>,
    /// gRPC: the request headers sent; `None`: all.
    allowed_headers: Option<Vec<String>>,
    stats: AuthzStats,
    /// Failed checks, logged at most once a second: a dead service must not flood the log
    /// with a line per request.
    errors: LogThrottle,
}

/// For requests that matched no virtual host: checked, without context extensions.
static NO_ROUTE: RouteAuthz = RouteAuthz {
    disabled: false,
    context_extensions: Vec::new(),
};

/// An allow's headers for the response, kept from the request phase.
pub(crate) type State = Option<Box<authz_client::Allowed>>;

impl HttpFilter for ExtAuthz {
    type Config = ExtAuthzConfig;
    /// TLS to the service, its files read once per generation rather than by each worker.
    type Shared = authz_client::Tls;
    type State = State;

    fn shared(
        config: &ExtAuthzConfig,
        _: &config::ListenerConfig,
        _: &str,
    ) -> Option<authz_client::Tls> {
        match &config.service {
            AuthzService::Grpc {
                tls: Some(spec),
                endpoint,
                ..
            }
            | AuthzService::Http {
                tls: Some(spec),
                endpoint,
                ..
            } => Some(crate::tls::grpc_service_tls(spec, endpoint, "ext_authz")),
            _ => None,
        }
    }

    fn new(
        config: &ExtAuthzConfig,
        tls: Option<&authz_client::Tls>,
        ctx: &BuildCtx<'_>,
    ) -> Self {
        let stats = ctx.catalog.authz(ctx.shard, &ctx.listener.name);
        ExtAuthz(Box::new(Inner::new(config, tls, ctx.table, ctx.filter, stats)))
    }

    /// It sends the request id to the service.
    fn uses_request_id(&self) -> bool {
        true
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut State,
    ) -> Result<HeadersFlow, ProxyError> {
        let authz = &*self.0;
        if authz.route(exchange).disabled {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        if let Some(limits) = authz.config.with_request_body {
            return Ok(HeadersFlow::ReadBody(limits.max_request_bytes as usize));
        }
        // Boxed: the check's future is large, and only this filter needs it.
        Box::pin(authz.check(req, None, exchange, state))
            .await
            .map(HeadersFlow::Flow)
    }

    async fn on_request_body(
        &self,
        req: &mut Request<RequestBody>,
        start: &Bytes,
        whole: bool,
        exchange: &Exchange<'_>,
        state: &mut State,
    ) -> Result<Flow, ProxyError> {
        let authz = &*self.0;
        let partial_allowed = authz
            .config
            .with_request_body
            .is_some_and(|limits| limits.allow_partial_message);
        if !whole && !partial_allowed {
            let mut reply = LocalReply::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Bytes::from_static(b"request body too large for authorization\n"),
            );
            reply.flag = Some(ResponseFlag::UnauthorizedExternalService);
            return Ok(Flow::Respond(Box::new(reply)));
        }
        Box::pin(authz.check(req, Some(start), exchange, state)).await
    }

    /// The headers an allow asked to add.
    fn on_response_headers(
        &self,
        head: &mut ResponseHead<'_>,
        _: &ResponseCtx<'_>,
        state: &mut State,
    ) -> Option<BodyFilter> {
        if let Some(allowed) = state.take() {
            allowed.apply_to_response(head.headers);
        }
        None
    }
}

/// A service's retry policy, read with the conditions of a route's.
#[derive(Debug)]
struct Retry(config::AuthzRetry, PerTry);

/// Whether each try has its own limit: Envoy's gRPC client bounds each by the back-off's
/// `max_interval` (its conversion of the service's retry policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PerTry {
    BackOffMax,
    Unbounded,
}

impl CheckRetry for Retry {
    fn max_retries(&self) -> u32 {
        self.0.num_retries
    }

    fn retry_answer(&self, status: StatusCode, headers: &http::HeaderMap) -> bool {
        crate::cluster::answer_retriable(self.0.retry_on, status, headers)
    }

    fn retry_failure(&self, failure: TryFailure) -> bool {
        match failure {
            TryFailure::Connect => crate::cluster::connect_failure_retriable(self.0.retry_on),
            // The check may have reached the service.
            TryFailure::Reset => crate::cluster::reset_retriable(self.0.retry_on, false),
            // It did not: safe to try again, as a route's refused stream.
            TryFailure::RefusedStream => {
                self.0.retry_on.refused_stream
                    || crate::cluster::reset_retriable(self.0.retry_on, true)
            }
        }
    }

    fn back_off(&self, n: u32) -> std::time::Duration {
        self.0.back_off.ceiling(n)
    }

    fn per_try_timeout(&self) -> Option<std::time::Duration> {
        (self.1 == PerTry::BackOffMax).then_some(self.0.back_off.max_interval)
    }
}


/// A route's metadata in `namespaces`, as the `config.core.v3.Metadata` a check carries;
/// `None` where it has none of them.
fn route_metadata(route: &config::RouteConfig, namespaces: &[String]) -> Option<Box<[u8]>> {
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use prost::Message;
    let metadata = route.metadata.as_deref()?;
    let filter_metadata: std::collections::HashMap<_, _> = (namespaces.iter())
        .filter_map(|ns| Some((ns.clone(), proto_struct(metadata.get(ns)?))))
        .collect();
    if filter_metadata.is_empty() {
        return None;
    }
    let message = Metadata {
        filter_metadata,
        ..Default::default()
    };
    Some(message.encode_to_vec().into_boxed_slice())
}

/// A JSON object as a protobuf `Struct`.
fn proto_struct(
    fields: &serde_json::Map<String, serde_json::Value>,
) -> envoy_types::pb::google::protobuf::Struct {
    use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
    fn value(v: &serde_json::Value) -> Value {
        let kind = match v {
            serde_json::Value::Null => Kind::NullValue(0),
            serde_json::Value::Bool(b) => Kind::BoolValue(*b),
            serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
            serde_json::Value::String(s) => Kind::StringValue(s.clone()),
            serde_json::Value::Array(list) => Kind::ListValue(ListValue {
                values: list.iter().map(value).collect(),
            }),
            serde_json::Value::Object(o) => Kind::StructValue(proto_struct(o)),
        };
        Value { kind: Some(kind) }
    }
    Struct {
        fields: fields.iter().map(|(k, v)| (k.clone(), value(v))).collect(),
    }
}

impl Inner {
    /// A route's settings already include its virtual host's (merged when the config was
    /// loaded).
    /// `tls`: the listener's, for a service spoken to over TLS.
    fn new(
        config: &ExtAuthzConfig,
        tls: Option<&authz_client::Tls>,
        table: &RouteConfiguration,
        filter: &str,
        stats: AuthzStats,
    ) -> Self {
        let client = match &config.service {
            AuthzService::Grpc {
                endpoint,
                authority,
                tls,
                retry_policy,
                ..
            } => {
                let client = AuthzClient::grpc(endpoint.clone(), config.timeout);
                let client = match retry_policy {
                    Some(policy) => {
                        client.with_retry(std::sync::Arc::new(Retry(*policy, PerTry::BackOffMax)))
                    }
                    None => client,
                };
                // Over TLS, the name the service is verified by is the one it is called by,
                // unless another is given.
                let authority = authority
                    .as_deref()
                    .or_else(|| tls.as_ref().and_then(|t| t.server_name.as_deref()));
                match authority {
                    Some(authority) => client.with_authority(authority),
                    None => client,
                }
            }
            AuthzService::Http {
                endpoint,
                path_prefix,
                path_override,
                retry_policy,
                allowed_headers,
                allowed_upstream_headers,
                header_lists,
                ..
            } => AuthzClient::http(
                endpoint.clone(),
                config.timeout,
                HttpOptions {
                    path_prefix: path_prefix.clone(),
                    path_override: path_override.clone(),
                    retry: retry_policy.map(|policy| {
                        std::sync::Arc::new(Retry(policy, PerTry::Unbounded))
                            as std::sync::Arc<dyn CheckRetry>
                    }),
                    allowed_headers: allowed_headers.clone(),
                    allowed_upstream_headers: allowed_upstream_headers.clone(),
                    allowed_upstream_headers_to_append: (header_lists
                        .allowed_upstream_headers_to_append)
                        .clone(),
                    allowed_client_headers_on_success: (header_lists
                        .allowed_client_headers_on_success)
                        .clone(),
                    allowed_client_headers: header_lists.allowed_client_headers.clone(),
                    headers_to_add: header_lists.headers_to_add.clone(),
                },
            ),
        };
        let client = match tls {
            None => client,
            Some(tls) => client.with_tls(tls.clone()),
        };
        Self {
            client,
            config: config.clone(),
            routes: (table.routes.iter())
                .map(|r| r.filters.of_filter(filter).ext_authz.clone())
                .collect(),
            hosts: (table.virtual_hosts.iter())
                .map(|h| h.filters.of_filter(filter).ext_authz.clone())
                .collect(),
            // Nothing to keep (no lookups) where the checks send no metadata.
            route_metadata: (table.routes.iter())
                .filter(|_| !config.route_metadata_context_namespaces.is_empty())
                .map(|r| route_metadata(r, &config.route_metadata_context_namespaces))
                .collect(),
            allowed_headers: match &config.service {
                AuthzService::Grpc {
                    allowed_headers, ..
                } => allowed_headers.clone(),
                AuthzService::Http { .. } => None,
            },
            stats,
            errors: LogThrottle::default(),
        }
    }

    /// The check's span name, as Envoy's: the gRPC method, or the service's cluster.
    fn span_name(&self) -> &'static str {
        match self.config.service {
            AuthzService::Grpc { .. } => "async envoy.service.auth.v3.Authorization.Check egress",
            AuthzService::Http { .. } => "async ext_authz egress",
        }
    }

    /// The route's settings; its virtual host's where no route matched (a host that turns
    /// the check off is not checked for its 404s).
    fn route(&self, exchange: &Exchange<'_>) -> &RouteAuthz {
        match (exchange.route, exchange.virtual_host) {
            (Some(i), _) => self.routes.get(i),
            (None, Some(h)) => self.hosts.get(h),
            (None, None) => None,
        }
        .unwrap_or(&NO_ROUTE)
    }

    /// Asks the service about `req`, applying an allow's request header changes to it.
    async fn check(
        &self,
        req: &mut Request<RequestBody>,
        body: Option<&Bytes>,
        exchange: &Exchange<'_>,
        state: &mut State,
    ) -> Result<Flow, ProxyError> {
        let conn = exchange.conn;
        let request_id = req.headers().get(&X_REQUEST_ID).cloned();
        // The check is a span of its own when the request is sampled; otherwise the service
        // sees the proxy hop as its caller.
        let mut span = exchange
            .trace
            .and_then(|trace| trace.child(self.span_name()));
        let traceparent = match (&span, exchange.trace) {
            (Some(span), _) => Some(span.traceparent()),
            (None, Some(trace)) => Some(trace.traceparent()),
            (None, None) => None,
        };
        let input = CheckInput {
            method: req.method(),
            path: req.uri().path_and_query().map_or("/", |p| p.as_str()),
            host: exchange.host_text(),
            scheme: if conn.listener.tls { "https" } else { "http" },
            version: req.version(),
            headers: req.headers(),
            request_id: request_id
                .as_ref()
                .map_or("", |id| id.to_str().unwrap_or("")),
            source: exchange.client.addr(conn),
            destination: conn.local,
            context_extensions: &self.route(exchange).context_extensions,
            allowed_headers: self.allowed_headers.as_deref(),
            route_metadata: exchange
                .route
                .and_then(|i| self.route_metadata.get(i))
                .and_then(Option::as_deref),
            body,
            traceparent: traceparent.as_ref(),
            tracestate: exchange
                .trace
                .filter(|trace| trace.continued())
                .and(req.headers().get(&TRACESTATE)),
        };
        let started = Instant::now();
        let decision = self.client.check(&input).await;
        self.stats.time.record_duration(started.elapsed());
        if let Some(span) = &mut span {
            // Envoy's tags for the check's outcome.
            match &decision {
                Ok(Decision::Allow(_)) => {
                    span.done();
                    span.set("ext_authz_status", "ext_authz_ok");
                }
                Ok(Decision::Deny(denied)) => {
                    span.done();
                    span.set("ext_authz_status", "ext_authz_unauthorized");
                    span.set("ext_authz_http_status", i64::from(denied.status.as_u16()));
                }
                Err(error) => span.fail(error.to_string()),
            }
        }
        drop(span);
        match decision {
            Ok(Decision::Allow(allowed)) => {
                self.stats.ok.inc();
                allowed.apply_to_request(req.headers_mut());
                // Envoy's condition: any change to the request's headers.
                let rerouted = self.config.clear_route_cache
                    && !(allowed.upstream_headers.is_empty()
                        && allowed.headers_to_remove.is_empty());
                if !allowed.response_headers.is_empty() {
                    *state = Some(Box::new(allowed));
                }
                Ok(if rerouted {
                    Flow::ClearRoute
                } else {
                    Flow::Continue
                })
            }
            Ok(Decision::Deny(denied)) => {
                self.stats.denied.inc();
                let mut reply = LocalReply::new(denied.status, denied.body);
                for header in &denied.headers {
                    header.apply(&mut reply.headers);
                }
                reply.flag = Some(ResponseFlag::UnauthorizedExternalService);
                Ok(Flow::Respond(Box::new(reply)))
            }
            Err(error) => {
                self.stats.error.inc();
                if error.is_timeout() {
                    self.stats.timeout.inc();
                }
                self.log_error(&error, conn);
                if self.config.failure_mode_allow {
                    self.stats.failure_mode_allowed.inc();
                    req.headers_mut().insert(
                        X_LEGATE_AUTH_FAILURE_MODE_ALLOWED.clone(),
                        HeaderValue::from_static("true"),
                    );
                    return Ok(Flow::Continue);
                }
                let mut reply = LocalReply::new(self.config.status_on_error, Bytes::new());
                reply.flag = Some(ResponseFlag::UnauthorizedExternalService);
                Ok(Flow::Respond(Box::new(reply)))
            }
        }
    }

    /// One warning a second at most, with the count since the last.
    fn log_error(&self, error: &AuthzError, conn: &ConnCtx) {
        if let Some(failed) = self.errors.hit() {
            tracing::warn!(
                listener = %conn.listener.name,
                failed,
                failure_mode_allow = self.config.failure_mode_allow,
                %error,
                "authorization check failed"
            );
        }
    }
}
