//! Sending a request to a cluster: a host picked and a `max_requests` slot taken before any
//! work is spent on it ([`Cluster::admit`]), then the send under the route's timeout and retry
//! policy ([`Admitted::send`]). Rewriting the request for the host is the caller's job, between
//! the two.

use std::net::IpAddr;
use std::pin::pin;
use std::rc::Rc;
use std::time::Duration;

use balancer::Picked;
use http::{HeaderMap, Request, Response};

use super::breaker::Slot;
use super::host::SendError;
use super::retry;
use super::{Cluster, HostPool, UpstreamBody};
use crate::box_pool::PooledBox;
use crate::context::RequestBody;
use crate::error::ProxyError;
use crate::trace::{RequestTrace, TRACEPARENT, text_of};
use config::RetryPolicy;

/// A request admitted to a host of a cluster: the host is counted as having it in flight and
/// a `max_requests` slot is held, until the request is sent or dropped.
pub(crate) struct Admitted<'a> {
    pub(super) cluster: &'a Cluster,
    pub(super) host: Rc<HostPool>,
    pub(super) picked: Picked,
    pub(super) slot: Slot<'a>,
    /// The request's hash, for the hosts of retries.
    pub(super) key: Option<u64>,
}

impl Cluster {
    /// Picks a host for the request and takes a `max_requests` slot for it: refused at once
    /// when the cluster has no host to offer or its breaker is full. `route_hash`: the hash
    /// the route's hash policy gave the request, over the cluster's own `hash_key`.
    pub(crate) fn admit(
        &self,
        headers: &HeaderMap,
        client: IpAddr,
        route_hash: Option<u64>,
    ) -> Result<Admitted<'_>, ProxyError> {
        let key = self.request_key(headers, client, route_hash);
        let (host, picked) = self.pick(key).ok_or(ProxyError::NoHealthyUpstream)?;
        let slot = self.request_slot()?;
        Ok(Admitted {
            cluster: self,
            host,
            picked,
            slot,
            key,
        })
    }
}

impl Admitted<'_> {
    /// The host picked for the first try.
    pub(crate) fn host(&self) -> &Rc<HostPool> {
        &self.host
    }

    /// Sends the request and waits for the response head: `(the host that answered, its
    /// response)`. `timeout` runs from the end of the request body (as Envoy's route timeout);
    /// while the body is still going up, only time it stands still counts. Failed tries are
    /// sent again as `retry_policy` allows. The request is taken from `request` as it is sent
    /// (by reference: each level of the send would otherwise keep a copy in its future).
    pub(crate) async fn send(
        self,
        request: &mut Request<RequestBody>,
        timeout: Duration,
        retry_policy: Option<&RetryPolicy>,
        trace: Option<&RequestTrace>,
    ) -> Result<(Rc<HostPool>, Response<UpstreamBody>), ProxyError> {
        let Admitted {
            cluster,
            host,
            picked,
            slot,
            key,
        } = self;
        if cluster.settings.predictive_ratio.is_some() {
            let version = request.version();
            cluster.preconnect_predictive(|pool| pool.ahead_for(version));
        }
        let progress = request.body_mut().track_progress();
        let timed_out = || {
            host.count_timeout();
            ProxyError::Timeout {
                addr: host.addr(),
                after: timeout,
            }
        };
        // Pinned where it is made, in this future's state, and raced by reference: moved into
        // the `Timeout` or the `select!`, it would be copied (600 bytes) on the way.
        let mut attempt = pin!(async {
            match (retry_policy, trace.filter(|t| t.sampled())) {
                (None, None) => host
                    .send(request, picked, slot)
                    .await
                    .map(|response| (Rc::clone(&host), response))
                    .map_err(|e| e.error),
                // From the pool, as the retry loop below: only sampled requests carry a
                // span's state.
                (None, Some(trace)) => {
                    PooledBox::pin_with(|| traced_try(&host, request, picked, slot, trace))
                        .await
                        .map(|response| (Rc::clone(&host), response))
                        .map_err(|e| e.error)
                }
                // Boxed: the retry loop's state is twice a single try's, and without the box
                // every request's future (and each copy of it as it is awaited, level by
                // level) would carry it, retries configured or not. From the worker's pool of
                // boxes: no allocation per request.
                // The retry plan (the head's copy) is made there too.
                (Some(policy), _) => {
                    PooledBox::pin_with(|| {
                        retry::send_with_retries(
                            request, &host, slot, picked, policy, cluster, key, timeout, trace,
                        )
                    })
                    .await
                }
            }
        });
        match progress {
            // No request body: the clock starts now. (`Timeout` checks its clock even when the
            // attempt has used up the task's budget.) On a pooled timer: the deadline almost
            // never comes, and a timer made per request costs two trips through the wheel.
            None => crate::sleep_pool::timeout(timeout, attempt.as_mut())
                .await
                .map_err(|_| timed_out())?,
            Some(progress) => tokio::select! {
                answered = attempt.as_mut() => answered,
                () = crate::runtime::idle_for(timeout, &progress) => Err(timed_out()),
            },
        }
    }

    /// Sends a mirror's copy of a request: one try, under the same route timeout. A method of
    /// its own, not [`send`](Self::send) without retries: a second caller of `send` keeps the
    /// compiler from inlining it into the request path (+190 instructions a request).
    pub(crate) async fn send_copy(
        self,
        mut request: Request<RequestBody>,
        timeout: Duration,
    ) -> Result<(Rc<HostPool>, Response<UpstreamBody>), ProxyError> {
        let Admitted {
            host, picked, slot, ..
        } = self;
        let progress = request.body_mut().track_progress();
        let attempt = host.send(&mut request, picked, slot);
        let timed_out = || {
            host.count_timeout();
            ProxyError::Timeout {
                addr: host.addr(),
                after: timeout,
            }
        };
        let response = match progress {
            None => crate::sleep_pool::timeout(timeout, attempt)
                .await
                .map_err(|_| timed_out())?,
            Some(progress) => tokio::select! {
                answered = attempt => answered,
                () = crate::runtime::idle_for(timeout, &progress) => return Err(timed_out()),
            },
        };
        Ok((Rc::clone(&host), response.map_err(|e| e.error)?))
    }
}

/// One try of a sampled request at `host`: a span of its own (Envoy's upstream span,
/// `router CLUSTER egress`), whose `traceparent` the host sees, ended at the response head.
pub(super) async fn traced_try(
    host: &Rc<HostPool>,
    request: &mut Request<RequestBody>,
    picked: Picked,
    slot: Slot<'_>,
    trace: &RequestTrace,
) -> Result<Response<UpstreamBody>, SendError> {
    let cluster = &host.shared().name;
    let named = trace.upstream_name(
        (&*request).into(),
        &crate::trace::Upstream {
            address: host.addr_text(),
            hostname: host.hostname(),
            cluster,
        },
    );
    let name = named.unwrap_or_else(|| format!("router {cluster} egress"));
    let Some(mut span) = trace.child(name) else {
        return host.send(request, picked, slot).await;
    };
    request
        .headers_mut()
        .insert(TRACEPARENT.clone(), span.traceparent());
    span.set("component", "proxy");
    span.set("upstream_cluster", cluster.clone());
    span.set("upstream_address", text_of(host.addr_text()));
    let sent = host.send(request, picked, slot).await;
    match &sent {
        Ok(response) => span.answered(response.status()),
        Err(failed) => span.fail(failed.error.to_string()),
    }
    sent
}
