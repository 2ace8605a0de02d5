//! Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`): the config loader, the
//! translation of xDS resources, the path normaliser with the router, the HTTP/1.1 head
//! checks, the PROXY protocol reader, and HTTP/3 request streams (h3_stream.rs). Each runs the code the proxy
//! runs and asserts what must hold for any input, so a fuzzer finds wrong answers as well as
//! panics. `fuzz/fuzz_targets/` runs them; tests/fuzz_corpus.rs replays the corpus and
//! `fuzz/regressions/` (a crash found later goes there, and stays a test). Not an API.

mod h3_stream;

use std::sync::{Arc, OnceLock};

use http::header::{CONNECTION, HeaderName};
use http::uri::{Authority, PathAndQuery};
use http::{HeaderMap, Request};

use crate::http::forwarding::{strip_connection_listed, strip_hop_by_hop};
use crate::http::head::{Admitted, HostRules, admit, is_authority};
use crate::router::RouteTable;
use config::path::{self, Normalized};
use config::{Config, EscapedSlashes, PathNormalization, StripHostPort};
use envoy_types::pb::google::protobuf::Any;

pub use h3_stream::h3_stream;

/// Loads `text` as a config file. What loads must serialise (the admin's /config_dump) and
/// route (each listener's table finds what a scan of its routes finds).
pub fn config(text: &str) {
    let Ok(config) = Config::from_yaml(text) else {
        return;
    };
    if let Err(e) = serde_json::to_string(&config) {
        panic!("a loaded config does not serialise: {e}");
    }
    let headers = HeaderMap::new();
    for listener in &config.listeners {
        let table = RouteTable::new(listener.route_config.clone());
        for (host, path) in [("example.com", "/"), ("a", "/a/b"), ("", "/x.y")] {
            assert_eq!(
                table.find(host, path, None, &headers),
                table.find_by_scan(host, path, None, &headers),
                "{host}{path}"
            );
        }
    }
}

/// The resource types [`xds`] decodes, by the low bits of a segment's first byte.
const XDS_TYPES: [&str; 5] = [
    config::xds::type_url::LISTENER,
    config::xds::type_url::ROUTE,
    config::xds::type_url::CLUSTER,
    config::xds::type_url::ENDPOINT,
    config::xds::type_url::SECRET,
];

/// Most resources one input makes.
const XDS_MAX_RESOURCES: usize = 8;

/// Splits fuzz input into xDS resources: segments of a type byte, a little-endian `u16`
/// length (0: the rest of the input) and that much protobuf. Each becomes an `Any` of its
/// type. [`xds_input`] writes them.
pub fn xds_resources(mut data: &[u8]) -> Vec<Any> {
    let mut out = Vec::new();
    while let [kind, low, high, rest @ ..] = data
        && out.len() < XDS_MAX_RESOURCES
    {
        let len = match usize::from(u16::from_le_bytes([*low, *high])) {
            0 => rest.len(),
            n => n.min(rest.len()),
        };
        out.push(Any {
            type_url: XDS_TYPES[usize::from(*kind) % XDS_TYPES.len()].to_owned(),
            value: rest[..len].to_vec(),
        });
        data = &rest[len..];
    }
    out
}

/// The input [`xds_resources`] reads back as `resources` (each under 64 KiB): for seeding
/// the corpus.
pub fn xds_input(resources: &[Any]) -> Vec<u8> {
    let mut out = Vec::new();
    for any in resources {
        let kind = XDS_TYPES
            .iter()
            .position(|t| *t == any.type_url)
            .unwrap_or(0);
        let len = u16::try_from(any.value.len()).unwrap_or(u16::MAX);
        out.push(kind as u8);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&any.value[..usize::from(len)]);
    }
    out
}

/// Runs resources from a management server through what the proxy does with them: decode
/// and translate each (one that is refused is left out, as its response would be NACKed),
/// join them into listeners and clusters, validate those beside a bootstrap's, and build what
/// needs no socket. Nothing may panic; what is accepted must serialise and route. Returns
/// whether the resources made a config with a listener or a cluster of theirs in it.
pub fn xds(data: &[u8]) -> bool {
    use config::xds::{
        Held, Resources, XdsCluster, XdsEndpoints, XdsListener, XdsRoutes, XdsSecret,
    };

    type Base = (
        Arc<config::RawConfig>,
        Arc<crate::catalog::ProxyStats>,
        stats::Shard,
    );
    static BASE: OnceLock<Base> = OnceLock::new();
    let (origin, stats, shard) = BASE.get_or_init(|| {
        let config = Config::from_yaml(XDS_BOOTSTRAP).unwrap_or_else(|e| panic!("{e}"));
        let stats = crate::catalog::ProxyStats::new();
        let shard = stats.registry.shard(&[]);
        (Arc::clone(config.origin()), stats, shard)
    });
    let mut resources = Resources::default();
    for any in xds_resources(data) {
        let version = "1".to_owned();
        let bytes = any.value.clone();
        let url = any.type_url.as_str();
        let _ = match url {
            config::xds::type_url::LISTENER => XdsListener::decode(&any).map(|v| {
                resources
                    .listeners
                    .insert(v.name.clone(), Held::new(v, version, &bytes));
            }),
            config::xds::type_url::ROUTE => XdsRoutes::decode(&any).map(|v| {
                resources
                    .routes
                    .insert(v.name.clone(), Held::new(v, version, &bytes));
            }),
            config::xds::type_url::CLUSTER => XdsCluster::decode(&any).map(|v| {
                resources
                    .clusters
                    .insert(v.name.clone(), Held::new(v, version, &bytes));
            }),
            config::xds::type_url::ENDPOINT => XdsEndpoints::decode(&any).map(|v| {
                resources
                    .endpoints
                    .insert(v.name.clone(), Held::new(v, version, &bytes));
            }),
            _ => XdsSecret::decode(&any).map(|v| {
                resources
                    .secrets
                    .insert(v.name.clone(), Held::new(v, version, &bytes));
            }),
        };
    }
    let Ok(sections) = resources.sections() else {
        return false;
    };
    resources.retain_wanted();
    let Ok(config) = config::xds::compose(origin, sections.listeners, sections.clusters) else {
        return false;
    };
    if let Err(e) = serde_json::to_string(&config) {
        panic!("an accepted xDS config does not serialise: {e}");
    }
    let headers = HeaderMap::new();
    for listener in &config.listeners {
        let settings =
            std::iter::once(listener).chain(listener.filter_chains.iter().map(|c| &*c.settings));
        for settings in settings {
            let table = RouteTable::new(settings.route_config.clone());
            for (host, path) in [("example.com", "/"), ("a", "/a/b"), ("", "/x.y")] {
                assert_eq!(
                    table.find(host, path, None, &headers),
                    table.find_by_scan(host, path, None, &headers),
                    "{host}{path}"
                );
            }
        }
    }
    // An error is a refusal, as a NACK; only a panic is a finding.
    let built = crate::live::build_without_sockets(&config, stats, shard).is_ok();
    // The series the build made go with it, as they would with a removed cluster.
    stats.registry.retire_unheld(std::time::Duration::ZERO);
    built && !(config.listeners.is_empty() && config.clusters.is_empty())
}

/// The bootstrap the xDS target's resources join: a node, a management server, no admin.
const XDS_BOOTSTRAP: &str = r#"
node: { id: fuzz, cluster: fuzz }
dynamic_resources: { ads: { address: "127.0.0.1:1" } }
admin: { enabled: false }
"#;

/// The route table the path and head targets route with: a guard on `/private`, a
/// case-insensitive one on `/admin`, exact and prefix routes under a few hosts.
const ROUTES: &str = r#"
listeners:
  - name: fuzz
    address: 127.0.0.1:1
    virtual_hosts:
      - name: api
        domains: ["api.example.com", "*.api.example.com"]
        routes:
          - match: { path: /v1/exact }
            direct_response: { status: 200 }
          - match: { prefix: /v1/ }
            direct_response: { status: 200 }
      - name: any
        domains: ["*"]
        routes:
          - match: { prefix: /private }
            direct_response: { status: 401 }
          - match: { prefix: /admin, case_sensitive: false }
            direct_response: { status: 401 }
          - match: { prefix: /. }
            direct_response: { status: 404 }
          - match: { prefix: /static/, headers: [{ name: x-v, exact: "2" }] }
            direct_response: { status: 200 }
          - match: { prefix: / }
            direct_response: { status: 200 }
"#;

/// The index of the `/private` guard in the `*` host's routes of [`ROUTES`], and of the
/// `/admin` one.
const PRIVATE: usize = 2;
const ADMIN: usize = 3;

fn routes() -> &'static RouteTable {
    static TABLE: OnceLock<RouteTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let config = Config::from_yaml(ROUTES).unwrap_or_else(|e| panic!("{e}"));
        RouteTable::new(config.listeners[0].route_config.clone())
    })
}

/// The normalisation settings a fuzz input's first byte picks.
fn settings(byte: u8) -> PathNormalization {
    PathNormalization {
        normalize: byte & 1 == 0,
        merge_slashes: byte & 2 == 0,
        escaped_slashes: match (byte >> 2) & 3 {
            0 => EscapedSlashes::Keep,
            1 => EscapedSlashes::Reject,
            2 => EscapedSlashes::UnescapeAndRedirect,
            _ => EscapedSlashes::UnescapeAndForward,
        },
    }
}

/// The first byte picks the settings; the rest is a request target as hyper accepts it. The
/// normalised path is in its one spelling (normalising it again changes nothing), is a valid
/// target, and routes as a scan of the routes does; the guards hold on it.
pub fn path(data: &[u8]) {
    let Some((&mode, target)) = data.split_first() else {
        return;
    };
    let settings = settings(mode);
    let Ok(target) = PathAndQuery::try_from(target) else {
        return;
    };
    let normalized = match path::normalize(target.path(), &settings) {
        Ok(Normalized::Path(normalized)) => normalized,
        Ok(Normalized::Redirect(location)) => {
            assert!(location.starts_with('/'), "{location}");
            return;
        }
        Err(_) => return,
    };
    let normalized: &str = &normalized;
    if target.path().starts_with('/') {
        check_normal(normalized, &settings);
    }
    let rebuilt = match target.query() {
        Some(query) => format!("{normalized}?{query}"),
        None => normalized.to_owned(),
    };
    assert!(
        PathAndQuery::try_from(rebuilt.as_str()).is_ok(),
        "the normalised target {rebuilt:?} is not a valid target"
    );
    check_routes("legate.test", normalized, &HeaderMap::new(), &settings);
}

/// What a normalised path is, whatever it was before.
fn check_normal(path: &str, settings: &PathNormalization) {
    assert!(path.starts_with('/'), "{path:?}");
    if settings.merge_slashes {
        assert!(!path.contains("//"), "{path:?} has an empty segment");
    }
    if settings.normalize {
        assert!(
            !path.split('/').any(|s| s == "." || s == ".."),
            "{path:?} has a dot segment"
        );
        assert!(!path.contains('\\'), "{path:?} has a backslash");
        let bytes = path.as_bytes();
        for (i, _) in path.match_indices('%') {
            let byte = path::escaped_byte(bytes, i);
            assert!(
                byte.is_some_and(|b| !(b.is_ascii_alphanumeric() || b"-._~".contains(&b))),
                "{path:?}: an escape at {i} is not one that must stay"
            );
            assert!(
                !bytes[i + 1..i + 3].iter().any(u8::is_ascii_lowercase),
                "{path:?}: a lower-case escape"
            );
        }
    }
    match path::normalize(path, settings) {
        Ok(Normalized::Path(again)) => assert_eq!(again, path, "normalising twice differs"),
        other => panic!("{path:?} normalised again: {other:?}"),
    }
}

/// The index finds what a scan finds, and the guards hold on a normalised path.
fn check_routes(host: &str, path: &str, headers: &HeaderMap, settings: &PathNormalization) {
    let table = routes();
    let matched = table.find(host, path, None, headers);
    assert_eq!(
        matched,
        table.find_by_scan(host, path, None, headers),
        "{host} {path}"
    );
    let any_host = matched.virtual_host == Some(1);
    if any_host && settings.normalize && settings.merge_slashes {
        if path.starts_with("/private") {
            assert_eq!(matched.route, Some(PRIVATE), "{path} passed the guard");
        }
        if path.len() >= 6 && path.as_bytes()[..6].eq_ignore_ascii_case(b"/admin") {
            assert_eq!(matched.route, Some(ADMIN), "{path} passed the guard");
        }
    }
}

/// Hop-by-hop headers, none of which may reach an upstream.
const HOP_BY_HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
];

/// The first byte picks the settings; the rest is an HTTP/1.1 request head, parsed by the
/// codec. A head the checks admit has its path in its one spelling and a host an upstream
/// reads as the proxy does, and routes as a scan does; after the hop-by-hop removal (as the
/// handler and rewrite.rs do it) no hop-by-hop header is left, and written out it parses back to
/// the same request line and header names. A redirect never leaves the site.
pub fn h1_head(data: &[u8]) {
    let Some((&mode, head)) = data.split_first() else {
        return;
    };
    let settings = settings(mode);
    let Some(mut req) = parse_head(head) else {
        return;
    };
    let host_rules = HostRules {
        strip_port: match (mode >> 4) & 3 {
            0 => StripHostPort::None,
            1 => StripHostPort::Any,
            _ => StripHostPort::Matching,
        },
        strip_trailing_dot: mode & 0x40 != 0,
        local_port: 80,
    };
    let admitted = match admit(&mut req, Some(60 * 1024), &settings, host_rules, routes()) {
        Ok(admitted) => admitted,
        Err(_) => return,
    };
    let host = match admitted {
        Admitted::Redirect(location) => {
            let location = location.as_bytes();
            assert!(
                location.starts_with(b"/") && !matches!(location.get(1), Some(b'/' | b'\\')),
                "{location:?} could leave the site"
            );
            return;
        }
        Admitted::Routed { host, .. } => host,
    };
    if req.uri().path().starts_with('/') {
        check_normal(req.uri().path(), &settings);
    }
    if let Some(host) = &host {
        assert!(is_authority(host.as_bytes()), "{host:?}");
        assert!(
            Authority::try_from(host.as_bytes()).is_ok(),
            "{host:?} is not an authority to http"
        );
    }
    let host_text = host.as_ref().map_or("", |h| h.to_str().unwrap_or(""));
    check_routes(host_text, req.uri().path(), req.headers(), &settings);

    // On the way upstream, as the handler and rewrite.rs do it.
    let listed: Vec<HeaderName> = req
        .headers()
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    let headers = req.headers_mut();
    strip_connection_listed(headers, false);
    strip_hop_by_hop(headers);
    for name in HOP_BY_HOP {
        let kept_te = name == "te"
            && headers
                .get_all(name)
                .iter()
                .all(|v| v.as_bytes().eq_ignore_ascii_case(b"trailers"));
        assert!(kept_te || !headers.contains_key(name), "{name} kept");
    }
    for name in listed {
        let te_trailers = name == "te";
        assert!(
            te_trailers || !headers.contains_key(&name),
            "{name}, named in Connection, kept"
        );
    }
    check_written(&req);
}

/// A head as the HTTP/1.1 codec (crates/h1) reads it; `None` where it refuses it.
fn parse_head(head: &[u8]) -> Option<Request<()>> {
    let mut buf = bytes::BytesMut::from(head);
    h1::parse_request(&mut buf, 64 * 1024)
        .ok()
        .flatten()
        .map(|head| head.request)
}

/// The request line and headers an HTTP/1.1 upstream gets parse back to what was sent.
fn check_written(req: &Request<()>) {
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut head = format!("{} {target} HTTP/1.1\r\n", req.method()).into_bytes();
    for (name, value) in req.headers() {
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let mut slots = [httparse::EMPTY_HEADER; 128];
    let mut parsed = httparse::Request::new(&mut slots);
    match parsed.parse(&head) {
        Ok(httparse::Status::Complete(len)) => assert_eq!(len, head.len()),
        other => panic!("the upstream head does not parse ({other:?}): {head:?}"),
    }
    assert_eq!(parsed.method, Some(req.method().as_str()));
    assert_eq!(parsed.path, Some(target));
    let names: Vec<&str> = req.headers().iter().map(|(n, _)| n.as_str()).collect();
    let parsed_names: Vec<String> = parsed
        .headers
        .iter()
        .map(|h| h.name.to_ascii_lowercase())
        .collect();
    assert_eq!(names, parsed_names, "the upstream reads other headers");
}

/// The PROXY protocol reader on arbitrary first bytes of a connection. The first byte picks
/// the listener's settings (versions, required) and how the bytes arrive; the rest are the
/// bytes. Whatever they are, the reader must come to the same outcome whether they arrive in
/// one piece or a few at a time, take no byte past a header, and hand back as its own first
/// bytes exactly what it took when there is no header.
pub fn proxy_protocol(data: &[u8]) {
    use crate::conn::proxy_protocol::{Header, HeaderReader, ProxyProtocolError, Step};
    use config::{ProxyProtocolConfig, ProxyProtocolVersions};

    let Some((&settings, bytes)) = data.split_first() else {
        return;
    };
    let config = ProxyProtocolConfig {
        versions: ProxyProtocolVersions {
            v1: settings & 1 == 0,
            v2: settings & 2 == 0,
        },
        required: settings & 4 == 0,
    };
    if !config.versions.v1 && !config.versions.v2 {
        return;
    }
    // What the reader ends with, and how many of the bytes it took.
    #[derive(Debug, PartialEq)]
    enum Outcome {
        Header(Header, usize),
        Error(ProxyProtocolError),
    }
    // Bytes arrive `piece` at a time (0: all at once); a peek sees at most 256 of them.
    let run = |piece: usize| -> Outcome {
        let mut reader = HeaderReader::new(config);
        let mut arrived = if piece == 0 { bytes.len() } else { piece };
        let mut taken = 0;
        loop {
            arrived = arrived.min(bytes.len());
            if taken == arrived {
                if arrived == bytes.len() {
                    return Outcome::Error(ProxyProtocolError::Closed);
                }
                arrived += piece;
                continue;
            }
            let seen = &bytes[taken..arrived.min(taken + 256)];
            let take = match reader.next(seen) {
                Err(e) => return Outcome::Error(e),
                Ok(Step::Done(Header::Absent { taken: first })) => {
                    assert_eq!(first, &bytes[..taken], "handed back what it took");
                    return Outcome::Header(Header::Absent { taken: Vec::new() }, 0);
                }
                Ok(Step::Done(header)) => return Outcome::Header(header, taken),
                Ok(Step::Take(take)) => take,
            };
            assert!(
                take > 0 && take <= seen.len(),
                "takes {take} of {}",
                seen.len()
            );
            reader.room(take).copy_from_slice(&seen[..take]);
            taken += take;
            match reader.taken() {
                Err(e) => return Outcome::Error(e),
                Ok(Some(header)) => return Outcome::Header(header, taken),
                Ok(None) => {}
            }
        }
    };
    let whole = run(0);
    if let Outcome::Header(Header::Client { .. } | Header::Local, taken) = &whole {
        // The header's own bytes, and not one more.
        let end = if bytes.starts_with(b"PROXY ") {
            bytes.iter().position(|&b| b == b'\n').map(|at| at + 1)
        } else {
            bytes
                .get(14..16)
                .map(|len| 16 + usize::from(u16::from_be_bytes([len[0], len[1]])))
        };
        assert_eq!(Some(*taken), end, "the header's end");
    }
    let piece = usize::from(settings >> 3) + 1;
    for piece in [1, piece] {
        assert_eq!(whole, run(piece), "{piece} at a time");
    }
}
