//! Request mirroring (a route's `request_mirror_policies`, Envoy's shadowing): a copy of the
//! request goes to another cluster on a task of its own; its answer is read and discarded.
//! The copy never holds up or fails the original: it is started beside it, its body is fed
//! from the original's frames as they go upstream (given up if it falls more than the mirror
//! cluster's buffer limit behind), and it is refused at once by that cluster's own breakers.

use std::net::IpAddr;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use http::header::HeaderValue;
use http::request::Parts;
use http::{HeaderMap, Request};
use http_body_util::BodyExt;

use super::rewrite;
use crate::cluster::Cluster;
use crate::context::{ConnCtx, RequestBody};
use crate::error::ProxyError;
use config::{ForwardAction, RouteConfiguration};

/// Starts the copies the route's mirror policies draw for this request. `req` is the request
/// as it will be forwarded (path rewritten, before the upstream's own rewrite), `authority`
/// the host it asks for; a copy's body is teed from its body. A copy has the route's timeout,
/// and no retries.
pub(crate) fn start(
    route: &ForwardAction,
    (clusters, routes): (&[Rc<Cluster>], &RouteConfiguration),
    req: &mut Request<RequestBody>,
    authority: Option<&HeaderValue>,
    conn: &Rc<ConnCtx>,
    client: IpAddr,
) {
    let timeout = route.timeout;
    for policy in &route.mirrors {
        if !drawn(policy.fraction) {
            continue;
        }
        // A copy to no cluster there is is not sent (Envoy's shadow skips it).
        let Some(index) = routes.cluster_for(&policy.cluster, req.uri(), req.headers()) else {
            continue;
        };
        let cluster = Rc::clone(&clusters[index]);
        let authority = match authority {
            Some(host) if !policy.disable_shadow_host_suffix_append => shadow_host(host),
            other => other.cloned(),
        };
        let copy = Copy {
            head: head_of(req),
            authority,
            body: req.body_mut().copy_for_mirror(cluster.buffer_limit()),
        };
        cluster.stats().rq_shadow.inc();
        let conn = Rc::clone(conn);
        tokio::task::spawn_local(async move {
            if let Err(error) = copy.send(&cluster, &conn, client, timeout).await {
                cluster.stats().rq_shadow_failed.inc();
                tracing::debug!(%error, "mirrored request failed");
            }
        });
    }
}

/// Whether a request falls in a share of `millionths`.
fn drawn(millionths: u32) -> bool {
    match millionths {
        1_000_000.. => true,
        0 => false,
        share => crate::random::next_u64() % 1_000_000 < u64::from(share),
    }
}

/// `-shadow` appended to a host, before its port (`api.example.com:8080` ->
/// `api.example.com-shadow:8080`), as Envoy writes a shadow's host.
fn shadow_host(host: &HeaderValue) -> Option<HeaderValue> {
    let bytes = host.as_bytes();
    let name_end = port_start(bytes);
    let mut shadow = BytesMut::with_capacity(bytes.len() + 7);
    shadow.extend_from_slice(&bytes[..name_end]);
    shadow.extend_from_slice(b"-shadow");
    shadow.extend_from_slice(&bytes[name_end..]);
    HeaderValue::from_maybe_shared(shadow.freeze()).ok()
}

/// Where a host's `:port` starts (its length when it has none).
fn port_start(host: &[u8]) -> usize {
    if host.first() == Some(&b'[') {
        // An IPv6 literal: a port follows its `]`.
        return match host.iter().position(|&b| b == b']') {
            Some(end) if host.get(end + 1) == Some(&b':') => end + 1,
            _ => host.len(),
        };
    }
    host.iter().position(|&b| b == b':').unwrap_or(host.len())
}

/// A copy of a request head.
fn head_of(req: &Request<RequestBody>) -> Parts {
    let (mut head, ()) = Request::new(()).into_parts();
    head.method = req.method().clone();
    head.uri = req.uri().clone();
    head.version = req.version();
    head.headers = HeaderMap::clone(req.headers());
    head
}

/// One copy, sent on its own task.
struct Copy {
    head: Parts,
    authority: Option<HeaderValue>,
    body: RequestBody,
}

impl Copy {
    /// Sends the copy and reads its whole answer, within `timeout` for the head and again for
    /// the body.
    async fn send(
        self,
        cluster: &Cluster,
        conn: &ConnCtx,
        client: IpAddr,
        timeout: Duration,
    ) -> Result<(), ProxyError> {
        let Copy {
            mut head,
            authority,
            body,
        } = self;
        // The cluster's own hash policy holds for copies too (a route's is the original's).
        let hash = match cluster.hash_policy() {
            Some(policy) if cluster.hashes() => {
                let probe = Request::from_parts(head, ());
                let hash = super::hash_policy::hash_request(policy, &probe, client, None).hash;
                head = probe.into_parts().0;
                hash
            }
            _ => None,
        };
        let admitted = cluster.admit(&head.headers, client, hash)?;
        rewrite::request_for_upstream(&mut head, authority, admitted.host(), conn)?;
        let (host, response) = admitted
            .send_copy(Request::from_parts(head, body), timeout)
            .await?;
        // Read to its end, each frame dropped as it comes, so the connection goes back to the
        // pool.
        let mut body = response.into_body();
        let drained = async {
            while let Some(frame) = body.frame().await {
                frame?;
            }
            Ok(())
        };
        match tokio::time::timeout(timeout, drained).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(ProxyError::UpstreamReset {
                addr: host.addr(),
                source,
            }),
            Err(_) => Err(ProxyError::Timeout {
                addr: host.addr(),
                after: timeout,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_suffix_goes_before_the_port() {
        let shadow = |host: &'static str| {
            let value = shadow_host(&HeaderValue::from_static(host)).unwrap();
            value.to_str().unwrap().to_owned()
        };
        assert_eq!(shadow("api.example.com"), "api.example.com-shadow");
        assert_eq!(
            shadow("api.example.com:8080"),
            "api.example.com-shadow:8080"
        );
        assert_eq!(shadow("10.0.0.1:80"), "10.0.0.1-shadow:80");
        assert_eq!(shadow("[2001:db8::1]:443"), "[2001:db8::1]-shadow:443");
        assert_eq!(shadow("[2001:db8::1]"), "[2001:db8::1]-shadow");
    }

    #[test]
    fn shares_are_drawn_in_proportion() {
        assert!((0..1000).all(|_| drawn(1_000_000)));
        assert!((0..1000).all(|_| !drawn(0)));
        let hits = (0..100_000).filter(|_| drawn(100_000)).count();
        // 10% of 100,000: the standard deviation is ~95.
        assert!((9_400..=10_600).contains(&hits), "{hits}");
    }
}
