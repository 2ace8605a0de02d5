//! Route table of one listener: first matching route wins, in config order.
//!
//! ```text
//! mod.rs     the table, and what "a route matches" means
//! index.rs   the lookup: hosts by hash, paths by radix tree, the same answer as a scan
//! ```

mod index;

use std::sync::Arc;

use http::HeaderMap;

use crate::config::{HeaderValueMatch, HostMatch, PathMatch, RouteConfig, RouteMatch};
use index::RouteIndex;

/// An immutable list of routes and its lookup, built once per listener.
#[derive(Clone)]
pub struct RouteTable {
    routes: Vec<RouteConfig>,
    index: Arc<RouteIndex>,
}

impl std::fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTable")
            .field("routes", &self.routes)
            .finish_non_exhaustive()
    }
}

impl RouteTable {
    pub fn new(routes: Vec<RouteConfig>) -> Self {
        let index = Arc::new(RouteIndex::new(&routes));
        Self { routes, index }
    }

    /// The first route matching the request. `host` is the request's host with or without a
    /// port, in any case; `path` is the path without the query.
    pub fn find(&self, host: &str, path: &str, headers: &HeaderMap) -> Option<&RouteConfig> {
        self.position(host, path, headers).map(|i| &self.routes[i])
    }

    /// The index of the first route matching the request, as [`RouteTable::find`] finds it.
    pub fn position(&self, host: &str, path: &str, headers: &HeaderMap) -> Option<usize> {
        self.index
            .position(strip_port(host), path, headers, &self.routes)
    }

    /// [`RouteTable::position`] by trying every route in order: what the index must agree
    /// with, and the baseline it is measured against.
    pub fn position_by_scan(&self, host: &str, path: &str, headers: &HeaderMap) -> Option<usize> {
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
    host_ok && headers_match(m, headers)
}

fn headers_match(m: &RouteMatch, headers: &HeaderMap) -> bool {
    m.headers.iter().all(|h| match &h.value {
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

    mod differential {
        use super::*;
        use proptest::prelude::*;

        const HOSTS: &[&str] = &[
            "*",
            "a.test",
            "b.a.test",
            "x",
            "*.test",
            "*.a.test",
            "*.b.a.test",
            "A.Test",
        ];
        const PATHS: &[&str] = &["/", "/a", "/ab", "/abc", "/a/b", "/b", "/ba", "/abd"];
        const HEADERS: &[&str] = &[
            "",
            ", headers: [{ name: x-h, exact: \"1\" }]",
            ", headers: [{ name: x-h, present: true }]",
            ", headers: [{ name: x-h, present: false }]",
        ];

        fn route() -> impl Strategy<Value = String> {
            (
                0..HOSTS.len(),
                any::<bool>(),
                0..PATHS.len(),
                0..HEADERS.len(),
            )
                .prop_map(|(h, exact, p, hd)| {
                    let kind = if exact { "path" } else { "prefix" };
                    format!(
                        "      - match: {{ {kind}: \"{}\", host: \"{}\"{} }}\n        direct_response: {{ status: 200 }}\n",
                        PATHS[p], HOSTS[h], HEADERS[hd]
                    )
                })
        }

        fn request() -> impl Strategy<Value = (String, String, Option<&'static str>)> {
            (
                prop::sample::select(vec![
                    "a.test",
                    "A.TEST:8080",
                    "b.a.test",
                    "c.b.a.test",
                    "x",
                    "x.test",
                    "test",
                    ".test",
                    "y",
                    "[::1]:80",
                ]),
                prop::sample::select(vec![
                    "/", "/a", "/ab", "/abc", "/abcd", "/a/b", "/a/bc", "/b", "/ba", "/abd", "/c",
                    "",
                ]),
                prop::sample::select(vec![None, Some("1"), Some("2")]),
            )
                .prop_map(|(h, p, v)| (h.to_string(), p.to_string(), v))
        }

        proptest! {
            #[test]
            fn the_index_finds_what_a_scan_finds(
                routes in prop::collection::vec(route(), 1..40),
                requests in prop::collection::vec(request(), 1..40),
            ) {
                let yaml = format!(
                    "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n{}",
                    routes.concat()
                );
                let config = Config::from_yaml(&yaml).expect("generated routes are valid");
                let table = RouteTable::new(config.listeners[0].routes.clone());
                for (host, path, value) in requests {
                    let mut headers = HeaderMap::new();
                    if let Some(v) = value {
                        headers.insert("x-h", HeaderValue::from_static(v));
                    }
                    prop_assert_eq!(
                        table.position(&host, &path, &headers),
                        table.position_by_scan(&host, &path, &headers),
                        "host {} path {} x-h {:?}", host, path, value
                    );
                }
            }
        }
    }

    #[test]
    fn ports_are_ignored_when_matching_hosts() {
        assert_eq!(strip_port("a.test:80"), "a.test");
        assert_eq!(strip_port("a.test"), "a.test");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }
}
