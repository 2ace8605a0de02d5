//! Retries: a failed try is sent again, on another host when the cluster has one, as the
//! route's `retry_policy` allows and the cluster's `max_retries` breaker has room.
//!
//! A request is tried again only when it can be sent whole: either none of it left (a connect
//! failure hands the request back untouched) or its body was recorded as it went, which stops
//! at the buffer limit. A body streamed past the limit is never retried.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use http::{HeaderMap, Method, Request, Response, Uri, Version};

use super::breaker::Slot;
use super::host::SendError;
use super::{Cluster, HostPool, SharedCluster, UpstreamBody};
use crate::box_pool::PooledBox;
use crate::context::{Replay, RequestBody};
use crate::error::ProxyError;
use crate::trace::RequestTrace;
use config::{RetryOn, RetryPolicy};

/// What a retry rebuilds its request from.
struct RetryPlan {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    replay: Rc<RefCell<Replay>>,
    /// Each retry carries its number in `x-envoy-attempt-count`.
    count_attempts: bool,
    /// The response says in `x-envoy-attempt-count` how many tries it took.
    count_in_response: bool,
    /// How the client spelled its header names, for an upstream that keeps their case.
    case: Option<h1::HeaderCase>,
}

impl RetryPlan {
    /// Keeps a copy of the request head and starts recording the body.
    fn prepare(request: &mut Request<RequestBody>, buffer_limit: usize) -> Self {
        Self {
            method: request.method().clone(),
            uri: request.uri().clone(),
            version: request.version(),
            headers: request.headers().clone(),
            count_attempts: request.extensions().get::<CountAttempts>().is_some(),
            count_in_response: request
                .extensions()
                .get::<CountAttemptsInResponse>()
                .is_some(),
            case: request.extensions().get::<h1::HeaderCase>().cloned(),
            replay: request.body_mut().record_for_replay(buffer_limit),
        }
    }

    fn rebuild(&self, body: RequestBody) -> Request<RequestBody> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method.clone();
        *req.uri_mut() = self.uri.clone();
        *req.version_mut() = self.version;
        *req.headers_mut() = self.headers.clone();
        if let Some(case) = &self.case {
            req.extensions_mut().insert(case.clone());
        }
        req
    }
}

/// A `max_retries` slot, held while a retried try is in flight.
struct RetrySlot(Arc<SharedCluster>);

impl Drop for RetrySlot {
    fn drop(&mut self) {
        self.0.breakers.retries.release();
    }
}

/// Sends `request` to `upstream`, and again as `policy` says while tries fail. The request
/// is taken from `request` as it is sent.
#[allow(clippy::too_many_arguments)] // the request's whole context; called from one place
pub(crate) async fn send_with_retries(
    request: &mut Request<RequestBody>,
    first: &Rc<HostPool>,
    admitted: Slot<'_>,
    mut picked: balancer::Picked,
    policy: &RetryPolicy,
    cluster: &Cluster,
    key: Option<u64>,
    route_timeout: std::time::Duration,
    trace: Option<&RequestTrace>,
) -> Result<(Rc<HostPool>, Response<UpstreamBody>), ProxyError> {
    // Before the first try takes any of the body.
    let plan = RetryPlan::prepare(request, first.buffer_limit());
    let mut retries_left = policy.num_retries;
    // Only requests the policy names are retried, where it names some: the others are
    // sent once, as without a policy.
    let named = &policy.retriable_request_headers;
    let eligible = named.is_empty() || named.iter().any(|m| m.matches(request.headers()));
    if !eligible {
        retries_left = 0;
    }
    let initial = retries_left;
    // The answer, with the number of tries it took where the route says.
    let answer = |tried: Rc<HostPool>, mut response: Response<UpstreamBody>, left: u32| {
        if plan.count_in_response {
            let tries = initial - left + 1;
            (response.headers_mut()).insert(X_ENVOY_ATTEMPT_COUNT.clone(), tries.into());
        }
        (tried, response)
    };
    // Every host a try went to, for the `previous_hosts` predicate, and its priority, for
    // `previous_priorities`.
    let mut tried_hosts: Vec<std::net::SocketAddr> = Vec::new();
    let mut tried_priorities: Vec<u32> = Vec::new();
    let mut excluded: Vec<u32> = Vec::new();
    let mut retrying: Option<RetrySlot> = None;
    let mut upstream = Rc::clone(first);
    let mut admitted = Some(admitted);
    loop {
        let tried = Rc::clone(&upstream);
        // Noted here, kept only if the try is retried: a request that is not retried
        // allocates nothing for it.
        let priority = picked.priority();
        let per_try = policy.per_try_timeout.unwrap_or(route_timeout);
        // The first try was admitted by the caller; each retry is a request of its own.
        let slot = match admitted.take() {
            Some(slot) => slot,
            None => cluster.request_slot()?,
        };
        let attempt = async {
            match trace.filter(|t| t.sampled()) {
                None => tried.send(request, picked, slot).await,
                Some(trace) => {
                    PooledBox::pin_with(|| {
                        super::forward::traced_try(&tried, request, picked, slot, trace)
                    })
                    .await
                }
            }
        };
        let outcome = match tokio::time::timeout(per_try, attempt).await {
            Ok(outcome) => outcome,
            Err(_) => {
                tried.count_timeout();
                Err(SendError {
                    error: ProxyError::Timeout {
                        addr: tried.addr(),
                        after: per_try,
                    },
                    unsent: false,
                })
            }
        };
        let was_retry = retrying.take().is_some();
        let (retriable, unsent) = match outcome {
            Ok(response) => {
                if !response_retriable(policy, &response) {
                    if was_retry {
                        tried.stats().rq_retry_success.inc();
                    }
                    return Ok(answer(tried, response, retries_left));
                }
                (Ok(response), false)
            }
            Err(SendError { error, unsent }) => {
                if !error_retriable(policy.retry_on, &error, unsent) {
                    return Err(error);
                }
                (Err(error), unsent)
            }
        };
        let give_up = |outcome: Result<Response<UpstreamBody>, ProxyError>| {
            outcome.map(|response| answer(Rc::clone(&tried), response, retries_left))
        };
        if retries_left == 0 {
            if eligible {
                tried.stats().rq_retry_limit_exceeded.inc();
            }
            return give_up(retriable);
        }
        // Unsent, the request is still whole in `request`; else its body is replayed.
        let body = if unsent {
            Some(std::mem::replace(request.body_mut(), RequestBody::empty()))
        } else {
            plan.replay.borrow().body()
        };
        let Some(body) = body else {
            return give_up(retriable);
        };
        let shared = tried.shared();
        if !shared.breakers.try_acquire_retry() {
            tried.stats().rq_retry_overflow.inc();
            return give_up(retriable);
        }
        retrying = Some(RetrySlot(Arc::clone(shared)));
        retries_left -= 1;
        tried.stats().rq_retry.inc();
        // The failed try's response, if any, is dropped here: its connection is closed.
        drop(retriable);
        let attempt = policy.num_retries - retries_left;
        let ceiling = policy.back_off.ceiling(attempt).as_micros() as u64;
        if ceiling > 0 {
            // Fully jittered, as Envoy's: anywhere below the ceiling.
            let wait = crate::random::next_u64() % ceiling;
            tokio::time::sleep(std::time::Duration::from_micros(wait)).await;
        }
        tried_hosts.push(tried.addr());
        tried_priorities.push(priority);
        let avoid: &[std::net::SocketAddr] = if policy.previous_hosts {
            &tried_hosts
        } else {
            &[]
        };
        // As Envoy's: the tries before the first `update_frequency` use the loads as they
        // are; every `update_frequency` tries, the levels tried so far are left out.
        if let Some(every) = policy.previous_priorities {
            let tries = tried_priorities.len() as u32;
            if tries.is_multiple_of(every) {
                excluded.extend_from_slice(&tried_priorities);
                excluded.sort_unstable();
                excluded.dedup();
            }
        }
        (upstream, picked) = pick_other(
            cluster,
            key,
            avoid,
            &excluded,
            policy.host_selection_attempts,
        )
        .ok_or(ProxyError::NoHealthyUpstream)?;
        // Every level left out: the pick fell back to the loads as they are, and the levels
        // tried are counted afresh from here, as Envoy resets them.
        if excluded.contains(&picked.priority()) {
            excluded.clear();
            tried_priorities.clear();
        }
        *request = plan.rebuild(body);
        // The try's number, where the route counts them (the first try's `1` is the plan's).
        if plan.count_attempts {
            let n = initial - retries_left + 1;
            request
                .headers_mut()
                .insert(X_ENVOY_ATTEMPT_COUNT.clone(), http::HeaderValue::from(n));
        }
    }
}

/// The try's number on requests of routes that count them (`include_request_attempt_count`).
pub(crate) static X_ENVOY_ATTEMPT_COUNT: http::HeaderName =
    http::HeaderName::from_static("x-envoy-attempt-count");

/// Marks a request whose route counts its tries.
#[derive(Clone, Copy)]
pub(crate) struct CountAttempts;

/// Marks a request whose response says how many tries it took.
#[derive(Clone, Copy)]
pub(crate) struct CountAttemptsInResponse;

/// A host for a retry, outside the `excluded` priorities' levels where others are available,
/// preferring one not in `avoid` within `picks` picks (Envoy's `previous_hosts` predicate and
/// `host_selection_retry_max_attempts`); the last pick stands.
fn pick_other(
    cluster: &Cluster,
    key: Option<u64>,
    avoid: &[std::net::SocketAddr],
    excluded: &[u32],
    picks: u32,
) -> Option<(Rc<HostPool>, balancer::Picked)> {
    let mut choice = cluster.pick_excluding(key, excluded)?;
    for _ in 1..picks {
        if !avoid.contains(&choice.0.addr()) {
            break;
        }
        choice = cluster.pick_excluding(key, excluded)?;
    }
    Some(choice)
}

fn response_retriable<B>(policy: &RetryPolicy, response: &Response<B>) -> bool {
    let on = policy.retry_on;
    let code = response.status().as_u16();
    answer_retriable(on, response.status(), response.headers())
        || (on.retriable_status_codes && policy.retriable_status_codes.contains(&code))
        || (on.retriable_headers
            && (policy.retriable_headers.iter()).any(|m| m.matches(response.headers())))
}

/// Whether `on` retries an answer with this head, by its status and gRPC status (a policy's
/// lists of codes and headers aside).
pub(crate) fn answer_retriable(on: RetryOn, status: http::StatusCode, headers: &HeaderMap) -> bool {
    let code = status.as_u16();
    (on.server_error && status.is_server_error())
        || (on.gateway_error && matches!(code, 502..=504))
        || (on.retriable_4xx && code == 409)
        || (on.any_grpc() && grpc_retriable(on, headers))
}

/// Whether `on` retries a try that found no connection (nothing of it went out).
pub(crate) fn connect_failure_retriable(on: RetryOn) -> bool {
    // Envoy: `5xx` and `gateway-error` also cover a try that got no response at all.
    on.connect_failure || on.reset_before_request || on.server_error || on.gateway_error
}

/// Whether `on` retries a try whose connection failed on the way; `unsent`: before any of
/// the request went out.
pub(crate) fn reset_retriable(on: RetryOn, unsent: bool) -> bool {
    on.reset || (on.reset_before_request && unsent) || on.server_error || on.gateway_error
}

/// A gRPC answer whose head already holds its status (trailers-only), as Envoy reads it.
fn grpc_retriable(on: RetryOn, headers: &HeaderMap) -> bool {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok()?.trim().parse::<u32>().ok())
        .is_some_and(|code| on.grpc_status(code))
}

/// Whether a try that got no response is retried; `unsent`: none of the request went out.
fn error_retriable(on: RetryOn, error: &ProxyError, unsent: bool) -> bool {
    // Envoy: `5xx` and `gateway-error` also cover a try that got no response at all.
    let no_response = on.server_error || on.gateway_error;
    match error {
        ProxyError::ConnectFailure { .. }
        | ProxyError::UpstreamTls { .. }
        | ProxyError::ConnectTimeout { .. } => connect_failure_retriable(on),
        ProxyError::UpstreamReset { source, .. } => {
            reset_retriable(on, unsent)
                || (on.refused_stream
                    && crate::error::h2_reason(source.as_ref()) == Some(h2::Reason::REFUSED_STREAM))
        }
        ProxyError::Timeout { .. }
        | ProxyError::UpstreamProtocol { .. }
        | ProxyError::UpstreamFraming { .. } => no_response,
        _ => false,
    }
}
