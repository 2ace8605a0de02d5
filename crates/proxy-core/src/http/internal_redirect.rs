//! Internal redirects (a route's `internal_redirect`, Envoy's `internal_redirect_policy`): an
//! upstream's redirect the route follows is not sent to the client; the request goes on to
//! the location, routed and filtered again as a new request, and the client gets the answer
//! from there.
//!
//! As in Envoy, only a request the proxy holds whole can be sent again: here, one without a
//! body. The location must be absolute (`http(s)://host/path`), of the request's scheme
//! unless the policy allows another, and route somewhere; the request keeps its headers
//! (those the policy copies from the answer replaced), with `x-envoy-original-url` naming
//! where it was sent before.

use http::header::{HOST, LOCATION};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderName, HeaderValue, Method, Request, Uri};
use http_body::Body as _;

use super::head;
use crate::context::RequestBody;
use crate::router::RouteTable;
use config::InternalRedirectPolicy;

static X_ENVOY_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-envoy-original-url");

/// What a followed redirect needs of the request it redirects: its head as it went to the
/// route's cluster (after the filters).
pub(crate) struct Kept {
    method: Method,
    uri: Uri,
    version: http::Version,
    headers: http::HeaderMap,
    host: Option<HeaderValue>,
    https: bool,
}

/// The request's head, when the route follows redirects and this request could be sent again:
/// it has no body, and its redirects so far are fewer than the policy's most.
pub(crate) fn keep(
    policy: &InternalRedirectPolicy,
    req: &Request<RequestBody>,
    host: Option<&HeaderValue>,
    https: bool,
    followed: u32,
) -> Option<Kept> {
    if followed >= policy.max_internal_redirects || !req.body().is_end_stream() {
        return None;
    }
    Some(Kept {
        method: req.method().clone(),
        uri: req.uri().clone(),
        version: req.version(),
        headers: req.headers().clone(),
        host: host.cloned(),
        https,
    })
}

/// The redirects of one request: how many were followed, the routes they went from and to
/// (for the `previous_routes` predicate), and the request to send on next.
#[derive(Default)]
pub(crate) struct Redirects {
    pub(crate) followed: u32,
    targets: Vec<(usize, usize)>,
    /// Boxed: most requests are never redirected, and every request's future holds this.
    pub(crate) next: Option<Box<Request<RequestBody>>>,
}

/// What routing the location needs: the listener's routes and its rules for a request's head.
pub(crate) struct Routing<'a> {
    pub(crate) routes: &'a RouteTable,
    pub(crate) host_rules: head::HostRules,
    pub(crate) head_limit: Option<usize>,
    pub(crate) normalization: &'a config::PathNormalization,
}

/// The request to send on for an upstream answer with `status` and `headers` to a request
/// routed by route `from`, if the policy follows it; `None` leaves the answer for the client.
pub(crate) fn follow(
    policy: &InternalRedirectPolicy,
    kept: Kept,
    (status, response_headers): (http::StatusCode, &http::HeaderMap),
    routing: &Routing<'_>,
    (from, redirects): (usize, &mut Redirects),
) -> Option<Request<RequestBody>> {
    if !policy.redirect_response_codes.contains(&status.as_u16()) {
        return None;
    }
    let location = response_headers.get(LOCATION)?.to_str().ok()?;
    // A fragment is for the client, never sent.
    let location = location.split('#').next().unwrap_or(location);
    let target: Uri = location.parse().ok()?;
    let scheme = target.scheme().cloned()?;
    let target_https = if scheme == Scheme::HTTPS {
        true
    } else if scheme == Scheme::HTTP {
        false
    } else {
        return None;
    };
    let authority: Authority = target.authority().cloned()?;
    if !policy.allow_cross_scheme_redirect && target_https != kept.https {
        return None;
    }
    if policy.safe_cross_scheme && target_https && !kept.https {
        return None;
    }
    let path = target
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let Kept {
        mut method,
        uri,
        version,
        mut headers,
        host,
        https,
    } = kept;
    // The answer's values replace the request's; a header the answer lacks is cleared.
    for name in &policy.response_headers_to_copy {
        headers.remove(name);
        for value in response_headers.get_all(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    let original_url = original_url(https, host.as_ref(), &uri);
    // See RFC 9110, 15.4.4: a 303 is followed with a GET (a HEAD stays one).
    if status == http::StatusCode::SEE_OTHER && method != Method::GET && method != Method::HEAD {
        method = Method::GET;
        headers.remove(http::header::CONTENT_LENGTH);
    }
    let new_uri = if uri.authority().is_some() {
        // HTTP/2 (or an absolute-form request): the authority is the URI's.
        Uri::builder()
            .scheme(scheme)
            .authority(authority.clone())
            .path_and_query(path)
            .build()
            .ok()?
    } else {
        Uri::builder().path_and_query(path).build().ok()?
    };
    // Whatever reads the host sees the location's.
    if new_uri.authority().is_none() || headers.contains_key(HOST) {
        headers.insert(HOST, HeaderValue::from_str(authority.as_str()).ok()?);
    }
    if let Some(url) = original_url {
        headers.insert(X_ENVOY_ORIGINAL_URL.clone(), url);
    }
    let mut next = Request::new(RequestBody::empty());
    *next.method_mut() = method;
    *next.uri_mut() = new_uri;
    *next.version_mut() = version;
    *next.headers_mut() = headers;
    // The location must pass the head's checks and route somewhere, to a route the policy's
    // predicates take.
    let admitted = head::admit(
        &mut next,
        routing.head_limit,
        routing.normalization,
        routing.host_rules,
        routing.routes,
    );
    let Ok(head::Admitted::Routed { matched, .. }) = admitted else {
        return None;
    };
    let to = matched.route?;
    if policy.previous_routes {
        // Per route redirected from, as Envoy keeps it.
        if redirects.targets.contains(&(from, to)) {
            return None;
        }
        redirects.targets.push((from, to));
    }
    Some(next)
}

/// `scheme://host/path` of the request redirected, as Envoy writes `x-envoy-original-url`.
fn original_url(https: bool, host: Option<&HeaderValue>, uri: &Uri) -> Option<HeaderValue> {
    let scheme = if https { "https" } else { "http" };
    let host = host.map(HeaderValue::as_bytes).unwrap_or_default();
    let path = uri.path_and_query().map_or("/", PathAndQuery::as_str);
    HeaderValue::from_bytes(&[scheme.as_bytes(), b"://", host, path.as_bytes()].concat()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RouteTable {
        let config = config::Config::from_yaml(
            "listeners:
  - name: l
    address: 127.0.0.1:0
    routes:
      - { match: { prefix: /a }, cluster: c }
      - { match: { prefix: /b }, cluster: c }
clusters: [{ name: c, endpoints: [127.0.0.1:1] }]
",
        )
        .unwrap();
        RouteTable::new(config.listeners[0].route_config.clone())
    }

    fn policy() -> InternalRedirectPolicy {
        InternalRedirectPolicy {
            max_internal_redirects: 3,
            redirect_response_codes: vec![302],
            allow_cross_scheme_redirect: false,
            previous_routes: false,
            safe_cross_scheme: false,
            response_headers_to_copy: vec![HeaderName::from_static("x-copied")],
        }
    }

    fn kept(https: bool) -> Kept {
        let mut headers = http::HeaderMap::new();
        headers.insert(HOST, HeaderValue::from_static("site.test"));
        headers.insert("x-copied", HeaderValue::from_static("the client's"));
        Kept {
            method: Method::GET,
            uri: Uri::from_static("/a/1"),
            version: http::Version::HTTP_11,
            headers,
            host: Some(HeaderValue::from_static("site.test")),
            https,
        }
    }

    fn answer(location: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(LOCATION, HeaderValue::from_str(location).unwrap());
        headers
    }

    fn follows(
        policy: &InternalRedirectPolicy,
        https: bool,
        location: &str,
        redirects: &mut Redirects,
    ) -> Option<Request<RequestBody>> {
        let headers = answer(location);
        let table = table();
        let routing = Routing {
            routes: &table,
            host_rules: head::HostRules::NONE,
            head_limit: None,
            normalization: &config::PathNormalization::default(),
        };
        // Redirected from route 0 (`/a`).
        follow(
            policy,
            kept(https),
            (http::StatusCode::FOUND, &headers),
            &routing,
            (0, redirects),
        )
    }

    #[test]
    fn a_header_to_copy_the_answer_lacks_is_cleared() {
        let next = follows(
            &policy(),
            false,
            "http://other.test/b/2",
            &mut Redirects::default(),
        )
        .unwrap();
        assert!(next.headers().get("x-copied").is_none());
        assert_eq!(next.headers()[HOST], "other.test");
        assert_eq!(next.uri(), "/b/2");
        assert_eq!(
            next.headers()[&X_ENVOY_ORIGINAL_URL],
            "http://site.test/a/1"
        );
    }

    #[test]
    fn schemes_are_kept_unless_the_policy_allows_another() {
        let mut targets = Redirects::default();
        assert!(follows(&policy(), false, "https://site.test/b", &mut targets).is_none());
        assert!(follows(&policy(), true, "http://site.test/b", &mut targets).is_none());
        let across = InternalRedirectPolicy {
            allow_cross_scheme_redirect: true,
            ..policy()
        };
        assert!(follows(&across, false, "https://site.test/b", &mut targets).is_some());
        assert!(follows(&across, true, "http://site.test/b", &mut targets).is_some());
        // safe_cross_scheme: https may go to http, never http to https.
        let safe = InternalRedirectPolicy {
            safe_cross_scheme: true,
            ..across
        };
        assert!(follows(&safe, false, "https://site.test/b", &mut targets).is_none());
        assert!(follows(&safe, true, "http://site.test/b", &mut targets).is_some());
    }

    #[test]
    fn previous_routes_takes_each_route_once_per_route_redirected_from() {
        let once = InternalRedirectPolicy {
            previous_routes: true,
            ..policy()
        };
        let mut targets = Redirects::default();
        assert!(follows(&once, false, "http://site.test/b", &mut targets).is_some());
        assert!(follows(&once, false, "http://site.test/a", &mut targets).is_some());
        assert!(follows(&once, false, "http://site.test/b/again", &mut targets).is_none());
        assert_eq!(targets.targets, [(0, 1), (0, 0)]);
    }
}
