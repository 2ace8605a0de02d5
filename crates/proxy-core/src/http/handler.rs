//! The request path after the codec: route, then a direct response or a relayed one.

use std::convert::Infallible;
use std::rc::Rc;

use bytes::Bytes;
use http::header::{CONNECTION, EXPECT, HOST, HeaderValue};
use http::uri::{PathAndQuery, Scheme};
use http::{Method, Request, Response, Uri, Version};

use super::body::{RequestBody, ResponseBody};
use super::ext_authz::Verdict;
use super::headers::{
    X_FORWARDED_PROTO, X_LEGATE_OVERLOADED, X_REQUEST_ID, append_forwarded_for, new_request_id,
    strip_hop_by_hop,
};
use super::local_reply;
use super::retry::{self, RetryPlan};
use crate::config::{ForwardAction, RouteAction, UpstreamProtocol};
use crate::conn::{ConnCtx, InFlight};
use crate::error::ProxyError;

/// Serves one request. Never fails: every error becomes a local reply with its status, and a
/// log line with its response flag.
pub(crate) async fn handle(
    req: Request<RequestBody>,
    conn: Rc<ConnCtx>,
    mut in_flight: InFlight,
) -> Result<Response<ResponseBody>, Infallible> {
    let method = req.method().clone();
    let uri = req.uri().clone();
    let version = req.version();
    let mut close = conn.worker.draining.get();
    if version <= Version::HTTP_11
        && let Some(max) = conn.listener.max_requests_per_connection
        && conn.requests.get() >= max
    {
        // The last request this connection takes: say so, so the client reconnects.
        close = true;
        conn.listener.stats.cx_max_requests.inc();
    }
    let mut response = match route_and_forward(req, &conn, &mut in_flight).await {
        Ok(response) => response,
        Err(err) => {
            if let Some(log) = in_flight.log() {
                log.flag = Some(err.flag());
            }
            // After a malformed request the stream may hold anything; do not read on.
            close |= matches!(
                err,
                ProxyError::BadRequest(_) | ProxyError::HeadersTooLarge { .. }
            );
            let mut reply = local_reply::text(
                err.status(),
                Bytes::from_static(err.client_body().as_bytes()),
            );
            if matches!(err, ProxyError::Overflow(_)) {
                // Tells a client (or the next proxy) that this was load shedding, not a
                // failed upstream: worth backing off, not worth marking the host down. (The
                // pool logs refusals, at most a line a second.)
                reply.headers_mut().insert(
                    X_LEGATE_OVERLOADED.clone(),
                    HeaderValue::from_static("true"),
                );
            } else {
                tracing::warn!(
                    flag = %err.flag(),
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
    if close && version <= Version::HTTP_11 {
        // hyper closes the connection after a response that says so; while draining, saying
        // it lets the client reconnect elsewhere instead of finding the connection gone.
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    in_flight.set_status(response.status());
    response.body_mut().hold(in_flight);
    Ok(response)
}

async fn route_and_forward(
    mut req: Request<RequestBody>,
    conn: &ConnCtx,
    in_flight: &mut InFlight,
) -> Result<Response<ResponseBody>, ProxyError> {
    if req.method() == Method::CONNECT {
        return Err(ProxyError::BadRequest("CONNECT is not supported"));
    }
    if let Some(limit) = conn.listener.head_limit {
        check_head_size(&req, limit)?;
    }
    let host = request_host(&req)?;
    let host_text = host.as_ref().map_or("", |h| h.to_str().unwrap_or(""));
    let route = conn
        .listener
        .routes
        .find(host_text, req.uri().path(), req.headers())
        .ok_or(ProxyError::NoRoute)?;
    let mut response_headers = None;
    if let Some(authz) = &conn.listener.ext_authz
        && !route.ext_authz.disabled
    {
        // The service and the upstream see the same request id.
        ensure_request_id(req.headers_mut(), in_flight);
        let id = req.headers().get(&X_REQUEST_ID).cloned();
        let id = id.as_ref().map_or("", |id| id.to_str().unwrap_or(""));
        match authz
            .check(&mut req, host_text, id, &route.ext_authz, conn)
            .await?
        {
            Verdict::Proceed(allowed) => response_headers = allowed,
            Verdict::Respond(response, flag) => {
                if let Some(log) = in_flight.log() {
                    log.flag = Some(flag);
                }
                return Ok(*response);
            }
        }
    }
    let mut response = match &route.action {
        RouteAction::DirectResponse { status, body } => local_reply::text(*status, body.clone()),
        RouteAction::Forward(forward) => {
            forward_request(req, host, forward, conn, in_flight).await?
        }
    };
    if let Some(allowed) = response_headers {
        allowed.apply_to_response(response.headers_mut());
    }
    Ok(response)
}

/// Gives the request an `x-request-id` (logged) if the client sent none.
fn ensure_request_id(headers: &mut http::HeaderMap, in_flight: &mut InFlight) {
    if headers.contains_key(&X_REQUEST_ID) {
        return;
    }
    let id = new_request_id();
    if let Some(log) = in_flight.log() {
        log.request_id = Some(id.clone());
    }
    headers.insert(X_REQUEST_ID.clone(), id);
}

/// Refuses a request whose head is larger than `limit` bytes, counted as Envoy does: the
/// request line's target plus every header name and value.
fn check_head_size<B>(req: &Request<B>, limit: usize) -> Result<(), ProxyError> {
    let target = req.uri().authority().map_or(0, |a| a.as_str().len())
        + req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    let size = target
        + req
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len())
            .sum::<usize>();
    if size > limit {
        return Err(ProxyError::HeadersTooLarge { size, limit });
    }
    Ok(())
}

/// The host the client asked for: the URI's authority (HTTP/2's `:authority`, or an
/// absolute-form HTTP/1.1 target, which RFC 9112 section 3.2.2 says overrides `Host`), else
/// the `Host` header. HTTP/1.1 requires exactly one `Host` line (RFC 9112 section 3.2).
fn request_host(req: &Request<RequestBody>) -> Result<Option<HeaderValue>, ProxyError> {
    let mut hosts = req.headers().get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(ProxyError::BadRequest("more than one host header"));
    }
    if let Some(host) = host
        && (host.is_empty() || host.to_str().is_err())
    {
        return Err(ProxyError::BadRequest("invalid host header"));
    }
    if host.is_none() && req.version() == Version::HTTP_11 {
        return Err(ProxyError::BadRequest(
            "HTTP/1.1 request without a host header",
        ));
    }
    if let Some(authority) = req.uri().authority() {
        return HeaderValue::from_str(authority.as_str())
            .map(Some)
            .map_err(|_| ProxyError::BadRequest("invalid authority"));
    }
    Ok(host.cloned())
}

/// Resolves once `progress` has stood still for `timeout`. As in Envoy, a request's timeout
/// runs from the end of its body: a large upload that keeps moving is not cut off, and one that
/// stalls for the timeout is.
async fn idle_for(timeout: std::time::Duration, progress: &std::cell::Cell<tokio::time::Instant>) {
    loop {
        let deadline = progress.get() + timeout;
        tokio::time::sleep_until(deadline).await;
        if progress.get() + timeout <= tokio::time::Instant::now() {
            return;
        }
    }
}

async fn forward_request(
    req: Request<RequestBody>,
    host: Option<HeaderValue>,
    forward: &ForwardAction,
    conn: &ConnCtx,
    in_flight: &mut InFlight,
) -> Result<Response<ResponseBody>, ProxyError> {
    let (upstream, picked) = conn.worker.clusters[forward.cluster]
        .pick(req.headers(), conn.peer.ip())
        .ok_or(ProxyError::NoHealthyUpstream)?;
    let admitted = upstream.admit()?;
    let (mut parts, body) = req.into_parts();

    strip_hop_by_hop(&mut parts.headers);
    // The downstream codec already answered any `100-continue`; the upstream gets the body
    // as it streams.
    parts.headers.remove(EXPECT);
    append_forwarded_for(&mut parts.headers, &conn.peer_ip);
    parts.headers.insert(
        X_FORWARDED_PROTO.clone(),
        conn.listener.forwarded_proto.clone(),
    );
    ensure_request_id(&mut parts.headers, in_flight);
    if let Some(log) = in_flight.log() {
        log.upstream = Some(upstream.addr_text().clone());
    }

    let authority = match (&forward.host_rewrite, host) {
        (Some(rewrite), _) => rewrite.clone(),
        (None, Some(host)) => host,
        (None, None) => HeaderValue::from_str(&upstream.addr().to_string())
            .expect("a socket address is a valid header value"),
    };
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    match upstream.protocol() {
        UpstreamProtocol::Http1 => {
            parts.uri = Uri::from(path);
            parts.version = Version::HTTP_11;
            parts.headers.insert(HOST, authority);
        }
        UpstreamProtocol::Http2 => {
            parts.headers.remove(HOST);
            let scheme = if upstream.shared().tls.is_some() {
                Scheme::HTTPS
            } else {
                Scheme::HTTP
            };
            parts.uri = Uri::builder()
                .scheme(scheme)
                .authority(authority.as_bytes())
                .path_and_query(path)
                .build()
                .map_err(|_| ProxyError::BadRequest("host is not a valid authority"))?;
            parts.version = Version::HTTP_2;
        }
    }

    let mut body = body;
    let progress = body.track_progress();
    let retry = forward.retry_policy.as_ref().map(|policy| {
        let plan = RetryPlan::prepare(&parts, &mut body, upstream.buffer_limit());
        (policy, plan)
    });
    let request = Request::from_parts(parts, body);
    let timed_out = || {
        upstream.stats().rq_timeout.inc();
        ProxyError::Timeout {
            addr: upstream.addr(),
            after: forward.timeout,
        }
    };
    let cluster = &conn.worker.clusters[forward.cluster];
    let attempt = async {
        match retry {
            None => {
                let response = upstream.send(request, picked, admitted).await;
                response
                    .map(|r| (Rc::clone(&upstream), r))
                    .map_err(|e| e.error)
            }
            Some((policy, plan)) => {
                retry::send_with_retries(
                    request,
                    &upstream,
                    admitted,
                    picked,
                    policy,
                    plan,
                    cluster,
                    conn.peer.ip(),
                    forward.timeout,
                )
                .await
            }
        }
    };
    let (answered_by, response) = match progress {
        // No request body: the clock starts now.
        None => tokio::time::timeout(forward.timeout, attempt)
            .await
            .map_err(|_| timed_out())??,
        Some(progress) => tokio::select! {
            response = attempt => response?,
            () = idle_for(forward.timeout, &progress) => return Err(timed_out()),
        },
    };
    if let Some(log) = in_flight.log()
        && !Rc::ptr_eq(&answered_by, &upstream)
    {
        log.upstream = Some(answered_by.addr_text().clone());
    }

    let (mut head, body) = response.into_parts();
    strip_hop_by_hop(&mut head.headers);
    // The downstream codec frames the response for its own protocol; an HTTP/2 version from
    // the upstream would only make the HTTP/1.1 encoder complain.
    head.version = Version::HTTP_11;
    Ok(Response::from_parts(head, ResponseBody::upstream(body)))
}
