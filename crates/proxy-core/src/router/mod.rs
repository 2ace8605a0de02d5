//! Route table of one listener: the virtual host the request's host picks, then the first of
//! its routes that matches, in config order.
//!
//! ```text
//! mod.rs           the table, and what "a route matches" means
//! hosts.rs         the virtual host for a host: exact domains, then wildcards, by hash
//! index.rs         a host's routes: by host and path, hashes and a radix tree; a scan's answer
//! prefix_tree.rs   the radix tree of path prefixes, in flat arrays
//! ```

mod hosts;
mod index;
mod prefix_tree;

use std::sync::Arc;

use http::HeaderMap;
use percent_encoding::percent_decode;

use config::{HostMatch, PathMatch, RouteConfig, RouteConfiguration, RouteMatch};
use hosts::HostIndex;
use index::RouteIndex;

/// What the table found for a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Matched {
    /// The index of the virtual host the request's host picked; `None` when none did.
    pub virtual_host: Option<usize>,
    /// The index of the route, in [`RouteConfiguration::routes`]; `None` when none matched.
    pub route: Option<usize>,
    /// The cluster drawn from the route's `weighted_clusters` (its place in the list), drawn
    /// once the route is known, before the filters (as Envoy): the `headers` filter applies
    /// its rules, and the request goes there.
    pub weighted: Option<usize>,
    /// The cluster the request's header names, for a route (or a drawn side of its split)
    /// with a `cluster_header`, read with the route as Envoy does; `None` when it names none
    /// there is (or the route has none).
    pub named_cluster: Option<usize>,
}

/// An immutable route configuration and its lookup, built once per listener and config
/// version and shared by the workers.
pub struct RouteTable {
    config: RouteConfiguration,
    /// Shared with the table before when what routes are looked up by did not change.
    hosts: Arc<HostIndex>,
    /// Per virtual host; shared as `hosts`.
    indexes: Arc<[RouteIndex]>,
}

impl std::fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteTable")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RouteTable {
    pub fn new(config: RouteConfiguration) -> Self {
        Self::after(config, None)
    }

    /// The table of `config`, sharing the lookup of `before` when every virtual host and
    /// route is where it was and is looked up by the same domains, host, path and case: a
    /// change to what routes do (a cluster, a weight, a timeout) builds no index.
    pub fn after(config: RouteConfiguration, before: Option<&RouteTable>) -> Self {
        if let Some(before) = before.filter(|b| same_lookup(&b.config, &config)) {
            return Self {
                config,
                hosts: Arc::clone(&before.hosts),
                indexes: Arc::clone(&before.indexes),
            };
        }
        let hosts = Arc::new(HostIndex::new(&config.virtual_hosts));
        let indexes = config
            .virtual_hosts
            .iter()
            .map(|host| RouteIndex::new(&config.routes, host.routes.clone()))
            .collect();
        Self {
            config,
            hosts,
            indexes,
        }
    }

    /// The virtual host and route for a request. `host` is the request's host with or
    /// without a port, in any case; `path` is the path without the query.
    pub fn find(
        &self,
        host: &str,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Matched {
        let raw_host = host;
        let host = lowercase(host);
        let host = host.as_ref();
        let bare = strip_port(host);
        let host = if self.config.ignore_port_in_host_matching {
            bare
        } else {
            host
        };
        let Some(virtual_host) = self.hosts.find(host, bare) else {
            return Matched::default();
        };
        let request = Request {
            authority: raw_host,
            path,
            query,
            headers,
        };
        let route = self.indexes[virtual_host].position(bare, &request, &self.config.routes);
        Matched {
            virtual_host: Some(virtual_host),
            route,
            weighted: None,
            named_cluster: None,
        }
    }

    /// [`RouteTable::find`] by trying every domain and then every route of the host in
    /// order: what the index must agree with, and the baseline it is measured against.
    pub fn find_by_scan(
        &self,
        host: &str,
        path: &str,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Matched {
        let raw_host = host;
        let host = lowercase(host);
        let host = if self.config.ignore_port_in_host_matching {
            strip_port(&host)
        } else {
            &host
        };
        let Some(virtual_host) = hosts::find_by_scan(&self.config.virtual_hosts, host) else {
            return Matched::default();
        };
        let span = self.config.virtual_hosts[virtual_host].routes.clone();
        let bare = strip_port(host);
        let request = Request {
            authority: raw_host,
            path,
            query,
            headers,
        };
        let route = self.config.routes[span.clone()]
            .iter()
            .position(|r| matches(&r.matcher, bare, &request))
            .map(|i| span.start + i);
        Matched {
            virtual_host: Some(virtual_host),
            route,
            weighted: None,
            named_cluster: None,
        }
    }

    /// The route at `index`, as [`RouteTable::find`] gives it.
    ///
    /// # Panics
    ///
    /// When `index` is not a route of this table.
    pub fn route(&self, index: usize) -> &RouteConfig {
        &self.config.routes[index]
    }

    pub fn config(&self) -> &RouteConfiguration {
        &self.config
    }
}

/// `host` (or a path) in lowercase, copied only when it has capitals.
fn lowercase(host: &str) -> std::borrow::Cow<'_, str> {
    let mut rest = host.as_bytes();
    let mut upper = false;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        upper |= has_capital(u64::from_le_bytes(*word));
        rest = tail;
    }
    upper |= rest.iter().any(u8::is_ascii_uppercase);
    if upper {
        host.to_ascii_lowercase().into()
    } else {
        host.into()
    }
}

/// Whether one of the eight bytes of `word` is `A`..=`Z`: their low seven bits plus 0x3f
/// reach 0x80 from `A` on, plus 0x25 from past `Z` on, and no sum carries into the next byte.
fn has_capital(word: u64) -> bool {
    const LOW: u64 = u64::from_le_bytes([0x7f; 8]);
    const HIGH: u64 = !LOW;
    let low = word & LOW;
    let from_a = low + u64::from_le_bytes([0x80 - b'A'; 8]);
    let past_z = low + u64::from_le_bytes([0x80 - b'Z' - 1; 8]);
    from_a & !past_z & !word & HIGH != 0
}

/// `host` without a trailing `:PORT` (`[::1]:8080` -> `[::1]`). A scan back over the digits:
/// most hosts end in a letter and cost one comparison.
fn strip_port(host: &str) -> &str {
    let bytes = host.as_bytes();
    let mut end = bytes.len();
    while end > 0 && bytes[end - 1].is_ascii_digit() {
        end -= 1;
    }
    match end.checked_sub(1) {
        Some(colon) if bytes[colon] == b':' => &host[..colon],
        _ => host,
    }
}

/// What routes look at besides the host.
pub(crate) struct Request<'a> {
    /// The host as the client sent it (`:authority`); empty when none.
    pub(crate) authority: &'a str,
    /// Without the query.
    pub(crate) path: &'a str,
    pub(crate) query: Option<&'a str>,
    pub(crate) headers: &'a HeaderMap,
}

/// Whether route `m` takes the request; `host` is lowercase, without its port.
fn matches(m: &RouteMatch, host: &str, request: &Request<'_>) -> bool {
    let path = request.path;
    let path_ok = match (&m.path, m.case_sensitive) {
        (PathMatch::Prefix(prefix) | PathMatch::SeparatedPrefix(prefix), true) => {
            path.starts_with(prefix.as_str())
        }
        (PathMatch::Exact(exact), true) => path == exact,
        // Stored lowercase.
        (PathMatch::Prefix(prefix) | PathMatch::SeparatedPrefix(prefix), false) => path
            .as_bytes()
            .get(..prefix.len())
            .is_some_and(|start| start.eq_ignore_ascii_case(prefix.as_bytes())),
        (PathMatch::Exact(exact), false) => path.eq_ignore_ascii_case(exact),
        // Checked with the other conditions.
        (PathMatch::Regex(_), _) => true,
        // A CONNECT request, and only one, has no path.
        (PathMatch::Connect, _) => path.is_empty(),
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
    host_ok && conditions_match(m, request)
}

/// What the index cannot decide by hashing: a regex path, headers, query parameters.
fn conditions_match(m: &RouteMatch, request: &Request<'_>) -> bool {
    if !m.has_conditions() {
        return true;
    }
    if let PathMatch::Regex(pattern) = &m.path
        && !pattern.is_match(request.path.as_bytes())
    {
        return false;
    }
    if matches!(m.path, PathMatch::Connect) && !request.path.is_empty() {
        return false;
    }
    // The prefix itself matched (by the index or by `matches`): the path ends there or goes
    // on with a `/`.
    if let PathMatch::SeparatedPrefix(prefix) = &m.path
        && !matches!(request.path.as_bytes().get(prefix.len()), None | Some(b'/'))
    {
        return false;
    }
    let headers = request.headers;
    let authority = Some(request.authority.as_bytes()).filter(|a| !a.is_empty());
    let headers_ok = m.headers.iter().all(|h| h.matches(headers))
        && m.authority.iter().all(|a| a.matches_value(authority))
        && m.cookies.iter().all(|c| c.matches(headers));
    headers_ok
        && m.query_parameters.iter().all(|q| {
            match query_value(request.query.unwrap_or(""), &q.name) {
                None => false,
                Some(value) => q.value.as_ref().is_none_or(|v| v.matches(&value)),
            }
        })
}

/// The first value of parameter `name` in `query`, percent-decoded (`a=1&b` gives `b` the
/// empty value); `None` when it is absent.
pub(crate) fn query_value<'a>(query: &'a str, name: &str) -> Option<std::borrow::Cow<'a, [u8]>> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key: std::borrow::Cow<'_, [u8]> = percent_decode(key.as_bytes()).into();
        (!pair.is_empty() && key.as_ref() == name.as_bytes())
            .then(|| percent_decode(value.as_bytes()).into())
    })
}

/// Whether two route configurations are looked up alike: what [`HostIndex`] and
/// [`RouteIndex`] are built from is the same in both.
fn same_lookup(a: &RouteConfiguration, b: &RouteConfiguration) -> bool {
    let host = |(a, b): (&config::VirtualHostConfig, &config::VirtualHostConfig)| {
        a.domains == b.domains && a.routes == b.routes
    };
    let route = |(a, b): (&Arc<config::RouteConfig>, &Arc<config::RouteConfig>)| {
        Arc::ptr_eq(a, b)
            || (a.matcher.host == b.matcher.host
                && a.matcher.path == b.matcher.path
                && a.matcher.case_sensitive == b.matcher.case_sensitive)
    };
    a.virtual_hosts.len() == b.virtual_hosts.len()
        && a.routes.len() == b.routes.len()
        && a.virtual_hosts.iter().zip(&b.virtual_hosts).all(host)
        && a.routes.iter().zip(b.routes.iter()).all(route)
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::Config;
    use http::HeaderValue;

    #[test]
    fn a_word_has_a_capital_exactly_when_one_of_its_bytes_is_one() {
        // Every pair of byte values, side by side at every position, among fillers that sit
        // just outside and inside the range: no byte's sum disturbs its neighbour's.
        for filler in [0x00, b'@', b'[', 0x7f, 0x80, 0xc1, 0xff, b'a'] {
            for a in 0..=255u8 {
                for b in 0..=255u8 {
                    for at in 0..7 {
                        let mut word = [filler; 8];
                        word[at] = a;
                        word[at + 1] = b;
                        let expected = word.iter().any(u8::is_ascii_uppercase);
                        assert_eq!(has_capital(u64::from_le_bytes(word)), expected, "{word:?}");
                    }
                }
            }
        }
        assert_eq!(lowercase("Api.Example.COM:8080"), "api.example.com:8080");
        assert!(matches!(
            lowercase("api.example.com"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(lowercase("api.example.coM"), "api.example.com");
    }

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
        RouteTable::new(config.listeners[0].route_config.clone())
    }

    fn body_for(table: &RouteTable, host: &str, path: &str, headers: &HeaderMap) -> String {
        let matched = table.find(host, path, None, headers);
        match &table.route(matched.route.expect("a route")).action {
            config::RouteAction::DirectResponse { body, .. } => {
                String::from_utf8(body.to_vec()).unwrap()
            }
            other => panic!("unexpected action {other:?}"),
        }
    }

    #[test]
    fn a_table_changed_in_what_routes_do_shares_the_lookup_and_answers_anew() {
        let routes = |api: &str, body: &str| {
            let yaml = format!(
                "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - match: {{ prefix: {api} }}\n        direct_response: {{ status: 200, body: api }}\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200, body: {body} }}\n"
            );
            let config = Config::from_yaml(&yaml).unwrap();
            config.listeners[0].route_config.clone()
        };
        let none = HeaderMap::new();
        let first = RouteTable::new(routes("/api", "one"));
        // Another answer, the same matches: the lookup is shared and finds the new route.
        let answer = RouteTable::after(routes("/api", "two"), Some(&first));
        assert!(Arc::ptr_eq(&answer.indexes, &first.indexes));
        assert!(Arc::ptr_eq(&answer.hosts, &first.hosts));
        assert_eq!(body_for(&answer, "h", "/", &none), "two");
        assert_eq!(body_for(&answer, "h", "/api/x", &none), "api");
        // Another prefix: the lookup is built again, and routes by it.
        let moved = RouteTable::after(routes("/v2", "two"), Some(&answer));
        assert!(!Arc::ptr_eq(&moved.indexes, &answer.indexes));
        assert_eq!(body_for(&moved, "h", "/api/x", &none), "two");
        assert_eq!(body_for(&moved, "h", "/v2/x", &none), "api");
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

    /// The name of the virtual host `host` picks.
    fn host_for(table: &RouteTable, host: &str) -> Option<String> {
        let matched = table.find(host, "/", None, &HeaderMap::new());
        matched
            .virtual_host
            .map(|i| table.config().virtual_hosts[i].name.clone())
    }

    #[test]
    fn virtual_hosts_are_picked_in_envoys_domain_order() {
        let config = Config::from_yaml(
            r#"
listeners:
  - name: l
    address: 127.0.0.1:1
    virtual_hosts:
      - { name: any, domains: ["*"], routes: [{ match: { prefix: / }, direct_response: { status: 200 } }] }
      - { name: exact, domains: [api.example.com] }
      - { name: exact-port, domains: ["api.example.com:8443"] }
      - { name: short-suffix, domains: ["*.com"] }
      - { name: long-suffix, domains: ["*.example.com"] }
      - { name: dash-suffix, domains: ["*-eu.example.com"] }
      - { name: prefix, domains: ["api.*"] }
      - { name: long-prefix, domains: ["api.example.*"] }
"#,
        )
        .unwrap();
        let t = RouteTable::new(config.listeners[0].route_config.clone());
        let picks = |host: &str| host_for(&t, host);
        // Exact first, case and (unnamed) port ignored.
        assert_eq!(picks("api.example.com").as_deref(), Some("exact"));
        assert_eq!(picks("API.Example.com:80").as_deref(), Some("exact"));
        // A domain that names a port takes only that port.
        assert_eq!(picks("api.example.com:8443").as_deref(), Some("exact-port"));
        // The longest suffix, then the longest prefix; `*` stands for at least one byte.
        assert_eq!(picks("www.example.com").as_deref(), Some("long-suffix"));
        assert_eq!(picks("shop-eu.example.com").as_deref(), Some("dash-suffix"));
        assert_eq!(picks("-eu.example.com").as_deref(), Some("long-suffix"));
        assert_eq!(picks("example.com").as_deref(), Some("short-suffix"));
        assert_eq!(picks("api.example.org").as_deref(), Some("long-prefix"));
        assert_eq!(picks("api.test:8080").as_deref(), Some("prefix"));
        assert_eq!(picks("other.org").as_deref(), Some("any"));
        // A virtual host without a matching route is the answer: no falling through to `*`.
        let matched = t.find("api.example.com", "/", None, &HeaderMap::new());
        assert_eq!(matched.virtual_host, Some(1));
        assert_eq!(matched.route, None);
        let matched = t.find("elsewhere", "/x", None, &HeaderMap::new());
        assert_eq!(matched.route, Some(0));
    }

    #[test]
    fn a_path_separated_prefix_takes_its_path_and_what_is_below_it() {
        let config = Config::from_yaml(
            r#"
listeners:
  - name: l
    address: 127.0.0.1:1
    routes:
      - match: { path_separated_prefix: /api }
        direct_response: { status: 200, body: api }
      - match: { path_separated_prefix: /Docs, case_sensitive: false }
        direct_response: { status: 200, body: docs }
      - match: { prefix: / }
        direct_response: { status: 404 }
"#,
        )
        .unwrap();
        let t = RouteTable::new(config.listeners[0].route_config.clone());
        for (path, route) in [
            ("/api", 0),
            ("/api/", 0),
            ("/api/v1/x", 0),
            ("/apis", 2),
            ("/ap", 2),
            ("/docs/a", 1),
            ("/DOCS", 1),
            ("/docsx", 2),
        ] {
            let by_index = t.find("h", path, None, &HeaderMap::new()).route;
            let by_scan = t.find_by_scan("h", path, None, &HeaderMap::new()).route;
            assert_eq!(by_index, Some(route), "{path}");
            assert_eq!(by_scan, Some(route), "{path}");
        }
        let ends_in_slash = Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes: [{ match: { path_separated_prefix: /api/ }, direct_response: { status: 200 } }]\n",
        );
        assert!(
            ends_in_slash
                .unwrap_err()
                .to_string()
                .contains("not ending in `/`")
        );
    }

    #[test]
    fn ignore_port_in_host_matching_matches_the_host_without_its_port() {
        let yaml = |ignore: bool| {
            format!(
                r#"
listeners:
  - name: l
    address: 127.0.0.1:1
    ignore_port_in_host_matching: {ignore}
    virtual_hosts:
      - {{ name: any, domains: ["*"], routes: [{{ match: {{ prefix: / }}, direct_response: {{ status: 200 }} }}] }}
      - {{ name: exact, domains: [api.example.com] }}
      - {{ name: exact-port, domains: ["api.example.com:8443"] }}
"#
            )
        };
        for ignore in [false, true] {
            let config = Config::from_yaml(&yaml(ignore)).unwrap();
            let t = RouteTable::new(config.listeners[0].route_config.clone());
            let ported = if ignore { "exact" } else { "exact-port" };
            assert_eq!(
                host_for(&t, "api.example.com:8443").as_deref(),
                Some(ported)
            );
            assert_eq!(host_for(&t, "api.example.com:80").as_deref(), Some("exact"));
            assert_eq!(
                t.find_by_scan("api.example.com:8443", "/", None, &HeaderMap::new())
                    .virtual_host,
                t.find("api.example.com:8443", "/", None, &HeaderMap::new())
                    .virtual_host,
            );
        }
    }

    #[test]
    fn without_a_catch_all_an_unknown_host_finds_nothing() {
        let config = Config::from_yaml(
            r#"
listeners:
  - name: l
    address: 127.0.0.1:1
    virtual_hosts:
      - { name: a, domains: [a.test], routes: [{ match: { prefix: / }, direct_response: { status: 200 } }] }
"#,
        )
        .unwrap();
        let t = RouteTable::new(config.listeners[0].route_config.clone());
        assert_eq!(
            t.find("b.test", "/", None, &HeaderMap::new()),
            Matched::default()
        );
        assert_eq!(
            t.find("a.test", "/", None, &HeaderMap::new()).route,
            Some(0)
        );
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
        const PATHS: &[&str] = &[
            "/", "/a", "/ab", "/abc", "/a/b", "/b", "/ba", "/abd", "/A", "/aB",
        ];
        const CASE: &[&str] = &["", ", case_sensitive: false", ", case_sensitive: true"];
        const HEADERS: &[&str] = &[
            "",
            ", headers: [{ name: x-h, exact: \"1\" }]",
            ", headers: [{ name: x-h, present: true }]",
            ", headers: [{ name: x-h, present: false }]",
            ", headers: [{ name: x-h, regex: \"[12]\" }]",
            ", query_parameters: [{ name: q, exact: \"1\" }]",
            ", query_parameters: [{ name: q }]",
        ];
        /// Regex paths, standing in for `prefix` or `path` now and then.
        const REGEXES: &[&str] = &["/a.*", "/[ab]", "/a/.+", ".*c"];

        fn route() -> impl Strategy<Value = String> {
            (
                0..HOSTS.len(),
                0..3u8,
                0..PATHS.len(),
                0..HEADERS.len(),
                0..CASE.len(),
            )
                .prop_map(|(h, kind, p, hd, c)| {
                    let (kind, path) = match kind {
                        0 => ("path", PATHS[p]),
                        1 => ("prefix", PATHS[p]),
                        _ => ("regex", REGEXES[p % REGEXES.len()]),
                    };
                    format!(
                        "      - match: {{ {kind}: \"{path}\", host: \"{}\"{}{} }}\n        direct_response: {{ status: 200 }}\n",
                        HOSTS[h], HEADERS[hd], CASE[c]
                    )
                })
        }

        type Generated = (String, String, Option<&'static str>, Option<&'static str>);

        fn request() -> impl Strategy<Value = Generated> {
            (
                prop::sample::select(vec![
                    "a.test",
                    "A.TEST:8080",
                    "a.test:8080",
                    "a.test:80",
                    "x:80",
                    "x:8080",
                    "a.tx",
                    "a.",
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
                    "", "/A", "/AB", "/aB", "/A/b", "/Abc", "/ABD",
                ]),
                prop::sample::select(vec![None, Some("1"), Some("2")]),
                prop::sample::select(vec![
                    None,
                    Some("q=1"),
                    Some("a=2&q"),
                    Some("q=2"),
                    Some("%71=1"),
                ]),
            )
                .prop_map(|(h, p, v, q)| (h.to_string(), p.to_string(), v, q))
        }

        /// Domains virtual hosts are given from: overlapping exact, suffix, prefix and port
        /// forms of the hosts requests use.
        const DOMAINS: &[&str] = &[
            "*",
            "a.test",
            "a.test:8080",
            "b.a.test",
            "*.test",
            "*.a.test",
            "*a.test",
            "*.test:8080",
            "*t",
            "a.*",
            "a.t*",
            "b.*",
            "x",
            "x:80",
            "[::1]",
            "*:80",
        ];

        fn table_of(yaml_routes: &str) -> RouteTable {
            let yaml = format!("listeners:\n  - name: l\n    address: 127.0.0.1:1\n{yaml_routes}");
            let config = Config::from_yaml(&yaml)
                .unwrap_or_else(|e| panic!("generated routes are valid: {e}\n{yaml}"));
            RouteTable::new(config.listeners[0].route_config.clone())
        }

        fn agrees_with_scan(
            table: &RouteTable,
            requests: Vec<Generated>,
        ) -> Result<(), TestCaseError> {
            for (host, path, value, query) in requests {
                let mut headers = HeaderMap::new();
                if let Some(v) = value {
                    headers.insert("x-h", HeaderValue::from_static(v));
                }
                prop_assert_eq!(
                    table.find(&host, &path, query, &headers),
                    table.find_by_scan(&host, &path, query, &headers),
                    "host {} path {} x-h {:?} query {:?}",
                    host,
                    path,
                    value,
                    query
                );
            }
            Ok(())
        }

        /// Virtual hosts over a shuffled share of [`DOMAINS`] (no domain twice), each with
        /// a few routes.
        fn virtual_hosts() -> impl Strategy<Value = String> {
            (
                Just(DOMAINS.to_vec()).prop_shuffle(),
                prop::collection::vec((1..4usize, prop::collection::vec(route(), 0..6)), 1..6),
            )
                .prop_map(|(domains, hosts)| {
                    let mut yaml = String::from("    virtual_hosts:\n");
                    let mut left = domains.as_slice();
                    for (i, (count, routes)) in hosts.into_iter().enumerate() {
                        let (mine, rest) = left.split_at(count.min(left.len()));
                        left = rest;
                        if mine.is_empty() {
                            break;
                        }
                        let list: Vec<String> = mine.iter().map(|d| format!("\"{d}\"")).collect();
                        yaml += &format!(
                            "      - name: h{i}\n        domains: [{}]\n        routes:\n",
                            list.join(", ")
                        );
                        for r in routes {
                            // Route items, two more spaces in.
                            for line in r.lines() {
                                yaml += &format!("    {line}\n");
                            }
                        }
                        if yaml.ends_with("routes:\n") {
                            yaml.truncate(yaml.len() - "        routes:\n".len());
                        }
                    }
                    yaml
                })
        }

        proptest! {
            #[test]
            fn the_index_finds_what_a_scan_finds(
                routes in prop::collection::vec(route(), 1..40),
                requests in prop::collection::vec(request(), 1..40),
            ) {
                let table = table_of(&format!("    routes:\n{}", routes.concat()));
                agrees_with_scan(&table, requests)?;
            }

            #[test]
            fn virtual_hosts_are_found_as_a_scan_finds_them(
                hosts in virtual_hosts(),
                requests in prop::collection::vec(request(), 1..40),
            ) {
                agrees_with_scan(&table_of(&hosts), requests)?;
            }
        }
    }

    #[test]
    fn a_route_may_match_the_path_in_any_case() {
        let yaml = "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - match: { prefix: /Private, case_sensitive: false }\n        direct_response: { status: 403 }\n      - match: { path: /Exact, case_sensitive: false }\n        direct_response: { status: 200 }\n      - match: { prefix: /Cased }\n        direct_response: { status: 200 }\n      - match: { prefix: / }\n        direct_response: { status: 404 }\n";
        let config = Config::from_yaml(yaml).unwrap();
        let t = RouteTable::new(config.listeners[0].route_config.clone());
        let route = |path: &str| t.find("h", path, None, &HeaderMap::new()).route;
        for path in ["/private", "/PRIVATE/x", "/pRiVaTe"] {
            assert_eq!(route(path), Some(0), "{path}");
        }
        assert_eq!(route("/exact"), Some(1));
        assert_eq!(route("/EXACT/"), Some(3), "exact stays exact");
        assert_eq!(route("/Cased"), Some(2));
        assert_eq!(route("/cased"), Some(3), "case-sensitive by default");
    }

    #[test]
    fn regex_paths_query_parameters_and_header_patterns() {
        let yaml = r#"
listeners:
  - name: l
    address: 127.0.0.1:1
    routes:
      - match: { regex: "/users/[0-9]+" }
        direct_response: { status: 200, body: user }
      - match: { regex: "/Shop/.*", case_sensitive: false }
        direct_response: { status: 200, body: shop }
      - match: { prefix: /, query_parameters: [{ name: debug, exact: "on" }] }
        direct_response: { status: 200, body: debug }
      - match: { prefix: /, query_parameters: [{ name: "a b", present: true }, { name: v, regex: "[0-9]+" }] }
        direct_response: { status: 200, body: query }
      - match: { prefix: /, headers: [{ name: x-agent, prefix: curl/ }] }
        direct_response: { status: 200, body: curl }
      - match: { prefix: /, headers: [{ name: x-agent, suffix: bot }] }
        direct_response: { status: 200, body: bot }
      - match: { prefix: /, headers: [{ name: x-agent, contains: mobile }] }
        direct_response: { status: 200, body: mobile }
      - match: { prefix: / }
        direct_response: { status: 200, body: fallback }
"#;
        let t = RouteTable::new(
            Config::from_yaml(yaml).unwrap().listeners[0]
                .route_config
                .clone(),
        );
        let none = HeaderMap::new();
        let at = |path: &str, query: Option<&str>, headers: &HeaderMap| {
            let matched = t.find("h", path, query, headers);
            match &t.route(matched.route.expect("a route")).action {
                config::RouteAction::DirectResponse { body, .. } => {
                    String::from_utf8(body.to_vec()).unwrap()
                }
                other => panic!("unexpected action {other:?}"),
            }
        };
        // A regex matches the whole path.
        assert_eq!(at("/users/42", None, &none), "user");
        assert_eq!(at("/users/42/x", None, &none), "fallback");
        assert_eq!(at("/x/users/42", None, &none), "fallback");
        assert_eq!(at("/SHOP/cart", None, &none), "shop");
        // Parameters are decoded before they are compared; the first of a name counts.
        assert_eq!(at("/", Some("debug=on"), &none), "debug");
        assert_eq!(at("/", Some("x=1&debug=o%6E"), &none), "debug");
        assert_eq!(at("/", Some("debug=off&debug=on"), &none), "fallback");
        assert_eq!(at("/", Some("a%20b&v=12"), &none), "query");
        assert_eq!(at("/", Some("a%20b=&v=1x"), &none), "fallback");
        assert_eq!(at("/", Some("v=12"), &none), "fallback");
        let agent = |value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert("x-agent", HeaderValue::from_static(value));
            h
        };
        assert_eq!(at("/", None, &agent("curl/8.1")), "curl");
        assert_eq!(at("/", None, &agent("googlebot")), "bot");
        assert_eq!(at("/", None, &agent("a mobile b")), "mobile");
        assert_eq!(at("/", None, &agent("wget")), "fallback");
    }

    /// Cookies as Envoy Gateway's HTTPRoute matches write them: every matcher on the value of
    /// the first cookie of its name (quotes taken off); `invert` matches an absent cookie.
    #[test]
    fn cookies_match_by_value() {
        let yaml = r#"
listeners:
  - name: l
    address: 127.0.0.1:1
    routes:
      - match: { prefix: /, cookies: [{ name: c1, exact: xxx }, { name: c2, regex: "foo.*" }] }
        direct_response: { status: 200, body: both }
      - match: { prefix: /, cookies: [{ name: session, prefix: a, invert: true }] }
        direct_response: { status: 200, body: not-a }
      - match: { prefix: / }
        direct_response: { status: 200, body: fallback }
"#;
        let t = RouteTable::new(
            Config::from_yaml(yaml).unwrap().listeners[0]
                .route_config
                .clone(),
        );
        let at = |cookies: &[&'static str]| {
            let mut h = HeaderMap::new();
            for c in cookies {
                h.append(http::header::COOKIE, HeaderValue::from_static(c));
            }
            let matched = t.find("h", "/", None, &h);
            match &t.route(matched.route.expect("a route")).action {
                config::RouteAction::DirectResponse { body, .. } => {
                    String::from_utf8(body.to_vec()).unwrap()
                }
                other => panic!("unexpected action {other:?}"),
            }
        };
        assert_eq!(at(&["c1=xxx; c2=foobar; session=abc"]), "both");
        assert_eq!(at(&["c1=\"xxx\"", "c2=food; session=abc"]), "both");
        assert_eq!(
            at(&["c1=xxx; c1=yyy; c2=foo"]),
            "both",
            "the first of a name counts"
        );
        assert_eq!(at(&["c1=xxy; c2=foo; session=abc"]), "fallback");
        assert_eq!(at(&["c2=foo; session=bcd"]), "not-a");
        assert_eq!(at(&[]), "not-a", "an absent cookie matches inverted");
        assert_eq!(at(&["xc1=xxx; c2=foo; session=a"]), "fallback");
    }

    #[test]
    fn ports_are_ignored_when_matching_hosts() {
        assert_eq!(strip_port("a.test:80"), "a.test");
        assert_eq!(strip_port("a.test"), "a.test");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("a.test:"), "a.test");
        assert_eq!(strip_port("10.0.0.1"), "10.0.0.1");
        assert_eq!(strip_port("10.0.0.1:443"), "10.0.0.1");
    }
}
