//! The location of a route's redirect, and the path a rewriting route forwards: both replace
//! parts of what the client asked for (Envoy's `RedirectAction`, `prefix_rewrite` and
//! `regex_rewrite`).

use std::borrow::Cow;

use http::header::{HeaderValue, LOCATION};
use http::{Response, Uri};

use super::{ResponseBody, local_reply};
use crate::error::ProxyError;
use config::{PathMatch, PathRewrite, RedirectAction, RedirectPath};

/// The redirect `action` answers a request for `uri` on `host` with. `asked`: the scheme
/// the client used (kept when the action names none).
pub(crate) fn respond(
    action: &RedirectAction,
    matched: &PathMatch,
    host: Option<&HeaderValue>,
    uri: &Uri,
    asked: &'static str,
) -> Result<Response<ResponseBody>, ProxyError> {
    let location = location(action, matched, host, uri, asked)?;
    let mut reply = local_reply::text(action.status, bytes::Bytes::new());
    reply.headers_mut().remove(http::header::CONTENT_TYPE);
    reply.headers_mut().insert(LOCATION, location);
    Ok(reply)
}

fn location(
    action: &RedirectAction,
    matched: &PathMatch,
    host: Option<&HeaderValue>,
    uri: &Uri,
    asked: &'static str,
) -> Result<HeaderValue, ProxyError> {
    let scheme = action.scheme.as_deref().unwrap_or(asked);
    // The request's host was checked to be an authority before routing.
    let (asked_host, asked_port) = match host.and_then(|h| h.to_str().ok()) {
        Some(authority) => split_port(authority),
        None if action.host.is_some() => ("", None),
        None => {
            return Err(ProxyError::BadRequest(
                "a redirect needs the request's host",
            ));
        }
    };
    let name = action.host.as_deref().unwrap_or(asked_host);
    let port = match (action.port, asked_port) {
        (Some(port), _) => Some(port),
        // The request's port was the old host's, not the new one's (as in Envoy).
        (None, _) if action.host.is_some() => None,
        // A port that only said "the default" of the old scheme does not carry over to
        // the new one (`http://a:80` becomes `https://a`), as in Envoy.
        (None, Some(port)) if scheme != asked && port == default_port(asked) => None,
        (None, port) => port,
    };
    let port = port.filter(|&p| p != default_port(scheme));
    let path = uri.path();
    let (path, keep_query) = match &action.path {
        None => (Cow::Borrowed(path), true),
        Some(RedirectPath::Path(new)) => (Cow::Borrowed(new.as_str()), !new.contains('?')),
        Some(RedirectPath::PrefixRewrite(new)) => (replace_matched(matched, path, new), true),
        Some(RedirectPath::RegexRewrite(r)) => (regex_replaced(r, path), true),
    };
    let mut location = String::with_capacity(scheme.len() + name.len() + path.len() + 16);
    location.push_str(scheme);
    location.push_str("://");
    location.push_str(name);
    if let Some(port) = port {
        location.push(':');
        location.push_str(&port.to_string());
    }
    location.push_str(&path);
    if keep_query
        && !action.strip_query
        && let Some(query) = uri.query()
    {
        location.push('?');
        location.push_str(query);
    }
    HeaderValue::try_from(location)
        .map_err(|_| ProxyError::BadRequest("the redirect location is not a valid header"))
}

/// `host` and its port, if it has one (`[::1]:8080`, `a.test:80`, `a.test`).
fn split_port(authority: &str) -> (&str, Option<u16>) {
    match authority.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && !port.contains(']') => match port.parse() {
            Ok(port) => (name, Some(port)),
            Err(_) => (authority, None),
        },
        _ => (authority, None),
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

/// `path` with the part a prefix (or exact path) route matched replaced by `new`.
fn replace_matched<'a>(matched: &PathMatch, path: &'a str, new: &str) -> Cow<'a, str> {
    let len = match matched {
        PathMatch::Prefix(prefix) | PathMatch::SeparatedPrefix(prefix) => prefix.len(),
        PathMatch::Exact(_) => path.len(),
        // Validation allows a prefix rewrite only on prefix and path routes.
        PathMatch::Regex(_) | PathMatch::Connect => 0,
    };
    let rest = path.get(len..).unwrap_or("");
    let mut out = String::with_capacity(new.len() + rest.len() + 1);
    out.push_str(new);
    out.push_str(rest);
    if !out.starts_with('/') {
        // An origin-form target starts with `/`.
        out.insert(0, '/');
    }
    Cow::Owned(out)
}

/// The path and query a rewriting route sends upstream: only the path changes.
/// `path` with every match of the rewrite's pattern replaced; a result without a leading
/// `/` gets one.
fn regex_replaced<'a>(r: &config::RegexRewrite, path: &'a str) -> Cow<'a, str> {
    let mut out = r.pattern.replace_all(path, r.replacement.as_str());
    if !out.starts_with('/') {
        out = Cow::Owned(format!("/{out}"));
    }
    out
}

pub(crate) fn rewrite_path(
    rewrite: &PathRewrite,
    matched: &PathMatch,
    uri: &Uri,
) -> Result<http::uri::PathAndQuery, ProxyError> {
    let path = uri.path();
    let new = match rewrite {
        PathRewrite::PrefixRewrite(new) => replace_matched(matched, path, new),
        PathRewrite::RegexRewrite(r) => regex_replaced(r, path),
    };
    let target = match uri.query() {
        Some(query) => format!("{new}?{query}"),
        None => new.into_owned(),
    };
    target
        .parse()
        .map_err(|_| ProxyError::BadRequest("the rewritten path is not a valid path"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn action(yaml: &str) -> RedirectAction {
        let config = config::Config::from_yaml(&format!(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - {{ match: {{ prefix: /old }}, {yaml} }}\n"
        ))
        .unwrap();
        match &config.listeners[0].route_config.routes[0].action {
            config::RouteAction::Redirect(r) => r.clone(),
            other => panic!("{other:?}"),
        }
    }

    fn location_of(yaml: &str, host: &str, target: &str, tls: bool) -> String {
        let uri: Uri = target.parse().unwrap();
        let host = HeaderValue::from_str(host).unwrap();
        let matched = PathMatch::Prefix("/old".into());
        let asked = if tls { "https" } else { "http" };
        let reply = respond(&action(yaml), &matched, Some(&host), &uri, asked).unwrap();
        reply.headers()[LOCATION].to_str().unwrap().to_string()
    }

    /// Envoy Gateway's redirect with a regex rewrite: the path's every match replaced, the
    /// query kept.
    #[test]
    fn a_regex_rewrite_redirects_to_the_substituted_path() {
        let l = location_of;
        let yaml =
            "redirect: { regex_rewrite: { pattern: '^/old/+', substitution: / }, status: 302 }";
        assert_eq!(
            l(yaml, "a.test", "/old//x?q=1", false),
            "http://a.test/x?q=1"
        );
        let groups = "redirect: { regex_rewrite: { pattern: '^/old/([a-z]+)/(.*)$', substitution: '/\\2/\\1' } }";
        assert_eq!(
            l(groups, "a.test", "/old/ab/cd", false),
            "http://a.test/cd/ab"
        );
        let config = config::Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - { match: { prefix: /old }, redirect: { path: /a, regex_rewrite: { pattern: x, substitution: y } } }\n",
        );
        let error = config.unwrap_err().to_string();
        assert!(error.contains("expected one of `path`"), "{error}");
    }

    #[test]
    fn each_part_of_a_redirect() {
        let l = location_of;
        assert_eq!(
            l("https_redirect: true", "a.test", "/old/x?q=1", false),
            "https://a.test/old/x?q=1"
        );
        assert_eq!(
            l("https_redirect: true", "a.test:80", "/old", false),
            "https://a.test/old"
        );
        assert_eq!(
            l("https_redirect: true", "a.test:8080", "/old", false),
            "https://a.test:8080/old"
        );
        assert_eq!(
            l("redirect: { host: b.test }", "a.test:8443", "/old", true),
            "https://b.test/old"
        );
        assert_eq!(
            l(
                "redirect: { host: b.test, port: 8443 }",
                "a.test",
                "/old",
                true
            ),
            "https://b.test:8443/old"
        );
        assert_eq!(
            l(
                "redirect: { port: 8443, scheme: https }",
                "[::1]:80",
                "/old",
                false
            ),
            "https://[::1]:8443/old"
        );
        assert_eq!(
            l(
                "redirect: { path: /new, strip_query: false }",
                "a.test",
                "/old/x?q=1",
                false
            ),
            "http://a.test/new?q=1"
        );
        assert_eq!(
            l(
                "redirect: { prefix_rewrite: /v2, strip_query: true }",
                "a.test",
                "/old/x?q=1",
                false
            ),
            "http://a.test/v2/x"
        );
        assert_eq!(
            l(
                "redirect: { prefix_rewrite: \"\" }",
                "a.test",
                "/old",
                false
            ),
            "http://a.test/"
        );
    }

    #[test]
    fn statuses_and_refusals() {
        assert_eq!(
            action("https_redirect: true").status,
            StatusCode::MOVED_PERMANENTLY
        );
        assert_eq!(action("redirect: { status: 308 }").status.as_u16(), 308);
        for (yaml, expected) in [
            (
                "redirect: { status: 200 }",
                "expected 301, 302, 303, 307 or 308",
            ),
            ("redirect: { scheme: ftp }", "expected `http` or `https`"),
            ("redirect: { host: \"a.test:80\" }", "without a port"),
            ("redirect: { path: x }", "starting with `/`"),
            (
                "redirect: { path: /a, prefix_rewrite: /b }",
                "expected one of `path`",
            ),
            (
                "redirect: {}, cluster: c",
                "`cluster` or `redirect`, not both",
            ),
        ] {
            let err = config::Config::from_yaml(&format!(
                "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - {{ match: {{ prefix: /old }}, {yaml} }}\nclusters: [{{ name: c, endpoints: [127.0.0.1:2] }}]\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }

    #[test]
    fn rewrites_change_the_path_and_keep_the_query() {
        let uri: Uri = "/api/users/42?x=1".parse().unwrap();
        let prefix = PathMatch::Prefix("/api".into());
        let by_prefix = PathRewrite::PrefixRewrite("/v2".into());
        assert_eq!(
            rewrite_path(&by_prefix, &prefix, &uri).unwrap().as_str(),
            "/v2/users/42?x=1"
        );
        let to_root = PathRewrite::PrefixRewrite(String::new());
        assert_eq!(
            rewrite_path(&to_root, &prefix, &"/api".parse().unwrap())
                .unwrap()
                .as_str(),
            "/"
        );
        let regex = PathRewrite::RegexRewrite(config::RegexRewrite {
            pattern: regex::Regex::new("^/api/users/([0-9]+)$").unwrap(),
            substitution: "/people/\\1".into(),
            replacement: "/people/${1}".into(),
        });
        assert_eq!(
            rewrite_path(&regex, &prefix, &uri).unwrap().as_str(),
            "/people/42?x=1"
        );
    }
}
