//! Route table of one listener: first matching route wins, in config order.

use http::HeaderMap;

use crate::config::{HeaderValueMatch, HostMatch, PathMatch, RouteConfig, RouteMatch};

/// An immutable list of routes, built once per listener.
#[derive(Debug, Clone)]
pub struct RouteTable {
    routes: Vec<RouteConfig>,
}

impl RouteTable {
    pub fn new(routes: Vec<RouteConfig>) -> Self {
        Self { routes }
    }

    /// The first route matching the request. `host` is the request's host with or without a
    /// port, in any case; `path` is the path without the query.
    pub fn find(&self, host: &str, path: &str, headers: &HeaderMap) -> Option<&RouteConfig> {
        self.position(host, path, headers).map(|i| &self.routes[i])
    }

    /// The index of the first route matching the request, as [`RouteTable::find`] finds it.
    pub fn position(&self, host: &str, path: &str, headers: &HeaderMap) -> Option<usize> {
        let host = strip_port(host);
        self.routes
            .iter()
            .position(|r| matches(&r.matcher, host, path, headers))
    }

    /// The route at `index`, as [`RouteTable::position`] gives it.
    ///
    /// # Panics
    ///
    /// When `index` is not a position in this table.
    pub fn get(&self, index: usize) -> &RouteConfig {
        &self.routes[index]
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // `[::1]:8080` -> `[::1]`
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rfind(':') {
        Some(colon) => &host[..colon],
        None => host,
    }
}

fn matches(m: &RouteMatch, host: &str, path: &str, headers: &HeaderMap) -> bool {
    let path_ok = match &m.path {
        PathMatch::Prefix(prefix) => path.starts_with(prefix.as_str()),
        PathMatch::Exact(exact) => path == exact,
    };
    if !path_ok {
        return false;
    }
    let host_ok = match &m.host {
        HostMatch::Any => true,
        HostMatch::Exact(name) => host.eq_ignore_ascii_case(name),
        HostMatch::Suffix(suffix) => {
            host.len() > suffix.len()
                && host
                    .get(host.len() - suffix.len()..)
                    .is_some_and(|end| end.eq_ignore_ascii_case(suffix))
        }
    };
    host_ok
        && m.headers.iter().all(|h| match &h.value {
            HeaderValueMatch::Present => headers.contains_key(&h.name),
            HeaderValueMatch::Absent => !headers.contains_key(&h.name),
            HeaderValueMatch::Exact(v) => headers.get_all(&h.name).iter().any(|got| got == v),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use http::HeaderValue;

    fn table() -> RouteTable {
        let config = Config::from_yaml(
            r#"
listeners:
  - name: l
    address: 127.0.0.1:1
    routes:
      - match: { path: /exact }
        direct_response: { status: 200, body: exact }
      - match: { prefix: /api, host: "*.example.com" }
        direct_response: { status: 200, body: wildcard }
      - match: { prefix: /api, host: api.test }
        direct_response: { status: 200, body: host }
      - match: { prefix: /, headers: [{ name: x-canary, exact: "1" }] }
        direct_response: { status: 200, body: canary }
      - match: { prefix: / }
        direct_response: { status: 200, body: fallback }
"#,
        )
        .unwrap();
        RouteTable::new(config.listeners[0].routes.clone())
    }

    fn body_for(table: &RouteTable, host: &str, path: &str, headers: &HeaderMap) -> String {
        match &table.find(host, path, headers).unwrap().action {
            crate::config::RouteAction::DirectResponse { body, .. } => {
                String::from_utf8(body.to_vec()).unwrap()
            }
            other => panic!("unexpected action {other:?}"),
        }
    }

    #[test]
    fn routes_by_path_host_and_header_in_order() {
        let t = table();
        let none = HeaderMap::new();
        assert_eq!(body_for(&t, "x", "/exact", &none), "exact");
        assert_eq!(body_for(&t, "x", "/exact/more", &none), "fallback");
        assert_eq!(
            body_for(&t, "EU.Example.com:8080", "/api/v1", &none),
            "wildcard"
        );
        assert_eq!(body_for(&t, "example.com", "/api", &none), "fallback");
        assert_eq!(body_for(&t, "api.test", "/api", &none), "host");
        let mut canary = HeaderMap::new();
        canary.insert("x-canary", HeaderValue::from_static("1"));
        assert_eq!(body_for(&t, "x", "/other", &canary), "canary");
        canary.insert("x-canary", HeaderValue::from_static("2"));
        assert_eq!(body_for(&t, "x", "/other", &canary), "fallback");
    }

    #[test]
    fn ports_are_ignored_when_matching_hosts() {
        assert_eq!(strip_port("a.test:80"), "a.test");
        assert_eq!(strip_port("a.test"), "a.test");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }
}
