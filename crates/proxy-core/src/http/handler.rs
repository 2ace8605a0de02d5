//! The request path after the codec: route, the filters' request phases, then a direct
//! response or a relayed one, and the filters' response phases on whatever the answer is.

use std::convert::Infallible;
use std::rc::Rc;

use bytes::Bytes;
use http::header::{CONNECTION, HeaderValue, UPGRADE};
use http::{Method, Request, Response, Version};

use super::forwarding::X_LEGATE_OVERLOADED;
use super::{
    HttpCtx, ResponseBody, head, internal_redirect, local_reply, mirror, redirect, rewrite, upgrade,
};
use crate::cluster::Admitted;
use crate::cluster::{CountAttempts, CountAttemptsInResponse, X_ENVOY_ATTEMPT_COUNT};
use crate::context::request_id::{X_REQUEST_ID, new_request_id};
use crate::context::{Client, ConnCtx, InFlight, RequestBody, Tunnel, TunnelIo};
use crate::error::{ProxyError, ResponseFlag};
use crate::filters::{Exchange, FilterState, Flow, ResponseInfo};
use crate::router::Matched;
use crate::trace::{RequestTrace, TRACEPARENT, TRACESTATE, text_of};
use config::{
    ClusterTarget, ConnectMode, ForwardAction, HeadersWithUnderscores, PathMatch, RouteAction,
};
use hyper_util::rt::TokioIo;

/// Serves one request. Never fails: every error becomes a local reply with its status, and a
/// log line with its response flag.
///
/// A plain function returning an `async move` block, not an `async fn`: an `async fn` keeps
/// each argument twice in its future (as the argument and as the local it is moved into), and
/// the request is 296 bytes.
#[allow(clippy::manual_async_fn)]
pub(crate) fn handle(
    mut req: Request<RequestBody>,
    conn: Rc<ConnCtx>,
    http: Rc<HttpCtx>,
    mut in_flight: InFlight,
) -> impl Future<Output = Result<Response<ResponseBody>, Infallible>> {
    async move {
        let method = req.method().clone();
        let uri = req.uri().clone();
        let version = req.version();
        let mut close = conn.worker.draining.get();
        let overload = &conn.worker.overload;
        if !conn.listener.bypass_overload && overload.keepalive_disabled() {
            // Clients reconnect, and the balancer in front spreads them over other proxies.
            // Counted once per connection told so.
            let told = if version <= Version::HTTP_11 {
                !std::mem::replace(&mut close, true)
            } else {
                let first = !conn.retiring.replace(true);
                if first {
                    conn.retire.notify_one(); // GOAWAY
                }
                first
            };
            if told {
                conn.worker.stats.overload_keepalive_disabled().inc();
            }
        }
        if version <= Version::HTTP_11
            && let Some(max) = conn.listener.max_requests_per_connection
            && conn.requests.get() >= max
        {
            // The last request this connection takes: say so, so the client reconnects.
            close = true;
            conn.listener.stats.cx_max_requests.inc();
        }
        if version <= Version::HTTP_11 && !close && conn.expired() {
            close = true;
            conn.listener.stats.cx_max_duration.inc();
        }
        if let Some(early) = &http.early_header_mutation {
            // Before anything reads the headers (the client's address, the trace), as Envoy's
            // early mutations: the peer stands for the client in their values.
            let exchange = Exchange {
                conn: &conn,
                client: &Client::peer(),
                host: None,
                virtual_host: None,
                route: None,
                weighted_cluster: None,
                trace: None,
            };
            early.apply_to_request(req.headers_mut(), &exchange);
        }
        let (client, unknown) = match Client::of(&conn, req.headers()) {
            Ok(client) => (client, None),
            Err(status) => (Client::peer(), Some(status)),
        };
        if client.append_peer {
            super::forwarding::append_forwarded_for(req.headers_mut(), &conn.peer_ip);
        }
        super::client_cert::apply(
            req.headers_mut(),
            http.forward_client_cert,
            http.client_cert_details,
            conn.client_cert.as_deref(),
        );
        if let Some(log) = in_flight.log() {
            log.peer = Some(client.addr(&conn));
        }
        if let Some(tracer) = &http.tracer {
            in_flight.set_trace(tracer.start(
                &req,
                client.ip(&conn),
                &http.trace_policy,
                conn.listener.tls,
            ));
        }
        let mut state = FilterState::default();
        let mut facts = Facts::default();
        // A request without a body (most) is whole already: nothing to time.
        let begun = http
            .request_timeout
            .and_then(|timeout| req.body_mut().end_by(tokio::time::Instant::now() + timeout));
        let routed = if !conn.listener.bypass_overload && overload.shedding_requests() {
            conn.worker.stats.overload_rq_shed().inc();
            Err(ProxyError::Overloaded)
        } else if let Some(status) = unknown {
            Err(ProxyError::ClientUnknown(status))
        } else if let Err(too_early) = super::early_data::admit(&mut req, &conn) {
            Err(too_early)
        } else {
            let scope = Scope {
                conn: &conn,
                client: &client,
                http: &http,
            };
            let mut routed =
                route_and_forward(&mut req, &scope, &mut in_flight, &mut state, &mut facts).await;
            // An internal redirect followed: its answer is dropped and the request goes on
            // as a new one, through the routes and the filters again (fresh filter state), as
            // Envoy recreates the stream. Bounded by the routes' most redirects.
            while let Some(next) = facts.internal_redirects.next.take() {
                // Its answer is dropped with the facts below.
                req = *next;
                state = FilterState::default();
                facts = Facts {
                    internal_redirects: std::mem::take(&mut facts.internal_redirects),
                    ..Facts::default()
                };
                if let Some(log) = in_flight.log() {
                    log.upstream = None;
                }
                routed =
                    route_and_forward(&mut req, &scope, &mut in_flight, &mut state, &mut facts)
                        .await;
            }
            routed
        };
        if let Some(begun) = &begun {
            begun.set();
        }
        let mut flag = facts.flag;
        let mut response = match routed.map(|Answered| facts.response.take()) {
            Ok(Some(response)) => response,
            // An `Answered` is made only with the response stored.
            Ok(None) => unreachable!("a request answered without its response stored"),
            Err(err) => {
                // An HTTP/2 upstream's stream reset keeps no cause: the deadline tells.
                let err = match err {
                    ProxyError::ClientAborted { .. }
                        if begun.as_ref().is_some_and(|b| b.timed_out()) =>
                    {
                        ProxyError::ClientAborted {
                            source: Box::new(crate::error::RequestTimedOut),
                        }
                    }
                    err => err,
                };
                flag = err.flag();
                facts.grpc_status = err.grpc_status();
                if let Some(log) = in_flight.log() {
                    log.flag = err.flag();
                }
                // After a malformed request the stream may hold anything; do not read on.
                close |= matches!(
                    err,
                    ProxyError::BadRequest(_)
                        | ProxyError::HeadersTooLarge { .. }
                        | ProxyError::Http10Refused
                );
                let mut reply = local_reply::text(
                    err.status(),
                    Bytes::from_static(err.client_body().as_bytes()),
                );
                if matches!(err, ProxyError::Overflow(_) | ProxyError::Overloaded)
                    && !http.suppress_proxy_headers
                {
                    // Tells a client (or the next proxy) that this was load shedding, not a
                    // failed upstream: worth backing off, not worth marking the host down. (The
                    // pool logs refusals, at most a line a second.)
                    reply.headers_mut().insert(
                        X_LEGATE_OVERLOADED.clone(),
                        HeaderValue::from_static("true"),
                    );
                } else if !matches!(
                    err,
                    // Each asks the client to come back; none is a fault to look into.
                    ProxyError::Overflow(_) | ProxyError::Overloaded | ProxyError::TooEarly
                ) {
                    tracing::warn!(
                        flag = %err.flag().map_or("-", |f| f.as_str()),
                        status = err.status().as_u16(),
                        listener = %conn.listener.name,
                        %method,
                        path = uri.path(),
                        error = %err,
                        "local reply"
                    );
                }
                reply
            }
        };
        let exchange = Exchange {
            conn: &conn,
            client: &client,
            host: facts.host.as_ref(),
            virtual_host: facts.matched.virtual_host,
            route: facts.matched.route,
            weighted_cluster: facts.matched.weighted,
            trace: in_flight.trace(),
        };
        // A tunnel's answer is the upstream's, whatever its body.
        if let Some(replies) = &http.local_replies
            && response.body().is_local()
            && facts.tunnel.is_none()
        {
            let reply = local_reply::ReplyFacts {
                method: &method,
                uri: &uri,
                headers: facts.kept_headers.as_deref().unwrap_or(req.headers()),
                status: response.status(),
                flag,
                duration: in_flight.started().elapsed(),
                tls: conn.listener.tls,
            };
            replies.rewrite(&mut response, &reply, &exchange);
        }
        let grpc_request =
            (facts.grpc_request).unwrap_or_else(|| crate::context::grpc::is_grpc(req.headers()));
        if response.body().is_local() && facts.tunnel.is_none() && grpc_request {
            local_reply::to_grpc(&mut response, facts.grpc_status, method == Method::HEAD);
        }
        // Before the filters' response phase, which may read the body ahead (an external
        // processor's): the stream's end bounds that too.
        if let Some(at) = facts.stream_deadline
            && facts.tunnel.is_none()
        {
            response.body_mut().end_by(at);
        }
        if !http.filters.is_empty() {
            let info = ResponseInfo {
                upstream: facts.upstream.as_ref(),
                head_request: method == Method::HEAD,
                upgraded: facts.tunnel.is_some(),
                grpc_request,
            };
            if let Some(filter) = http
                .filters
                .on_response(&mut response, &exchange, &info, &mut state)
                .await
            {
                response.body_mut().filter(filter);
            }
        }
        http.server_header.apply(response.headers_mut());
        if let Some(alt_svc) = &http.alt_svc
            && version < Version::HTTP_3
            && !response.headers().contains_key(http::header::ALT_SVC)
        {
            // Where the client can reach the listener's HTTP/3 (an upstream's own would
            // name its own ports): unless a header rule of the route set one.
            response
                .headers_mut()
                .insert(http::header::ALT_SVC, alt_svc.clone());
        }
        if let Some(operation) = facts.decorated.take() {
            response
                .headers_mut()
                .insert(X_ENVOY_DECORATOR_OPERATION.clone(), operation);
        }
        if let Some(cookie) = facts.set_cookie.take()
            && facts.upstream.is_some()
        {
            response
                .headers_mut()
                .append(http::header::SET_COOKIE, cookie);
        }
        if let Some(id) = facts.request_id.take() {
            response.headers_mut().insert(X_REQUEST_ID.clone(), id);
        }
        if close && version <= Version::HTTP_11 && facts.tunnel.is_none() {
            // hyper closes the connection after a response that says so; while draining, saying
            // it lets the client reconnect elsewhere instead of finding the connection gone.
            response
                .headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(trace) = in_flight.sampled_trace() {
            trace.answered(response.status(), flag);
        }
        in_flight.answered_with(response.headers());
        in_flight.set_status(response.status());
        match facts.tunnel {
            None => response.body_mut().hold(in_flight),
            // HTTP/1.1: the connection picks the tunnel up once the codec has written the 101.
            Some((upstream, None)) => {
                in_flight.outlive_exchange();
                *conn.tunnel.borrow_mut() = Some(Box::new(Tunnel {
                    upstream,
                    in_flight,
                }));
            }
            // HTTP/2: the stream becomes the tunnel once the 200 has gone.
            Some((upstream, Some(client_stream))) => {
                in_flight.outlive_exchange();
                tokio::task::spawn_local(upgrade::relay_h2_stream(
                    client_stream,
                    Tunnel {
                        upstream,
                        in_flight,
                    },
                    Rc::clone(&conn),
                    http.upgrade_idle_timeout,
                    http.upgrade_buffer,
                ));
            }
        }
        Ok(response)
    }
}

/// What every stage of one request reads.
#[derive(Clone, Copy)]
struct Scope<'a> {
    conn: &'a Rc<ConnCtx>,
    client: &'a Client,
    /// The listener's routes, filters and clusters, as of the request's start.
    http: &'a HttpCtx,
}

/// What the request phases learned, for the response phases (which run whatever the outcome).
#[derive(Default)]
struct Facts {
    host: Option<HeaderValue>,
    matched: Matched,
    /// The upstream host that answered, as text.
    upstream: Option<HeaderValue>,
    /// When the request's `max_stream_duration` runs out, for its response body.
    stream_deadline: Option<tokio::time::Instant>,
    /// Why a filter answered in the upstream's place.
    flag: Option<ResponseFlag>,
    /// An upgrade the upstream accepted, and for an HTTP/2 stream the client side to await.
    tunnel: Option<(Box<dyn TunnelIo>, Option<upgrade::ClientStream>)>,
    /// The request's `x-request-id`, when the response is to carry it.
    request_id: Option<HeaderValue>,
    /// A hash policy's cookie made for the client, for the upstream's answer.
    set_cookie: Option<HeaderValue>,
    /// The request headers local reply mappers read, kept before the request went upstream.
    /// Boxed: most listeners have no mappers, and every request's future holds this.
    kept_headers: Option<Box<http::HeaderMap>>,
    /// The route decorator's operation, for the client.
    decorated: Option<HeaderValue>,
    /// Whether the request was gRPC as it went upstream (its headers went with it).
    grpc_request: Option<bool>,
    /// The gRPC status a filter's answer gives a gRPC request.
    grpc_status: Option<u32>,
    /// The request's internal redirects: kept over its passes.
    internal_redirects: internal_redirect::Redirects,
    /// The answer, once there is one. Kept here, not returned level by level: each level's
    /// return would copy it (312 bytes) through its caller's stack and future.
    response: Option<Response<ResponseBody>>,
}

impl Facts {
    /// Stores the answer, for the handler to take at the end.
    fn answer(&mut self, response: Response<ResponseBody>) -> Answered {
        self.response = Some(response);
        Answered
    }
}

/// Says that a stage answered the request: its response is in [`Facts`] (made only by
/// [`Facts::answer`]).
struct Answered;

/// The route's timeout, or a gRPC request's own `grpc-timeout` where the route says so.
fn route_timeout(forward: &ForwardAction, headers: &http::HeaderMap) -> std::time::Duration {
    let Some(max) = forward.grpc_timeout_header_max else {
        return forward.timeout;
    };
    if !crate::context::grpc::is_grpc(headers) {
        return forward.timeout;
    }
    // No header: no deadline (a day, the longest wait here), as Envoy's "infinity".
    let asked = headers
        .get("grpc-timeout")
        .and_then(|v| grpc_timeout(v.as_bytes()))
        .unwrap_or(std::time::Duration::from_secs(24 * 3600));
    if max.is_zero() { asked } else { asked.min(max) }
}

/// gRPC's `grpc-timeout`: up to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
fn grpc_timeout(value: &[u8]) -> Option<std::time::Duration> {
    use std::time::Duration;
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(
        match unit {
            b'H' => Duration::from_secs(n * 3600),
            b'M' => Duration::from_secs(n * 60),
            b'S' => Duration::from_secs(n),
            b'm' => Duration::from_millis(n),
            b'u' => Duration::from_micros(n),
            b'n' => Duration::from_nanos(n),
            _ => return None,
        }
        .min(Duration::from_secs(24 * 3600)),
    )
}

/// `accept_http_10` (426 otherwise, as Envoy), and `default_host_for_http_10` for a request
/// that names no host.
fn http10(req: &mut Request<RequestBody>, http: &HttpCtx) -> Result<(), ProxyError> {
    if !http.accept_http_10 {
        return Err(ProxyError::Http10Refused);
    }
    if let Some(host) = &http.default_host_for_http_10
        && req.uri().authority().is_none()
    {
        req.headers_mut()
            .entry(http::header::HOST)
            .or_insert_with(|| host.clone());
    }
    Ok(())
}

/// `headers_with_underscores_action`: a request with a header named with `_` is refused, or
/// loses those headers, before anything reads them.
fn underscores(req: &mut Request<RequestBody>, scope: &Scope<'_>) -> Result<(), ProxyError> {
    let stats = &scope.conn.listener.stats;
    match head::drop_underscored_headers(
        req.headers_mut(),
        scope.http.headers_with_underscores == HeadersWithUnderscores::RejectRequest,
    ) {
        Err(err) => {
            stats.rq_rejected_underscores.inc();
            Err(err)
        }
        Ok(0) => Ok(()),
        Ok(dropped) => {
            stats.headers_dropped_underscores.add(dropped as u64);
            Ok(())
        }
    }
}

/// Takes the request by reference: a request moved into each level of the path would sit in
/// every level's future twice (as the parameter and as its local), and each future is copied
/// whole when it is started.
async fn route_and_forward(
    req: &mut Request<RequestBody>,
    scope: &Scope<'_>,
    in_flight: &mut InFlight,
    state: &mut FilterState,
    facts: &mut Facts,
) -> Result<Answered, ProxyError> {
    if req.version() == Version::HTTP_10 {
        http10(req, scope.http)?;
    }
    if !scope.http.ignore_http11_upgrade.is_empty() && req.version() == Version::HTTP_11 {
        upgrade::ignore_listed(req.headers_mut(), &scope.http.ignore_http11_upgrade);
    }
    if scope.http.headers_with_underscores != HeadersWithUnderscores::Allow {
        underscores(req, scope)?;
    }
    let ids = scope.http.request_id;
    // A redirect followed here keeps the id the request was given.
    if ids.replace_external && facts.internal_redirects.followed == 0 {
        // A client's id is not trusted: every request gets a new one.
        req.headers_mut().remove(&X_REQUEST_ID);
        ensure_request_id(req.headers_mut(), in_flight);
    } else if ids.in_response && ids.generate {
        ensure_request_id(req.headers_mut(), in_flight);
    }
    if ids.in_response {
        facts.request_id = req.headers().get(&X_REQUEST_ID).cloned();
    }
    let (host, matched) = match head::admit(
        req,
        scope.conn.listener.head_limit,
        &scope.http.path_normalization,
        host_rules(scope),
        &scope.http.routes,
    )? {
        head::Admitted::Routed { host, matched } => (host, matched),
        head::Admitted::Redirect(location) => {
            return Ok(facts.answer(local_reply::redirect(location)));
        }
    };
    let matched = pick_cluster(matched, req, scope);
    facts.matched = matched;
    if let Some(route) = matched.route
        && !scope.http.route_trace_policies.is_empty()
    {
        retrace(req, route, scope, in_flight);
    }
    if scope.http.tracer.is_some() {
        decorate(req, matched.route, scope, in_flight, facts);
    }
    // The request and its response must be done within this from the head, whatever the
    // filters and the upstream wait on.
    let Some(limit) = stream_limit(scope.http, matched.route) else {
        return filter_and_answer(req, host, matched, scope, in_flight, state, facts).await;
    };
    let at = in_flight.started() + limit;
    let ended = req.body_mut().watch_end();
    let answering = filter_and_answer(req, host, matched, scope, in_flight, state, facts);
    let Ok(answer) = tokio::time::timeout_at(at, answering).await else {
        in_flight.stream_duration_reached();
        return Err(ProxyError::StreamDuration {
            limit,
            request_complete: ended.get(),
        });
    };
    // The response body too must end by then.
    facts.stream_deadline = Some(at);
    answer
}

/// A route with tracing of its own decides the request's trace again by its policy (Envoy
/// decides once the route is known). Only the first match counts, as in Envoy.
fn retrace(req: &Request<RequestBody>, route: usize, scope: &Scope<'_>, in_flight: &mut InFlight) {
    let policies = &scope.http.route_trace_policies;
    let (Some(tracer), Ok(at)) = (
        &scope.http.tracer,
        policies.binary_search_by_key(&route, |(i, _)| *i),
    ) else {
        return;
    };
    let Some(mut old) = in_flight.take_trace() else {
        return;
    };
    let client = scope.client.ip(scope.conn);
    let tls = scope.conn.listener.tls;
    in_flight.set_trace(tracer.restart(&mut old, req, client, &policies[at].1, tls));
}

/// Envoy's decorators, on a traced listener: a client's `x-envoy-decorator-operation` names
/// the request span (and goes no further); else the route's decorator names it, and is told
/// to the client in the same header when it propagates.
fn decorate(
    req: &mut Request<RequestBody>,
    route: Option<usize>,
    scope: &Scope<'_>,
    in_flight: &mut InFlight,
    facts: &mut Facts,
) {
    let asked = req
        .headers_mut()
        .remove(&X_ENVOY_DECORATOR_OPERATION)
        .filter(|name| !name.is_empty());
    if let Some(name) = asked {
        if let Some(trace) = in_flight.sampled_trace() {
            trace.name_by_decorator(&name);
        }
        return;
    }
    let Some(decorator) = route.and_then(|i| scope.http.routes.route(i).decorator.as_deref())
    else {
        return;
    };
    if let Some(trace) = in_flight.sampled_trace() {
        trace.name_by_decorator(&decorator.header);
    }
    if decorator.propagate {
        facts.decorated = Some(decorator.header.clone());
    }
}

static X_ENVOY_DECORATOR_OPERATION: http::HeaderName =
    http::HeaderName::from_static("x-envoy-decorator-operation");

/// The listener's host rules, for the port the client connected to.
fn host_rules(scope: &Scope<'_>) -> head::HostRules {
    head::HostRules {
        local_port: scope.conn.local.port(),
        ..scope.http.host_rules
    }
}

/// The route's `max_stream_duration` over the listener's (`0s`: none for the route).
fn stream_limit(http: &HttpCtx, route: Option<usize>) -> Option<std::time::Duration> {
    let own = route.and_then(|i| match &http.routes.route(i).action {
        RouteAction::Forward(forward) => forward.max_stream_duration,
        _ => None,
    });
    match own {
        Some(limit) if limit.is_zero() => None,
        Some(limit) => Some(limit),
        None => http.max_stream_duration,
    }
}

/// The filters' request phase, then the route's action.
async fn filter_and_answer(
    req: &mut Request<RequestBody>,
    mut host: Option<HeaderValue>,
    mut matched: Matched,
    scope: &Scope<'_>,
    in_flight: &mut InFlight,
    state: &mut FilterState,
    facts: &mut Facts,
) -> Result<Answered, ProxyError> {
    let ids = scope.http.request_id;
    if !scope.http.filters.is_empty() {
        // Hop-by-hop headers go before a filter adds any.
        super::forwarding::strip_connection_listed(req.headers_mut(), false);
        if scope.http.filters.uses_request_id() && ids.generate {
            // Filters, the authorization service and the upstream all see the same request id.
            ensure_request_id(req.headers_mut(), in_flight);
        }
        loop {
            let exchange = Exchange {
                conn: scope.conn,
                client: scope.client,
                host: host.as_ref(),
                virtual_host: matched.virtual_host,
                route: matched.route,
                weighted_cluster: matched.weighted,
                trace: in_flight.trace(),
            };
            match scope.http.filters.on_request(req, &exchange, state).await? {
                Flow::Continue => break,
                Flow::ClearRoute => {
                    // The filters after it, the action and the log follow the new match.
                    let (again_host, again) =
                        head::route(req, host_rules(scope), &scope.http.routes)?;
                    host = again_host;
                    matched = pick_cluster(again, req, scope);
                    facts.matched = matched;
                }
                Flow::Respond(reply) => {
                    if let Some(log) = in_flight.log() {
                        log.flag = reply.flag;
                    }
                    facts.flag = reply.flag;
                    facts.grpc_status = reply.grpc_status;
                    facts.host = host;
                    return Ok(facts.answer(local_reply::from_filter(*reply)));
                }
            }
        }
        scope.http.filters.note_request_id(state, req.headers());
    }
    let route = scope
        .http
        .routes
        .route(matched.route.ok_or(ProxyError::NoRoute)?);
    // A 2xx would tell the client its tunnel is open (and a redirect has no path to keep).
    let answers_connect = match &route.action {
        RouteAction::Forward(_) => true,
        RouteAction::DirectResponse { status, .. } => !status.is_success(),
        RouteAction::Redirect(_) => false,
    };
    if req.method() == Method::CONNECT && !answers_connect {
        return Err(ProxyError::BadRequest("CONNECT needs a route to a cluster"));
    }
    let answered = match &route.action {
        RouteAction::DirectResponse { status, body } => {
            facts.answer(local_reply::text(*status, body.clone()))
        }
        RouteAction::Redirect(action) => facts.answer(redirect::respond(
            action,
            &route.matcher.path,
            host.as_ref(),
            req.uri(),
            scope
                .conn
                .listener
                .forwarded_trust
                .scheme(scope.conn.listener.tls, req.headers()),
        )?),
        RouteAction::Forward(forward) => {
            if let Some(replies) = &scope.http.local_replies {
                facts.kept_headers = replies.keep_headers(req.headers()).map(Box::new);
            }
            facts.grpc_request = Some(crate::context::grpc::is_grpc(req.headers()));
            // A tunnel's answer is not followed elsewhere.
            let policy = forward.internal_redirect.as_deref();
            let redirectable = policy
                .filter(|_| !upgrade::is_connect(req))
                .and_then(|policy| {
                    if ids.generate {
                        // The request sent on keeps the id the upstream saw.
                        ensure_request_id(req.headers_mut(), in_flight);
                    }
                    // As Envoy reads it: TLS, unless a trusted x-forwarded-proto says http.
                    let listener = &scope.conn.listener;
                    let https = listener.tls
                        && listener.forwarded_trust.scheme(true, req.headers()) == "https";
                    let kept = internal_redirect::keep(
                        policy,
                        req,
                        host.as_ref(),
                        https,
                        facts.internal_redirects.followed,
                    )?;
                    Some((policy, kept))
                });
            let answered = forward_request(
                req,
                host.clone(),
                (forward, matched.weighted, matched.named_cluster),
                &route.matcher.path,
                scope,
                in_flight,
                facts,
            )
            .await?;
            if let Some((policy, kept)) = redirectable
                && let Some(route) = matched.route
                && let Some(response) = &facts.response
            {
                let routing = internal_redirect::Routing {
                    routes: &scope.http.routes,
                    host_rules: host_rules(scope),
                    head_limit: scope.conn.listener.head_limit,
                    normalization: &scope.http.path_normalization,
                };
                let answer = (response.status(), response.headers());
                let redirects = &mut facts.internal_redirects;
                if let Some(next) =
                    internal_redirect::follow(policy, kept, answer, &routing, (route, redirects))
                {
                    // The request goes on as a new one (the handler sends it, dropping this
                    // answer).
                    redirects.followed += 1;
                    redirects.next = Some(Box::new(next));
                }
            }
            answered
        }
    };
    facts.host = host;
    Ok(answered)
}

/// Gives the request an `x-request-id` (logged) if the client sent none.
fn ensure_request_id(headers: &mut http::HeaderMap, in_flight: &mut InFlight) {
    // One lookup: the name is hashed once whether or not the client sent an id.
    let http::header::Entry::Vacant(slot) = headers.entry(&X_REQUEST_ID) else {
        return;
    };
    let id = new_request_id();
    if let Some(log) = in_flight.log() {
        log.request_id = Some(id.clone());
    }
    slot.insert(id);
}

/// An upgrade's or a CONNECT's answer on its way, boxed and behind `dyn`. Polling a
/// `Box<F>` of a concrete `F` inlines `F`'s poll into the caller's, and with it the room its
/// locals need: these two made most of `forward_request`'s poll function's stack frame
/// (16.8 KB), which every request's poll reserves and probes.
type RareAnswer<'a> =
    std::pin::Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, ProxyError>> + 'a>>;

#[allow(clippy::too_many_arguments)]
async fn forward_request(
    req: &mut Request<RequestBody>,
    host: Option<HeaderValue>,
    (forward, weighted, named_cluster): (&ForwardAction, Option<usize>, Option<usize>),
    matched_path: &PathMatch,
    scope: &Scope<'_>,
    in_flight: &mut InFlight,
    facts: &mut Facts,
) -> Result<Answered, ProxyError> {
    let Scope { conn, client, http } = *scope;
    if let Some(idle) = forward.idle_timeout
        && req.version() == http::Version::HTTP_2
    {
        crate::context::stream_idle::set_route_idle_timeout(idle);
    }
    let client = client.ip(conn);
    let cluster = match target_of(forward, weighted) {
        ClusterTarget::Index(i) => *i,
        ClusterTarget::Header(_) | ClusterTarget::Authority => named_cluster.ok_or(
            ProxyError::ClusterNotFound(forward.cluster_not_found_status),
        )?,
    };
    let cluster_ref = &http.clusters[cluster];
    let connect = upgrade::is_connect(req);
    let asked = match (connect, forward.connect) {
        (false, _) => upgrade::asked(req, &forward.upgrades),
        (true, None) => return Err(ProxyError::ConnectNotAllowed),
        (true, Some(ConnectMode::Forward)) => {
            Some(upgrade::Asked::Connect(upgrade::connect_stream(req)))
        }
        (true, Some(ConnectMode::Terminate)) => None,
    };
    if asked.is_none() && upgrade::is_extended_connect(req) {
        return Err(ProxyError::BadRequest("this route allows no such upgrade"));
    }
    // Upgrades are relayed over HTTP/1.1: a cluster named in the config is checked at load,
    // one a header names here.
    if asked.is_some() && cluster_ref.shared().protocol == config::UpstreamProtocol::Http2 {
        return Err(ProxyError::UpgradeFailed);
    }
    // Evaluated only for a cluster that picks by it, as Envoy: no cookie is made otherwise.
    // The cluster's own policy replaces the route's.
    let route_hash = match cluster_ref.hash_policy().or(forward.hash_policy.as_ref()) {
        Some(policy) if cluster_ref.hashes() => super::hash_policy::hash_request(
            policy,
            req,
            client,
            Some(super::hash_policy::Connection {
                peer: conn.peer,
                local: conn.local,
            }),
        ),
        _ => Default::default(),
    };
    if connect && forward.connect == Some(ConnectMode::Terminate) {
        // Boxed: only CONNECT requests carry this state. As a `dyn` future, so that its poll
        // stays a function of its own (see `RareAnswer`).
        let answer: RareAnswer<'_> = Box::pin(terminate_connect(
            req,
            (cluster_ref, route_hash.hash),
            client,
            in_flight,
            facts,
        ));
        let answer = answer.await;
        if facts.tunnel.is_none() {
            conn.listener.stats.upgrades_failed.inc();
        }
        return answer.map(|response| facts.answer(response));
    }
    let admitted = cluster_ref.admit(req.headers(), client, route_hash.hash)?;
    facts.set_cookie = route_hash.set_cookie;
    let upstream = Rc::clone(admitted.host());
    // The request for the upstream is rewritten where it is, in `req` (the sends below take it
    // from there, so that it is kept once, in the handler's future), in a block: a borrowed
    // local in scope at an await is kept in the future.
    {
        // From the request as it came: its header, or its path before any rewrite.
        let asked_rewrite = rewrite::host_from_request(forward, req);
        // A sampled request's span names may read the path as the client sent it.
        let mut original = None;
        // A CONNECT has no path to rewrite: its target is set below.
        if let Some(rewrite) = forward.path_rewrite.as_ref().filter(|_| !connect) {
            let target = redirect::rewrite_path(rewrite, matched_path, req.uri())?;
            if in_flight
                .trace()
                .is_some_and(RequestTrace::has_name_formats)
            {
                original = Some(req.uri().clone());
            }
            let mut uri = std::mem::take(req.uri_mut()).into_parts();
            uri.path_and_query = Some(target);
            *req.uri_mut() = http::Uri::from_parts(uri)
                .map_err(|_| ProxyError::BadRequest("the rewritten path is not a valid path"))?;
        }
        if http.request_id.generate {
            ensure_request_id(req.headers_mut(), in_flight);
        }
        if let Some(log) = in_flight.log() {
            log.upstream = Some(upstream.addr_text().clone());
        }
        if let Some(trace) = in_flight.trace() {
            // The proxy hop as the upstream's caller; a sampled request's tries put their own.
            req.headers_mut()
                .insert(TRACEPARENT.clone(), trace.traceparent());
            if !trace.continued() {
                // A new trace: the client's state belonged to no trace that goes on.
                req.headers_mut().remove(&TRACESTATE);
            }
        }
        if let Some(trace) = in_flight.sampled_trace() {
            trace.set(
                "upstream_cluster",
                http.clusters[cluster].shared().name.clone(),
            );
            if let Some(id) = req.headers().get(&X_REQUEST_ID) {
                trace.set("guid:x-request-id", text_of(id));
            }
        }
        // The drawn cluster's own host rewrite, over the route's (Envoy's order).
        let rewrite = match (&forward.split, weighted) {
            (Some(split), Some(drawn)) => split.clusters[drawn].host_rewrite.clone(),
            _ => None,
        }
        .or_else(|| forward.host_rewrite.clone())
        .or(asked_rewrite)
        .or_else(|| {
            forward
                .auto_host_rewrite
                .then(|| upstream.hostname().cloned())
                .flatten()
        });
        if forward.append_x_forwarded_host
            && rewrite.is_some()
            && let Some(original) = &host
        {
            append_forwarded_host(req.headers_mut(), original);
        }
        let authority = rewrite.or(host);
        // CONNECT's target is the authority (RFC 9112 section 3.2.3).
        let connect_target = authority.clone().filter(|_| connect);
        if !forward.mirrors.is_empty() && asked.is_none() {
            mirror::start(
                forward,
                (&http.clusters, http.routes.config()),
                req,
                authority.as_ref(),
                conn,
                client,
            );
        }
        rewrite::request_for_upstream(req, authority, &upstream, conn)?;
        if let Some(target) = connect_target {
            // Sent over HTTP/1.1 whatever the cluster's protocol says: target and host alike.
            *req.uri_mut() = http::Uri::try_from(target.as_bytes())
                .map_err(|_| ProxyError::BadRequest("invalid authority"))?;
            *req.version_mut() = Version::HTTP_11;
            req.headers_mut().insert(http::header::HOST, target);
        }
        if let Some(trace) = in_flight.sampled_trace() {
            trace.forwarded((&*req).into(), original.as_ref());
        }
    }
    if let Some(asked) = asked {
        // Boxed: only upgrade requests carry this state, not every request's future; `dyn`,
        // as above.
        let answer: RareAnswer<'_> = Box::pin(forward_upgrade(
            asked,
            std::mem::replace(req, Request::new(RequestBody::empty())),
            admitted,
            forward.timeout,
            facts,
        ));
        let answer = answer.await;
        // Declined, or failed on the way (connect, timeout, breaker, the switch itself).
        if facts.tunnel.is_none() {
            scope.conn.listener.stats.upgrades_failed.inc();
        }
        return answer.map(|response| facts.answer(response));
    }
    let timeout = route_timeout(forward, req.headers());
    if forward.include_attempt_count {
        req.headers_mut()
            .insert(X_ENVOY_ATTEMPT_COUNT.clone(), HeaderValue::from_static("1"));
        req.extensions_mut().insert(CountAttempts);
    }
    let count_in_response = forward.include_attempt_count_in_response;
    if count_in_response {
        req.extensions_mut().insert(CountAttemptsInResponse);
    }
    let (answered_by, response) = admitted
        .send(
            req,
            timeout,
            forward.retry_policy.as_ref(),
            in_flight.trace(),
        )
        .await?;
    if let Some(log) = in_flight.log()
        && !Rc::ptr_eq(&answered_by, &upstream)
    {
        log.upstream = Some(answered_by.addr_text().clone());
    }
    if let Some(trace) = in_flight.sampled_trace() {
        trace.set("upstream_address", text_of(answered_by.addr_text()));
    }
    facts.upstream = Some(answered_by.addr_text().clone());
    let (mut head, body) = response.into_parts();
    rewrite::response_for_client(&mut head);
    // One try, where no retry policy counted them.
    if count_in_response && forward.retry_policy.is_none() {
        (head.headers).insert(X_ENVOY_ATTEMPT_COUNT.clone(), HeaderValue::from_static("1"));
    }
    Ok(facts.answer(Response::from_parts(head, ResponseBody::upstream(body))))
}

/// Appends the request's own host to `x-forwarded-host` (a host rewrite's
/// `append_x_forwarded_host`), unless it is already the last value there, as Envoy does.
fn append_forwarded_host(headers: &mut http::HeaderMap, host: &HeaderValue) {
    static X_FORWARDED_HOST: http::HeaderName = http::HeaderName::from_static("x-forwarded-host");
    let mut lines = headers.get_all(&X_FORWARDED_HOST).iter();
    let (first, last) = (lines.next(), lines.next_back());
    let last_value = last
        .or(first)
        .and_then(|v| v.as_bytes().rsplit(|&b| b == b',').next());
    if last_value.is_some_and(|l| l.trim_ascii() == host.as_bytes()) {
        return;
    }
    // One line (the usual case) stays one comma-separated line, as Envoy writes it.
    let joined = match (first, last) {
        (Some(only), None) => {
            HeaderValue::from_bytes(&[only.as_bytes(), b",", host.as_bytes()].concat()).ok()
        }
        _ => None,
    };
    match joined {
        Some(value) => {
            headers.insert(&X_FORWARDED_HOST, value);
        }
        None => {
            headers.append(&X_FORWARDED_HOST, host.clone());
        }
    }
}

/// `matched` with its route's cluster picked: drawn from the route's split if it has one (by
/// the hash key if the split has one, so one client stays on one side), and looked up by name
/// where a request header names it.
fn pick_cluster<B>(mut matched: Matched, request: &Request<B>, scope: &Scope<'_>) -> Matched {
    let Some(route) = matched.route else {
        return matched;
    };
    let RouteAction::Forward(forward) = &scope.http.routes.route(route).action else {
        return matched;
    };
    let headers = request.headers();
    if let Some(split) = &forward.split {
        // A number the request brings (Envoy's random_value_specifier), else the hash key,
        // else at random.
        let value = split.random_value_header.as_ref().and_then(|name| {
            std::str::from_utf8(headers.get(name)?.as_bytes())
                .ok()?
                .parse::<u64>()
                .ok()
        });
        let client = scope.client.ip(scope.conn);
        matched.weighted = Some(match value {
            Some(value) => split.split.pick_value(value),
            None if split.use_hash_policy => {
                let hash = forward.hash_policy.as_ref().and_then(|policy| {
                    super::hash_policy::hash_request(policy, request, client, None).hash
                });
                // The hash as Envoy's random value: modulo the total weight.
                match hash {
                    Some(hash) => split.split.pick_value(hash),
                    None => split.split.pick(None),
                }
            }
            None => split.split.pick(
                split
                    .hash_key
                    .as_ref()
                    .and_then(|key| crate::cluster::hash_of(key, headers, client)),
            ),
        });
    }
    // The header's first value, as Envoy reads this untrusted header.
    let target = target_of(forward, matched.weighted);
    if target.by_request() {
        matched.named_cluster =
            (scope.http.routes.config()).cluster_for(target, request.uri(), headers);
    }
    matched
}

/// Where a forward goes: the drawn side of its split, or the route's own target.
fn target_of(forward: &ForwardAction, weighted: Option<usize>) -> &ClusterTarget {
    match &forward.split {
        // A split's side is always drawn with the route; its first if not.
        Some(split) => &split.clusters[weighted.unwrap_or(0)].target,
        None => &forward.cluster,
    }
}

/// Sends an upgrade request on a connection of its own. On a `101` the response head goes to
/// the client and the upgraded upstream connection into `facts.tunnel`; any other answer goes
/// to the client as it is.
async fn forward_upgrade(
    asked: upgrade::Asked,
    request: Request<RequestBody>,
    admitted: Admitted<'_>,
    timeout: std::time::Duration,
    facts: &mut Facts,
) -> Result<Response<ResponseBody>, ProxyError> {
    let request = {
        let (mut parts, body) = request.into_parts();
        asked.prepare(&mut parts);
        Request::from_parts(parts, body)
    };
    let (upstream, mut response) = admitted.send_upgrade(request, timeout).await?;
    facts.upstream = Some(upstream.addr_text().clone());
    if !asked.opened_by(response.status()) {
        let (mut head, body) = response.into_parts();
        rewrite::response_for_client(&mut head);
        return Ok(Response::from_parts(head, ResponseBody::upstream(body)));
    }
    let upstream_upgrade = response.headers().get(UPGRADE).cloned();
    let upgraded =
        hyper::upgrade::on(&mut response)
            .await
            .map_err(|source| ProxyError::UpstreamReset {
                addr: upstream.addr(),
                source: Box::new(source),
            })?;
    let (mut head, _) = response.into_parts();
    rewrite::response_for_client(&mut head);
    asked.client_head(&mut head, upstream_upgrade);
    facts.tunnel = Some((Box::new(TokioIo::new(upgraded)), asked.into_client_stream()));
    Ok(Response::from_parts(
        head,
        ResponseBody::local(Bytes::new()),
    ))
}

/// A CONNECT ended here (Envoy's `connect_config`): a TCP connection to a host of `cluster`,
/// then a 200 to the client, and the tunnel relays bytes between them. The request's headers
/// go no further.
async fn terminate_connect(
    req: &mut Request<RequestBody>,
    (cluster, hash): (&crate::cluster::Cluster, Option<u64>),
    client: std::net::IpAddr,
    in_flight: &mut InFlight,
    facts: &mut Facts,
) -> Result<Response<ResponseBody>, ProxyError> {
    let client_stream = upgrade::connect_stream(req);
    let upstream = cluster.connect_tcp(req.headers(), client, hash).await?;
    if let Some(log) = in_flight.log() {
        log.upstream = Some(upstream.addr_text().clone());
    }
    facts.upstream = Some(upstream.addr_text().clone());
    facts.tunnel = Some((Box::new(upstream), client_stream));
    Ok(Response::new(ResponseBody::local(Bytes::new())))
}

#[cfg(test)]
mod grpc_timeout_tests {
    use std::time::Duration;

    use super::grpc_timeout;

    #[test]
    fn grpc_timeouts_read_their_unit() {
        assert_eq!(grpc_timeout(b"1S"), Some(Duration::from_secs(1)));
        assert_eq!(grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(grpc_timeout(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(grpc_timeout(b"100n"), Some(Duration::from_nanos(100)));
        assert_eq!(
            grpc_timeout(b"99999H"),
            Some(Duration::from_secs(24 * 3600))
        );
        for bad in [
            &b""[..],
            b"S",
            b"10",
            b"123456789S",
            b"1.5S",
            b"10x",
            b"-1S",
        ] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
