//! What control planes put in every listener, honoured through the real binary: a listener
//! and connection manager shaped as Envoy Gateway sends them (underscored headers refused or
//! dropped, HTTP/2 windows, the `server` header, the router's `suppress_envoy_headers`,
//! `max_connections_to_accept_per_socket_event`), over xDS from the testbed's management
//! server and from the config file; fields not honoured NACKed by name, the last good
//! config serving on.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, Http2ProtocolOptions, HttpProtocolOptions, header_value_option,
    http_protocol_options,
};
use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    RouteMatch, VirtualHost, route, route_action, route_match,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager, http_filter,
};
use envoy_types::pb::google::protobuf::{Any, BoolValue, UInt32Value};
use prost::Message;
use testbed::resources::{self, eds_cluster};
use testbed::xds::{any, type_url};
use testbed::{ManagementServer, NoopUpstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use common::*;

const LIMIT: Duration = Duration::from_secs(20);

/// The connection manager's settings a test varies.
struct Manager {
    underscores: http_protocol_options::HeadersWithUnderscoresAction,
    /// `server_header_transformation` and `server_name`.
    server: (
        http_connection_manager::ServerHeaderTransformation,
        &'static str,
    ),
    router: Router,
    stream_window: u32,
}

/// The listener `web` as Envoy Gateway writes it (its `http-route` scenario), on
/// 127.0.0.1, routes from RDS `web-routes`.
fn gateway_listener(m: &Manager) -> (String, Any) {
    let mut l: Listener = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    l.max_connections_to_accept_per_socket_event = Some(UInt32Value { value: 1 });
    l.per_connection_buffer_limit_bytes = Some(UInt32Value { value: 32768 });
    let chain = &mut l.filter_chains[0];
    let Some(filter::ConfigType::TypedConfig(hcm_any)) = &chain.filters[0].config_type else {
        unreachable!()
    };
    let mut hcm = HttpConnectionManager::decode(hcm_any.value.as_slice()).unwrap();
    hcm.common_http_protocol_options = Some(HttpProtocolOptions {
        headers_with_underscores_action: m.underscores as i32,
        ..Default::default()
    });
    hcm.http2_protocol_options = Some(Http2ProtocolOptions {
        initial_connection_window_size: Some(UInt32Value { value: 1_048_576 }),
        initial_stream_window_size: Some(UInt32Value {
            value: m.stream_window,
        }),
        max_concurrent_streams: Some(UInt32Value { value: 100 }),
        ..Default::default()
    });
    hcm.server_header_transformation = m.server.0 as i32;
    hcm.server_name = m.server.1.into();
    hcm.use_remote_address = Some(BoolValue { value: true });
    hcm.normalize_path = Some(BoolValue { value: true });
    hcm.merge_slashes = true;
    let router = hcm.http_filters.last_mut().unwrap();
    router.config_type = Some(http_filter::ConfigType::TypedConfig(any(&m.router)));
    chain.filters[0].config_type = Some(filter::ConfigType::TypedConfig(any(&hcm)));
    ("web".into(), any(&l))
}

fn bootstrap(server: SocketAddr) -> String {
    format!(
        "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1, cluster: edge }}\ndynamic_resources: {{ ads: {{ address: \"{server}\" }} }}\n"
    )
}

/// The cluster `backend` (EDS) with `upstream` as its one endpoint.
fn serve_backend(server: &ManagementServer, upstream: SocketAddr) {
    server.set(
        type_url::CLUSTER,
        vec![(
            "backend".into(),
            any(&eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
        )],
    );
    server.set(
        type_url::ENDPOINT,
        vec![(
            "backend".into(),
            any(&resources::assignment("backend", &[upstream])),
        )],
    );
}

/// The listener's bound address once it is in force.
async fn bound(proxy: &Proxy) -> SocketAddr {
    let mut found = None;
    eventually("listener web in force", async || {
        let (_, body) = admin_request(proxy.admin.unwrap(), "GET", "/config_dump");
        let dump: serde_json::Value = serde_json::from_str(&body).unwrap();
        found = dump["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == "web")
            .map(|l| l["bound_address"].as_str().unwrap().parse().unwrap());
        found.is_some()
    })
    .await;
    found.unwrap()
}

/// Sends the listener and waits for the proxy's answer to it: the NACK's reason, or `None`
/// for an ACK.
async fn serve_listener(server: &ManagementServer, listener: (String, Any)) -> Option<String> {
    serve(server, type_url::LISTENER, listener).await
}

/// Sends one resource of a type (the type's only one) and waits for the proxy's answer.
async fn serve(server: &ManagementServer, kind: &str, resource: (String, Any)) -> Option<String> {
    let mut sent_before = 0;
    server
        .wait_for(LIMIT, |_, responses| {
            sent_before = responses.len();
            true
        })
        .await;
    server.set(kind, vec![resource]);
    let mut answer = None;
    assert!(
        server
            .wait_for(LIMIT, |requests, responses| {
                let nonces: Vec<&str> = responses[sent_before.min(responses.len())..]
                    .iter()
                    .filter(|r| r.type_url == kind)
                    .map(|r| r.nonce.as_str())
                    .collect();
                answer = requests
                    .iter()
                    .filter(|r| nonces.contains(&r.response_nonce.as_str()))
                    .map(|r| r.error_detail.clone())
                    .next_back();
                answer.is_some()
            })
            .await,
        "the proxy answered the {kind}"
    );
    answer.unwrap()
}

/// A request with `x_user` (a name with an underscore) on a new HTTP/1.1 connection: the
/// status line, once the proxy has closed the connection.
async fn underscored_h1(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: web\r\nx_user: alice\r\n\r\n")
        .await
        .unwrap();
    let bytes = tokio::time::timeout(LIMIT, read_until_closed(&mut stream))
        .await
        .expect("the proxy closes the connection");
    let text = String::from_utf8_lossy(&bytes).into_owned();
    text.lines().next().unwrap_or("").to_owned()
}

/// The HTTP/2 server preface's SETTINGS_INITIAL_WINDOW_SIZE and the connection window the
/// proxy's first WINDOW_UPDATE opens (65535 + its increment).
async fn h2_windows(addr: SocketAddr) -> (u32, u32) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (mut stream_window, mut connection_window) = (65_535, None);
    let read = async {
        let mut settings_seen = false;
        while !(settings_seen && connection_window.is_some()) {
            let mut head = [0u8; 9];
            stream.read_exact(&mut head).await.unwrap();
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let (kind, flags) = (head[3], head[4]);
            let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
            let mut payload = vec![0u8; len];
            stream.read_exact(&mut payload).await.unwrap();
            match kind {
                4 if flags & 1 == 0 => {
                    settings_seen = true;
                    for setting in payload.chunks_exact(6) {
                        if u16::from_be_bytes([setting[0], setting[1]]) == 4 {
                            stream_window = u32::from_be_bytes([
                                setting[2], setting[3], setting[4], setting[5],
                            ]);
                        }
                    }
                }
                8 if stream_id == 0 => {
                    let increment =
                        u32::from_be_bytes([payload[0] & 0x7f, payload[1], payload[2], payload[3]]);
                    connection_window = Some(65_535 + increment);
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(LIMIT, read)
        .await
        .expect("the server's preface");
    (stream_window, connection_window.unwrap())
}

/// The first bytes of a PNG file: not UTF-8.
const PNG_START: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_manager_envoy_gateway_sends_is_honoured() {
    use http_connection_manager::ServerHeaderTransformation as Server;
    use http_protocol_options::HeadersWithUnderscoresAction as Underscores;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    // As Envoy Gateway writes them: hosts matched without their port, and a route whose
    // backend is not there answering 500.
    let mut gone = resources::forward("/gone", "not-sent-either");
    if let Some(route::Action::Route(action)) = &mut gone.action {
        action.cluster_not_found_response_code =
            route_action::ClusterNotFoundResponseCode::InternalServerError as i32;
    }
    // Envoy Gateway's prefix match: `/sep` and below it, not `/seps`.
    let mut separated = resources::direct("/sep", 418);
    separated.r#match = Some(RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::PathSeparatedPrefix(
            "/sep".into(),
        )),
        ..Default::default()
    });
    // A direct response whose body is not text (an image), typed by a response header.
    let mut logo = resources::direct("/logo", 200);
    if let Some(route::Action::DirectResponse(direct)) = &mut logo.action {
        use envoy_types::pb::envoy::config::core::v3::{
            DataSource, SubstitutionFormatString, data_source, substitution_format_string,
        };
        direct.body_format = Some(SubstitutionFormatString {
            format: Some(substitution_format_string::Format::TextFormatSource(
                DataSource {
                    specifier: Some(data_source::Specifier::InlineBytes(PNG_START.to_vec())),
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
    }
    logo.response_headers_to_add = vec![header("content-type", "image/png", true)];
    let mut routes = resources::route_config(
        "web-routes",
        vec![
            resources::forward("/missing", "not-sent"),
            gone,
            separated,
            logo,
            resources::forward("/", "backend"),
        ],
    );
    routes.ignore_port_in_host_matching = true;
    routes.virtual_hosts.insert(
        0,
        VirtualHost {
            name: "ported".into(),
            domains: vec!["ported.test:9999".into()],
            routes: vec![resources::direct("/", 418)],
            ..Default::default()
        },
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let gateway = Manager {
        underscores: Underscores::RejectRequest,
        server: (Server::PassThrough, ""),
        router: Router {
            suppress_envoy_headers: true,
            ..Default::default()
        },
        stream_window: 65536,
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(&server, gateway_listener(&gateway)).await,
        None
    );
    let addr = bound(&proxy).await;
    let admin = proxy.admin.unwrap();

    // REJECT_REQUEST: 400, and an HTTP/1.1 connection is closed after it; HTTP/2 gets 400.
    assert_eq!(underscored_h1(addr).await, "HTTP/1.1 400 Bad Request");
    let h2 = send_h2(addr, get_h2("/", &[("x_user", "alice")])).await;
    assert_eq!(h2.status(), 400);
    assert_eq!(
        stat(admin, "downstream_rq_rejected_with_underscores_in_headers"),
        2
    );
    assert_eq!(upstream.requests(), 0, "neither reached the upstream");

    // PASS_THROUGH: the upstream's `server` header as it is, none on the proxy's replies.
    let res = send_h1(
        addr,
        get("/", &[("x-noop-response-header", "server: noop/1")]),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["server"], "noop/1");
    let res = send_h1(addr, get("/missing", &[])).await;
    assert_eq!(res.status(), 503);
    assert!(res.headers().get("server").is_none());

    assert_eq!(send_h1(addr, get("/sep/x", &[])).await.status(), 418);
    assert_eq!(send_h1(addr, get("/sep?q", &[])).await.status(), 418);
    assert_eq!(send_h1(addr, get("/seps", &[])).await.status(), 200);
    let res = send_h1(addr, get("/logo", &[])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "image/png");
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(&body[..], PNG_START);
    let res = send_h1(addr, get("/gone", &[])).await;
    assert_eq!(res.status(), 500, "cluster_not_found_response_code");
    // A domain that names a port matches nothing once ports are ignored: `*` answers.
    let mut ported = get("/", &[]);
    ported
        .headers_mut()
        .insert("host", "ported.test:9999".parse().unwrap());
    let res = send_h1(addr, ported).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["x-noop-served-by"],
        upstream.local_addr().to_string()
    );

    // The windows of http2_protocol_options, as the server's preface announces them.
    assert_eq!(h2_windows(addr).await, (65536, 1_048_576));

    // DROP_HEADER and OVERWRITE with a name: the upstream never sees `x_user`, and every
    // response, the upstream's and the proxy's own, says `server: edge-gw`.
    let update = Manager {
        underscores: Underscores::DropHeader,
        server: (Server::Overwrite, "edge-gw"),
        ..gateway
    };
    assert_eq!(
        serve_listener(&server, gateway_listener(&update)).await,
        None
    );
    eventually("the update serving", async || {
        let res = send_h1(addr, get("/missing", &[])).await;
        res.headers().get("server").is_some_and(|v| v == "edge-gw")
    })
    .await;
    let res = send_h1(
        addr,
        get(
            "/",
            &[
                ("x_user", "alice"),
                ("x-noop-echo", "headers"),
                ("x-noop-response-header", "server: noop/1"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["server"], "edge-gw");
    let echoed = text(res.into_body()).await;
    assert!(!echoed.contains("x_user"), "{echoed}");
    assert!(echoed.contains("x-noop-echo: headers"), "{echoed}");
    assert_eq!(
        stat(admin, "downstream_headers_dropped_with_underscores"),
        1
    );

    // Refused by name, the last good listener serving on: a window under HTTP/2's least,
    // and a router setting not honoured.
    let small_window = Manager {
        stream_window: 100,
        ..update
    };
    let nack = serve_listener(&server, gateway_listener(&small_window))
        .await
        .expect("NACK");
    assert!(nack.contains("initial_stream_window_size"), "{nack}");
    assert!(nack.contains("65535"), "{nack}");
    let child_span = Manager {
        router: Router {
            respect_expected_rq_timeout: true,
            ..Default::default()
        },
        stream_window: 65536,
        ..small_window
    };
    let nack = serve_listener(&server, gateway_listener(&child_span))
        .await
        .expect("NACK");
    assert!(nack.contains("listener `web`"), "{nack}");
    assert!(nack.contains("respect_expected_rq_timeout"), "{nack}");
    let res = send_h1(addr, get("/", &[])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["server"], "edge-gw");
    server.shutdown().await;
}

/// The same settings from the config file; `append_if_absent` names only responses that
/// carry no `server` header; `suppress_proxy_headers` leaves `x-legate-overloaded` out; one
/// connection accepted per turn still serves a burst of connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_settings_from_the_config_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let held = HeldUpstream::start().await;
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    max_connections_to_accept_per_socket_event: 1
    http:
      headers_with_underscores_action: drop_header
      server_header_transformation: append_if_absent
      server_name: edge
      suppress_proxy_headers: true
      initial_stream_window_size: 70000
      initial_connection_window_size: 200000
      strip_host_port: any
      strip_trailing_host_dot: true
    routes:
      - match: {{ prefix: /held }}
        cluster: held
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
  - name: held
    endpoints: [{}]
    circuit_breakers: {{ max_requests: 1 }}
"#,
        upstream.local_addr(),
        held.addr
    );
    let proxy = Proxy::start(&config, 1);
    let addr = proxy.addr();
    let res = send_h1(
        addr,
        get("/", &[("x-noop-response-header", "server: noop/1")]),
    )
    .await;
    assert_eq!(res.headers()["server"], "noop/1");
    let mut req = get("/", &[("x-noop-echo", "headers"), ("a_b", "1")]);
    req.headers_mut()
        .insert("host", "a.example.:8443".parse().unwrap());
    let res = send_h1(addr, req).await;
    assert_eq!(res.headers()["server"], "edge");
    let echoed = text(res.into_body()).await;
    assert!(!echoed.contains("a_b"), "{echoed}");
    assert!(echoed.contains("\nhost: a.example\n"), "{echoed}");
    assert_eq!(h2_windows(addr).await, (70000, 200000));

    // One request holds the cluster's only slot; the next is refused, without the header.
    let first = tokio::spawn(async move { send_h1(addr, get("/held", &[])).await.status() });
    held.wait_for_requests(1).await;
    let refused = send_h1(addr, get("/held", &[])).await;
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().get("x-legate-overloaded").is_none());
    assert_eq!(refused.headers()["server"], "edge");
    held.release();
    assert_eq!(first.await.unwrap(), 200);

    // Forty connections at once, accepted one per turn, all served.
    let burst: Vec<_> = (0..40)
        .map(|_| tokio::spawn(async move { send_h1(addr, get("/", &[])).await.status() }))
        .collect();
    for request in burst {
        assert_eq!(request.await.unwrap(), 200);
    }
    let (_, dump) = admin_request(proxy.admin.unwrap(), "GET", "/config_dump");
    let dump: serde_json::Value = serde_json::from_str(&dump).unwrap();
    let main = &dump["listeners"][0];
    assert_eq!(main["max_connections_to_accept_per_socket_event"], 1);
    assert_eq!(
        main["http"]["headers_with_underscores_action"],
        "drop_header"
    );
    assert_eq!(
        main["http"]["server_header"],
        serde_json::json!({ "append_if_absent": "edge" })
    );
    assert_eq!(main["http"]["strip_host_port"], "any");
}

/// `OVERWRITE_IF_EXISTS_OR_ADD` (`set`) or `APPEND_IF_EXISTS_OR_ADD` (`add`) of `name: value`.
fn header(name: &str, value: &str, set: bool) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: name.into(),
            value: value.into(),
            ..Default::default()
        }),
        append_action: if set {
            header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd
        } else {
            header_value_option::HeaderAppendAction::AppendIfExistsOrAdd
        } as i32,
        ..Default::default()
    }
}

/// The values of `name` the upstream echoed, in order.
fn echoed(echo: &str, name: &str) -> Vec<String> {
    echo.lines()
        .filter_map(|l| l.strip_prefix(&format!("{name}: ")))
        .map(str::to_owned)
        .collect()
}

/// Header mutations at the route configuration, the virtual host and the route, in Envoy's
/// order: by default the route's first and the configuration's last (its `set` wins);
/// with `most_specific_header_mutations_wins` the other way round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_mutations_of_three_levels_apply_in_envoys_order() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = |most_specific_wins: bool| {
        let level = |name: &str| {
            vec![
                header("x-level", name, true),
                header("x-trail", name, false),
            ]
        };
        let mut route = resources::forward("/", "backend");
        route.request_headers_to_add = level("route");
        route.request_headers_to_remove = vec!["x-drop".into()];
        route.response_headers_to_add = vec![header("x-answered-by", "route", true)];
        let mut config = resources::route_config("web-routes", vec![route]);
        let host = &mut config.virtual_hosts[0];
        host.request_headers_to_add = level("host");
        host.response_headers_to_remove = vec!["x-noop-served-by".into()];
        config.request_headers_to_add = level("configuration");
        config.response_headers_to_add = vec![
            header("x-answered-by", "configuration", true),
            HeaderValueOption {
                append_action: header_value_option::HeaderAppendAction::AddIfAbsent as i32,
                ..header("x-kept", "configuration", false)
            },
        ];
        config.most_specific_header_mutations_wins = most_specific_wins;
        ("web-routes".to_owned(), any(&config))
    };
    server.set(type_url::ROUTE, vec![routes(false)]);
    serve_backend(&server, upstream.local_addr());
    server.set(
        type_url::LISTENER,
        vec![(
            "web".into(),
            any(&resources::listener(
                "web",
                "127.0.0.1:0".parse().unwrap(),
                "web-routes",
            )),
        )],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    let addr = bound(&proxy).await;
    let ask = async || {
        let res = send_h1(
            addr,
            get(
                "/",
                &[
                    ("x-noop-echo", "headers"),
                    ("x-drop", "1"),
                    ("x-level", "client"),
                    ("x-noop-response-header", "x-kept: upstream"),
                ],
            ),
        )
        .await;
        assert_eq!(res.status(), 200);
        let head = res.headers().clone();
        (head, text(res.into_body()).await)
    };

    let (head, echo) = ask().await;
    assert_eq!(echoed(&echo, "x-level"), ["configuration"]);
    assert_eq!(echoed(&echo, "x-trail"), ["route", "host", "configuration"]);
    assert!(echoed(&echo, "x-drop").is_empty(), "{echo}");
    assert_eq!(head["x-answered-by"], "configuration");
    assert_eq!(head["x-kept"], "upstream", "add if absent");
    assert!(head.get("x-noop-served-by").is_none());

    server.set(type_url::ROUTE, vec![routes(true)]);
    let mut echo = String::new();
    let mut head = http::HeaderMap::new();
    eventually("the most specific level winning", async || {
        (head, echo) = ask().await;
        echoed(&echo, "x-level") == ["route"]
    })
    .await;
    assert_eq!(echoed(&echo, "x-trail"), ["configuration", "host", "route"]);
    assert_eq!(head["x-answered-by"], "route");
    server.shutdown().await;
}

/// The listener with its connection manager changed by `change`.
fn with_manager(
    (name, listener): (String, Any),
    change: impl FnOnce(&mut HttpConnectionManager),
) -> (String, Any) {
    let mut l = Listener::decode(listener.value.as_slice()).unwrap();
    let filter = &mut l.filter_chains[0].filters[0];
    let Some(filter::ConfigType::TypedConfig(hcm_any)) = &filter.config_type else {
        unreachable!()
    };
    let mut hcm = HttpConnectionManager::decode(hcm_any.value.as_slice()).unwrap();
    change(&mut hcm);
    filter.config_type = Some(filter::ConfigType::TypedConfig(any(&hcm)));
    (name, any(&l))
}

/// `x-request-id` as Envoy treats it on an edge listener: a client's id replaced unless
/// `preserve_external_request_id`, none made with `generate_request_id: false`, and the id
/// in the response with `always_set_request_id_in_response`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_follow_the_connection_manager() {
    use http_connection_manager::ServerHeaderTransformation as Server;
    use http_protocol_options::HeadersWithUnderscoresAction as Underscores;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let gateway = gateway_listener(&Manager {
        underscores: Underscores::Allow,
        server: (Server::PassThrough, ""),
        router: Router::default(),
        stream_window: 65536,
    });
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, gateway.clone()).await, None);
    let addr = bound(&proxy).await;
    let ask = async |id: Option<&str>| {
        let mut headers = vec![("x-noop-echo", "headers")];
        headers.extend(id.map(|id| ("x-request-id", id)));
        let res = send_h1(addr, get("/", &headers)).await;
        let answered = res.headers().get("x-request-id").cloned();
        let seen = echoed(&text(res.into_body()).await, "x-request-id");
        (seen, answered)
    };

    // Envoy's defaults on an edge listener: the client's id is replaced by a UUID.
    let (seen, answered) = ask(Some("client-id")).await;
    assert_eq!(seen.len(), 1);
    assert_ne!(seen[0], "client-id");
    assert_eq!(seen[0].len(), 36, "{seen:?}");
    assert!(answered.is_none());
    // Every line the client sent goes, not only the first.
    let sent = [
        ("x-noop-echo", "headers"),
        ("x-request-id", "one"),
        ("x-request-id", "two"),
    ];
    let res = send_h1(addr, get("/", &sent)).await;
    let seen = echoed(&text(res.into_body()).await, "x-request-id");
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].len(), 36, "{seen:?}");

    let preserve = with_manager(gateway.clone(), |hcm| {
        hcm.preserve_external_request_id = true;
        hcm.always_set_request_id_in_response = true;
    });
    assert_eq!(serve_listener(&server, preserve).await, None);
    let (seen, answered) = ask(Some("client-id")).await;
    assert_eq!(seen, ["client-id"]);
    assert_eq!(answered.unwrap(), "client-id");
    let (seen, answered) = ask(None).await;
    assert_eq!(seen.len(), 1);
    assert_eq!(
        answered.unwrap(),
        seen[0].as_str(),
        "the id made is the one answered"
    );

    let none = with_manager(gateway, |hcm| {
        hcm.generate_request_id = Some(BoolValue { value: false });
    });
    assert_eq!(serve_listener(&server, none).await, None);
    let (seen, _) = ask(None).await;
    assert!(seen.is_empty(), "{seen:?}");
    let (seen, _) = ask(Some("client-id")).await;
    assert_eq!(seen, ["client-id"], "nothing to replace it with");
    server.shutdown().await;
}

/// The connection manager's `local_reply_config`: a mapper picks the proxy's own replies by
/// an access-log filter and rewrites status, body and headers; `body_format` is refused by
/// name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_replies_from_the_connection_manager() {
    use envoy_types::pb::envoy::config::accesslog::v3::{
        AccessLogFilter, ComparisonFilter, StatusCodeFilter, access_log_filter,
    };
    use envoy_types::pb::envoy::config::core::v3::{
        DataSource, RuntimeUInt32, SubstitutionFormatString, data_source,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        LocalReplyConfig, ResponseMapper,
    };
    use http_connection_manager::ServerHeaderTransformation as Server;
    use http_protocol_options::HeadersWithUnderscoresAction as Underscores;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = resources::route_config(
        "web-routes",
        vec![
            resources::direct("/gone", 404),
            resources::forward("/", "backend"),
        ],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let base = gateway_listener(&Manager {
        underscores: Underscores::Allow,
        server: (Server::PassThrough, ""),
        router: Router::default(),
        stream_window: 65536,
    });
    let mapper = ResponseMapper {
        filter: Some(AccessLogFilter {
            filter_specifier: Some(access_log_filter::FilterSpecifier::StatusCodeFilter(
                StatusCodeFilter {
                    comparison: Some(ComparisonFilter {
                        op: 0, // EQ
                        value: Some(RuntimeUInt32 {
                            default_value: 404,
                            runtime_key: "local_reply.code".into(),
                        }),
                    }),
                },
            )),
        }),
        status_code: Some(envoy_types::pb::google::protobuf::UInt32Value { value: 410 }),
        body: Some(DataSource {
            specifier: Some(data_source::Specifier::InlineString(
                "gone for good\n".into(),
            )),
            ..Default::default()
        }),
        headers_to_add: vec![header("x-mapped", "yes", true)],
        ..Default::default()
    };
    let with_replies = |config: LocalReplyConfig| {
        with_manager(base.clone(), |hcm| hcm.local_reply_config = Some(config))
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(
            &server,
            with_replies(LocalReplyConfig {
                mappers: vec![mapper.clone()],
                ..Default::default()
            })
        )
        .await,
        None
    );
    let addr = bound(&proxy).await;
    let res = send_h1(addr, get("/gone", &[])).await;
    assert_eq!(res.status(), 410);
    assert_eq!(res.headers()["x-mapped"], "yes");
    assert_eq!(text(res.into_body()).await, "gone for good\n");
    let res = send_h1(addr, get("/", &[("x-noop-status", "404")])).await;
    assert_eq!(res.status(), 404, "an upstream's answer is not rewritten");
    assert!(res.headers().get("x-mapped").is_none());

    // A body format (formatted bodies) is refused by name; the last good config serves.
    let nack = serve_listener(
        &server,
        with_replies(LocalReplyConfig {
            mappers: vec![mapper],
            body_format: Some(SubstitutionFormatString::default()),
        }),
    )
    .await
    .expect("NACK");
    assert!(
        nack.contains("local_reply_config") && nack.contains("body_format"),
        "{nack}"
    );
    assert_eq!(send_h1(addr, get("/gone", &[])).await.status(), 410);
    server.shutdown().await;
}

/// A file access log as a control plane writes it (`FileAccessLog`, a text or JSON
/// `log_format` with `%REQ(...)%` and `%RESP(...)%`), its lines parsed back; the listener's
/// own `NR` log accepted; a CEL filter picking lines; loggers and filters not honoured
/// refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_logs_from_the_connection_manager() {
    use envoy_types::pb::envoy::config::accesslog::v3::{
        AccessLog, AccessLogFilter, ExtensionFilter, ResponseFlagFilter, access_log,
        access_log_filter, extension_filter,
    };
    use envoy_types::pb::envoy::config::core::v3::{
        DataSource, SubstitutionFormatString, data_source, substitution_format_string,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
        FileAccessLog, file_access_log,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
    use envoy_types::pb::google::protobuf::{Struct, Value, value};
    use http_connection_manager::ServerHeaderTransformation as Server;
    use http_protocol_options::HeadersWithUnderscoresAction as Underscores;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let logs = ScratchDir::new();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let file_log = |path: &std::path::Path, format: substitution_format_string::Format| AccessLog {
        name: "envoy.access_loggers.file".into(),
        config_type: Some(access_log::ConfigType::TypedConfig(any(&FileAccessLog {
            path: path.display().to_string(),
            access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(
                SubstitutionFormatString {
                    format: Some(format),
                    ..Default::default()
                },
            )),
        }))),
        ..Default::default()
    };
    let no_route_only = Some(AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(
            ResponseFlagFilter {
                flags: vec!["NR".into()],
            },
        )),
    });
    let text_path = logs.0.join("text.log");
    let text = substitution_format_string::Format::TextFormatSource(DataSource {
        specifier: Some(data_source::Specifier::InlineString(
            "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %REQ(USER-AGENT):4% \"%REQ(X-ABSENT)%\" %RESP(X-NOOP-SERVED-BY)% %RESPONSE_CODE%\n".into(),
        )),
        ..Default::default()
    });
    let base = gateway_listener(&Manager {
        underscores: Underscores::Allow,
        server: (Server::PassThrough, ""),
        router: Router::default(),
        stream_window: 65536,
    });
    let with_logs = |hcm_log: AccessLog| {
        let (name, l) = with_manager(base.clone(), |hcm| hcm.access_log = vec![hcm_log]);
        let mut l = Listener::decode(l.value.as_slice()).unwrap();
        // Envoy Gateway's: `NR` alone, and `NR` with another term (whatever it is, only
        // `NR` entries pass).
        let no_route_and = AccessLogFilter {
            filter_specifier: Some(access_log_filter::FilterSpecifier::AndFilter(
                envoy_types::pb::envoy::config::accesslog::v3::AndFilter {
                    filters: vec![
                        AccessLogFilter {
                            filter_specifier: Some(
                                access_log_filter::FilterSpecifier::NotHealthCheckFilter(
                                    Default::default(),
                                ),
                            ),
                        },
                        no_route_only.clone().unwrap(),
                    ],
                },
            )),
        };
        l.access_log = [no_route_only.clone(), Some(no_route_and)]
            .into_iter()
            .map(|filter| AccessLog {
                name: "envoy.access_loggers.file".into(),
                filter,
                config_type: file_log(&logs.0.join("never.log"), text.clone()).config_type,
            })
            .collect();
        (name, any(&l))
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(&server, with_logs(file_log(&text_path, text.clone()))).await,
        None
    );
    let addr = bound(&proxy).await;
    let res = send_h1(addr, get("/logged?q=1", &[("user-agent", "curl/8.0")])).await;
    assert_eq!(res.status(), 200);
    text_of(res).await;
    let served_by = upstream.local_addr().to_string();
    let lines = wait_for_lines(&text_path, 1).await;
    assert_eq!(
        lines,
        [format!("GET /logged?q=1 curl \"-\" {served_by} 200")]
    );

    // A JSON object a line, its keys the format's.
    let json_path = logs.0.join("json.log");
    let keys = |pairs: &[(&str, &str)]| Struct {
        fields: pairs
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Value {
                        kind: Some(value::Kind::StringValue((*v).to_owned())),
                    },
                )
            })
            .collect(),
    };
    let json = substitution_format_string::Format::JsonFormat(keys(&[
        ("method", "%REQ(:METHOD)%"),
        ("authority", "%REQ(:AUTHORITY)%"),
        ("code", "%RESPONSE_CODE%"),
    ]));
    assert_eq!(
        serve_listener(&server, with_logs(file_log(&json_path, json))).await,
        None
    );
    let res = send_h1(addr, get("/json", &[])).await;
    text_of(res).await;
    let lines = wait_for_lines(&json_path, 1).await;
    let line: serde_json::Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(
        line,
        serde_json::json!({ "authority": "legate.test", "code": 200, "method": "GET" })
    );
    let never = std::fs::read_to_string(logs.0.join("never.log")).unwrap_or_default();
    assert!(never.is_empty(), "the listener's NR log wrote: {never}");

    // A filter Envoy Gateway writes (CEL) picks the lines; one request in two is written.
    let filtered_path = logs.0.join("filtered.log");
    let mut filtered = file_log(&filtered_path, text.clone());
    filtered.filter = Some(AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ExtensionFilter(
            ExtensionFilter {
                name: "envoy.access_loggers.extension_filters.cel".into(),
                config_type: Some(extension_filter::ConfigType::TypedConfig(any(
                    &ExpressionFilter {
                        expression: "request.url_path.contains('keep')".into(),
                        ..Default::default()
                    },
                ))),
            },
        )),
    });
    assert_eq!(serve_listener(&server, with_logs(filtered)).await, None);
    for path in ["/drop?keep=1", "/keep"] {
        let res = send_h1(addr, get(path, &[("user-agent", "curl/8.0")])).await;
        assert_eq!(res.status(), 200);
        text_of(res).await;
    }
    // One worker: the second request's line comes after the first's would have.
    let lines = wait_for_lines(&filtered_path, 1).await;
    assert_eq!(lines, [format!("GET /keep curl \"-\" {served_by} 200")]);

    // Refused by name: another logger, a filter this proxy cannot evaluate.
    let mut als = file_log(&text_path, text.clone());
    als.name = "envoy.access_loggers.http_grpc".into();
    als.config_type = Some(access_log::ConfigType::TypedConfig(Any {
        type_url:
            "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig"
                .into(),
        value: Vec::new(),
    }));
    let nack = serve_listener(&server, with_logs(als)).await.expect("NACK");
    assert!(nack.contains("envoy.access_loggers.http_grpc"), "{nack}");
    let mut filtered = file_log(&text_path, text.clone());
    filtered.filter = Some(AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::TraceableFilter(
            Default::default(),
        )),
    });
    let nack = serve_listener(&server, with_logs(filtered))
        .await
        .expect("NACK");
    assert!(nack.contains("access_log[0].filter"), "{nack}");
    assert!(nack.contains("traceable_filter"), "{nack}");
    server.shutdown().await;
}

async fn text_of(res: http::Response<hyper::body::Incoming>) -> String {
    text(res.into_body()).await
}

/// The lines of `path` once it has at least `n` (for up to 20 s).
async fn wait_for_lines(path: &std::path::Path, n: usize) -> Vec<String> {
    let mut lines = Vec::new();
    eventually(&format!("{n} lines in {}", path.display()), async || {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        lines = text.lines().map(str::to_owned).collect();
        lines.len() >= n
    })
    .await;
    lines
}

/// One HTTP/1.0 request without a host on a new connection: the whole answer, once the
/// proxy has closed the connection (HTTP/1.0 without keep-alive).
async fn http10(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.0\r\nx-noop-echo: headers\r\n\r\n")
        .await
        .unwrap();
    let bytes = tokio::time::timeout(LIMIT, read_until_closed(&mut stream))
        .await
        .expect("the proxy closes the connection");
    String::from_utf8_lossy(&bytes).into_owned()
}

/// HTTP/1.0 as Envoy takes it: 426 unless `accept_http_10`, and then routed with
/// `default_host_for_http_10` when the request names no host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http10_follows_http_protocol_options() {
    use envoy_types::pb::envoy::config::core::v3::Http1ProtocolOptions;
    use http_connection_manager::ServerHeaderTransformation as Server;
    use http_protocol_options::HeadersWithUnderscoresAction as Underscores;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut routes =
        resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    routes.virtual_hosts[0].domains = vec!["web.test".into()];
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let gateway = gateway_listener(&Manager {
        underscores: Underscores::Allow,
        server: (Server::PassThrough, ""),
        router: Router::default(),
        stream_window: 65536,
    });
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, gateway.clone()).await, None);
    let addr = bound(&proxy).await;
    let refused = http10(addr).await;
    assert!(refused.starts_with("HTTP/1.1 426"), "{refused}");
    assert_eq!(upstream.requests(), 0);

    let accepted = with_manager(gateway, |hcm| {
        hcm.http_protocol_options = Some(Http1ProtocolOptions {
            accept_http_10: true,
            default_host_for_http_10: "web.test".into(),
            ..Default::default()
        });
    });
    assert_eq!(serve_listener(&server, accepted).await, None);
    let answer = http10(addr).await;
    assert!(
        answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(answer.contains("host: web.test"), "{answer}");
    server.shutdown().await;
}

/// The fault filter as Istio writes it: empty in the chain, with each route's `HTTPFault`
/// in `typed_per_filter_config`; fields not honoured refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_from_the_management_server() {
    use envoy_types::pb::envoy::config::route::v3::FilterConfig;
    use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
    use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
        FaultAbort, HttpFault, fault_abort,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let all = Some(FractionalPercent {
        numerator: 100,
        denominator: 0,
    });
    let abort = HttpFault {
        abort: Some(FaultAbort {
            error_type: Some(fault_abort::ErrorType::HttpStatus(503)),
            percentage: all,
            ..Default::default()
        }),
        ..Default::default()
    };
    let delay = HttpFault {
        delay: Some(FaultDelay {
            fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(PbDuration {
                seconds: 0,
                nanos: 200_000_000,
            })),
            percentage: all,
        }),
        ..Default::default()
    };
    // Envoy Gateway's gRPC abort.
    let grpc_abort = HttpFault {
        abort: Some(FaultAbort {
            error_type: Some(fault_abort::ErrorType::GrpcStatus(14)),
            percentage: all,
            ..Default::default()
        }),
        ..Default::default()
    };
    let with_fault = |prefix: &str, settings: Any| {
        let mut route = resources::forward(prefix, "backend");
        route
            .typed_per_filter_config
            .insert("envoy.filters.http.fault".into(), settings);
        route
    };
    let wrapped = any(&FilterConfig {
        config: Some(any(&abort)),
        ..Default::default()
    });
    let routes = resources::route_config(
        "web-routes",
        vec![
            with_fault("/aborted", any(&abort)),
            with_fault("/wrapped", wrapped),
            with_fault("/delayed", any(&delay)),
            with_fault("/grpc", any(&grpc_abort)),
            resources::forward("/", "backend"),
        ],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let fault_filter = |fault: &HttpFault| HttpFilter {
        name: "envoy.filters.http.fault".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(fault))),
        ..Default::default()
    };
    // Istio's chain, less its own extensions: grpc_stats, fault, cors, then the router.
    let listener = |fault: HttpFault| {
        let grpc_stats = HttpFilter {
            name: "envoy.filters.http.grpc_stats".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(Any {
                type_url:
                    "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig"
                        .into(),
                value: vec![8, 1], // emit_filter_state: true
            })),
            ..Default::default()
        };
        let cors = HttpFilter {
            name: "envoy.filters.http.cors".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(Any {
                type_url: "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors".into(),
                value: Vec::new(),
            })),
            ..Default::default()
        };
        let l = resources::listener_with_filters(
            "web",
            "127.0.0.1:0".parse().unwrap(),
            "web-routes",
            vec![grpc_stats, fault_filter(&fault), cors],
        );
        ("web".to_owned(), any(&l))
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(&server, listener(HttpFault::default())).await,
        None
    );
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/aborted", &[])).await.status() == 503
    })
    .await;
    assert_eq!(send_h1(addr, get("/wrapped", &[])).await.status(), 503);
    assert_eq!(send_h1(addr, get("/plain", &[])).await.status(), 200);
    let started = std::time::Instant::now();
    assert_eq!(send_h1(addr, get("/delayed", &[])).await.status(), 200);
    assert!(started.elapsed() >= Duration::from_millis(200));
    // A gRPC status: a gRPC call gets it in a trailers-only answer, anything else a 200.
    let call = send_h2(
        addr,
        get_h2(
            "/grpc/svc.Echo/Say",
            &[("content-type", "application/grpc")],
        ),
    )
    .await;
    assert_eq!(call.status(), 200);
    assert_eq!(call.headers()["grpc-status"], "14");
    assert_eq!(call.headers()["grpc-message"], "fault filter abort");
    let plain = send_h1(addr, get("/grpc", &[])).await;
    assert_eq!(plain.status(), 200);
    assert!(plain.headers().get("grpc-status").is_none());
    assert_eq!(text(plain.into_body()).await, "fault filter abort");
    assert_eq!(
        upstream.requests(),
        2,
        "only /plain and /delayed went upstream"
    );

    // Faults only for requests with a header: refused by name.
    let matching = HttpFault {
        headers: vec![Default::default()],
        ..Default::default()
    };
    let nack = serve_listener(&server, listener(matching))
        .await
        .expect("NACK");
    assert!(
        nack.contains("listener `web`") && nack.contains("headers"),
        "{nack}"
    );
    assert_eq!(send_h1(addr, get("/aborted", &[])).await.status(), 503);
    server.shutdown().await;
}

/// Retries as Istio's routes ask for them: a gRPC answer with `grpc-status: 14` in its head
/// is retried on `unavailable`; each retry waits a jittered back-off below its ceiling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_wait_their_back_off_and_retry_grpc_unavailable() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /grpc }}
        cluster: backend
        retry_policy:
          retry_on: [connect-failure, refused-stream, unavailable, cancelled, retriable-status-codes]
          retriable_status_codes: [503]
          num_retries: 2
          retry_back_off: {{ base_interval: 1ms }}
      - match: {{ prefix: /slow }}
        cluster: backend
        retry_policy:
          retry_on: [5xx]
          num_retries: 1
          retry_back_off: {{ base_interval: 200ms, max_interval: 200ms }}
clusters:
  - name: backend
    endpoints: [{}]
"#,
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let addr = proxy.addr();

    // Unavailable: tried three times; a status the policy does not name: once.
    let res = send_h1(
        addr,
        get("/grpc", &[("x-noop-response-header", "grpc-status: 14")]),
    )
    .await;
    assert_eq!(res.headers()["grpc-status"], "14");
    assert_eq!(upstream.requests(), 3);
    send_h1(
        addr,
        get("/grpc", &[("x-noop-response-header", "grpc-status: 2")]),
    )
    .await;
    assert_eq!(upstream.requests(), 4);

    // 40 requests, each retried once after a wait uniform below 200 ms: 4 s on average,
    // under 2 s with a chance of about 1 in 10^8, and never over 8 s plus the requests.
    let started = std::time::Instant::now();
    for _ in 0..40 {
        let res = send_h1(addr, get("/slow", &[("x-noop-status", "503")])).await;
        assert_eq!(res.status(), 503);
    }
    let took = started.elapsed();
    assert_eq!(upstream.requests(), 4 + 80);
    assert!(took >= Duration::from_secs(2), "{took:?}");
    assert!(
        took < Duration::from_secs(8) + Duration::from_secs(10),
        "{took:?}"
    );
}

/// `grpc_timeout_header_max` (Istio's `max_grpc_timeout: 0s`): a gRPC request's deadline is
/// its `grpc-timeout`, not the route's timeout; other requests keep the route's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_take_their_own_deadline() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        r#"
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: / }}
        cluster: backend
        timeout: 200ms
        grpc_timeout_header_max: 0s
clusters:
  - name: backend
    endpoints: [{}]
"#,
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let addr = proxy.addr();
    let slow = ("x-noop-delay", "600ms");
    let grpc = ("content-type", "application/grpc");
    assert_eq!(send_h1(addr, get("/", &[slow])).await.status(), 504);
    assert_eq!(
        send_h1(addr, get("/", &[slow, grpc, ("grpc-timeout", "5S")]))
            .await
            .status(),
        200
    );
    assert_eq!(
        send_h1(addr, get("/", &[slow, grpc])).await.status(),
        200,
        "no deadline"
    );
    // Its own deadline passed: DEADLINE_EXCEEDED, in gRPC's trailers-only form.
    let res = send_h1(addr, get("/", &[slow, grpc, ("grpc-timeout", "100m")])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "4");
    assert_eq!(res.headers()["grpc-message"], "upstream request timeout");
}

/// Istio's `include_request_attempt_count`: every try carries its number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_try_carries_its_number() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        r#"
listeners:
  - name: main
    address: 127.0.0.1:0
    virtual_hosts:
      - name: counted
        domains: [counted.test]
        include_request_attempt_count: true
        routes:
          - match: {{ prefix: / }}
            cluster: backend
            retry_policy: {{ retry_on: [5xx], num_retries: 2, retry_back_off: {{ base_interval: 1ms }} }}
      - name: plain
        domains: ["*"]
        routes:
          - match: {{ prefix: / }}
            cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
"#,
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let ask = |host: &'static str, status: &'static str| {
        let mut req = get(
            "/",
            &[("x-noop-echo", "headers"), ("x-noop-status", status)],
        );
        req.headers_mut().insert("host", host.parse().unwrap());
        req
    };
    let res = send_h1(proxy.addr(), ask("counted.test", "503")).await;
    assert_eq!(
        echoed(&text(res.into_body()).await, "x-envoy-attempt-count"),
        ["3"]
    );
    let res = send_h1(proxy.addr(), ask("counted.test", "200")).await;
    assert_eq!(
        echoed(&text(res.into_body()).await, "x-envoy-attempt-count"),
        ["1"]
    );
    let res = send_h1(proxy.addr(), ask("other.test", "200")).await;
    assert!(echoed(&text(res.into_body()).await, "x-envoy-attempt-count").is_empty());
}

/// CORS as Envoy Gateway and Istio write it: the empty `cors` filter in the chain, a
/// `CorsPolicy` on the virtual host and on routes, a route's empty fields taken from its
/// host's; preflights and requests answered by Envoy's rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_policies_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
    use envoy_types::pb::envoy::config::route::v3::FilterConfig;
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
    use envoy_types::pb::envoy::r#type::v3::FractionalPercent;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let matcher = |pattern| StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    };
    let host_policy = CorsPolicy {
        allow_origin_string_match: vec![
            matcher(string_matcher::MatchPattern::Exact(
                "https://app.test".into(),
            )),
            StringMatcher {
                ignore_case: true,
                ..matcher(string_matcher::MatchPattern::Suffix(".Example.com".into()))
            },
        ],
        allow_methods: "GET, PUT".into(),
        allow_headers: "*".into(),
        expose_headers: "x-trace".into(),
        max_age: "600".into(),
        allow_credentials: Some(BoolValue { value: true }),
        ..Default::default()
    };
    // Only what differs from the host's: the rest is the host's, as Envoy reads it.
    let merged = CorsPolicy {
        allow_methods: "*".into(),
        forward_not_matching_preflights: Some(BoolValue { value: false }),
        ..Default::default()
    };
    let with_policy = |prefix: &str, settings: Any| {
        let mut route = resources::forward(prefix, "backend");
        route
            .typed_per_filter_config
            .insert("envoy.filters.http.cors".into(), settings);
        route
    };
    let off = any(&FilterConfig {
        disabled: true,
        ..Default::default()
    });
    let routes = |route_policy: CorsPolicy| {
        let mut config = resources::route_config(
            "web-routes",
            vec![
                with_policy("/merged", any(&route_policy)),
                with_policy("/off", off.clone()),
                resources::forward("/", "backend"),
            ],
        );
        config.virtual_hosts[0]
            .typed_per_filter_config
            .insert("envoy.filters.http.cors".into(), any(&host_policy));
        ("web-routes".to_owned(), any(&config))
    };
    server.set(type_url::ROUTE, vec![routes(merged.clone())]);
    serve_backend(&server, upstream.local_addr());
    let cors = HttpFilter {
        name: "envoy.filters.http.cors".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: "type.googleapis.com/envoy.extensions.filters.http.cors.v3.Cors".into(),
            value: Vec::new(),
        })),
        ..Default::default()
    };
    let listener = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![cors],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(&server, ("web".into(), any(&listener))).await,
        None
    );
    let addr = bound(&proxy).await;
    let preflight = |path: &str, origin: &str, method: &str| {
        let mut req = get(
            path,
            &[
                ("origin", origin),
                ("access-control-request-method", method),
                ("access-control-request-headers", "x-a, x-b"),
                // A preflight the upstream answers comes back 299.
                ("x-noop-status", "299"),
            ],
        );
        *req.method_mut() = http::Method::OPTIONS;
        req
    };
    let header = |res: &http::Response<hyper::body::Incoming>, name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    eventually("the routes in force", async || {
        send_h1(addr, preflight("/plain", "https://app.test", "PUT"))
            .await
            .status()
            == 200
    })
    .await;

    // A preflight answer's allow-origin, -methods, -headers, max-age and -credentials.
    let answered = |res: &http::Response<hyper::body::Incoming>| {
        [
            "access-control-allow-origin",
            "access-control-allow-methods",
            "access-control-allow-headers",
            "access-control-max-age",
            "access-control-allow-credentials",
        ]
        .map(|name| header(res, name))
    };
    let some = |v: &str| Some(v.to_owned());

    // The host's policy: answered by the proxy with 200 and the policy's values; `*`: the
    // headers the preflight asked for.
    let res = send_h1(addr, preflight("/plain", "https://app.test", "PUT")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        answered(&res),
        [
            some("https://app.test"),
            some("GET, PUT"),
            some("x-a, x-b"),
            some("600"),
            some("true")
        ]
    );
    // A suffix matched without regard to case.
    let res = send_h1(addr, preflight("/plain", "https://a.EXAMPLE.com", "GET")).await;
    assert_eq!(res.status(), 200);
    // Another origin's preflight goes on to the upstream (Envoy's default).
    let res = send_h1(addr, preflight("/plain", "https://evil.test", "PUT")).await;
    assert_eq!(res.status(), 299);
    assert_eq!(header(&res, "access-control-allow-origin"), None);

    // The route's policy with the host's origins, headers, max-age and credentials: methods
    // asked for are allowed, another origin's preflight is answered here, without allowing it.
    let res = send_h1(addr, preflight("/merged", "https://app.test", "PATCH")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        answered(&res),
        [
            some("https://app.test"),
            some("PATCH"),
            some("x-a, x-b"),
            some("600"),
            some("true")
        ]
    );
    let res = send_h1(addr, preflight("/merged", "https://evil.test", "PATCH")).await;
    assert_eq!(res.status(), 200);
    assert_eq!(header(&res, "access-control-allow-origin"), None);

    // A request from an allowed origin: the origin, credentials and exposed headers.
    let res = send_h1(addr, get("/plain", &[("origin", "https://app.test")])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        header(&res, "access-control-allow-origin").as_deref(),
        Some("https://app.test")
    );
    assert_eq!(
        header(&res, "access-control-expose-headers").as_deref(),
        Some("x-trace")
    );
    let res = send_h1(addr, get("/plain", &[("origin", "https://evil.test")])).await;
    assert_eq!(header(&res, "access-control-allow-origin"), None);
    // Off for a route: its preflights go to the upstream.
    let res = send_h1(addr, preflight("/off", "https://app.test", "PUT")).await;
    assert_eq!(res.status(), 299);

    // Enabled for a share of requests: refused by name; the last good routes serve on.
    let partial = CorsPolicy {
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator: 50,
                denominator: 0,
            }),
            runtime_key: String::new(),
        }),
        ..merged
    };
    let nack = serve(&server, type_url::ROUTE, routes(partial))
        .await
        .expect("NACK");
    assert!(
        nack.contains("routes `web-routes`") && nack.contains("filter_enabled"),
        "{nack}"
    );
    let res = send_h1(addr, preflight("/merged", "https://app.test", "PATCH")).await;
    assert_eq!(
        header(&res, "access-control-allow-methods").as_deref(),
        Some("PATCH")
    );
    server.shutdown().await;
}

/// What a request through a route split over `backend` and `backend-b` (both the one
/// upstream, each cluster with header rules of its own) came to: the `x-side` the upstream
/// saw and the one the response carries, and the `x-order` values in the order added.
async fn through_split(addr: SocketAddr) -> (Vec<String>, String, Vec<String>) {
    let res = send_h1(addr, get("/", &[("x-noop-echo", "headers")])).await;
    assert_eq!(res.status(), 200);
    let answered = res.headers()["x-side"].to_str().unwrap().to_owned();
    let echo = text(res.into_body()).await;
    // Each side's own host goes upstream in the client's place.
    assert_eq!(echoed(&echo, "host"), [format!("{answered}.backend")]);
    (echoed(&echo, "x-side"), answered, echoed(&echo, "x-order"))
}

/// Each side of the split seen, every request carrying its own side's rules, applied before
/// the route's (Envoy's order).
async fn each_side_gets_its_rules(addr: SocketAddr) {
    let mut sides = std::collections::BTreeSet::new();
    // Two sides of equal weight: 40 draws all on one side would be a 1 in 2^39 chance.
    for _ in 0..40 {
        let (sent, answered, order) = through_split(addr).await;
        assert_eq!(
            sent,
            [answered.as_str()],
            "one draw for the request and its answer"
        );
        assert_eq!(order, ["cluster", "route"]);
        sides.insert(answered);
    }
    assert_eq!(sides.into_iter().collect::<Vec<_>>(), ["a", "b"]);
}

/// Requests carrying `x-pick: N` go to side `a` for an even N and `b` for an odd one (two
/// sides of weight 1: N modulo the total weight, 2, picks).
async fn a_number_picks_the_side(addr: SocketAddr) {
    for (pick, side) in [("0", "a"), ("1", "b"), ("4", "a"), ("7", "b")] {
        for _ in 0..3 {
            let res = send_h1(addr, get("/", &[("x-pick", pick)])).await;
            assert_eq!(res.headers()["x-side"], side, "x-pick: {pick}");
        }
    }
}

/// Header rules on the clusters of `weighted_clusters`, as Envoy Gateway writes them for a
/// backend's own filters, and a header's number picking the cluster
/// (`random_value_specifier`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_clusters_carry_header_rules_of_their_own() {
    use envoy_types::pb::envoy::config::route::v3::{WeightedCluster, weighted_cluster};

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let side = |cluster: &str, name: &str| weighted_cluster::ClusterWeight {
        name: cluster.into(),
        weight: Some(UInt32Value { value: 1 }),
        request_headers_to_add: vec![
            header("x-side", name, true),
            header("x-order", "cluster", false),
        ],
        response_headers_to_add: vec![header("x-side", name, true)],
        host_rewrite_specifier: Some(
            weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(format!(
                "{name}.backend"
            )),
        ),
        ..Default::default()
    };
    let mut route = resources::forward("/", "backend");
    route.request_headers_to_add = vec![header("x-order", "route", false)];
    let Some(route::Action::Route(action)) = &mut route.action else {
        unreachable!()
    };
    action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
        WeightedCluster {
            clusters: vec![side("backend", "a"), side("backend-b", "b")],
            random_value_specifier: Some(weighted_cluster::RandomValueSpecifier::HeaderName(
                "x-pick".into(),
            )),
            ..Default::default()
        },
    ));
    let config = resources::route_config("web-routes", vec![route]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&config))]);
    let clusters = ["backend", "backend-b"];
    server.set(
        type_url::CLUSTER,
        (clusters.iter())
            .map(|c| {
                (
                    c.to_string(),
                    any(&eds_cluster(c, cluster::LbPolicy::RoundRobin)),
                )
            })
            .collect(),
    );
    server.set(
        type_url::ENDPOINT,
        (clusters.iter())
            .map(|c| {
                (
                    c.to_string(),
                    any(&resources::assignment(c, &[upstream.local_addr()])),
                )
            })
            .collect(),
    );
    server.set(
        type_url::LISTENER,
        vec![(
            "web".into(),
            any(&resources::listener(
                "web",
                "127.0.0.1:0".parse().unwrap(),
                "web-routes",
            )),
        )],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    let addr = bound(&proxy).await;
    eventually("both clusters in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    each_side_gets_its_rules(addr).await;
    a_number_picks_the_side(addr).await;
    server.shutdown().await;
}

/// A route whose cluster a request header names (`cluster_header`), its
/// `cluster_not_found_response_code` answering a header that names none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_header_names_the_cluster_over_xds() {
    let (a, b) = (
        NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
        NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
    );
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut route = resources::forward("/", "unused");
    let Some(route::Action::Route(action)) = &mut route.action else {
        unreachable!()
    };
    action.cluster_specifier = Some(route_action::ClusterSpecifier::ClusterHeader(
        "x-cluster".into(),
    ));
    action.cluster_not_found_response_code =
        route_action::ClusterNotFoundResponseCode::NotFound as i32;
    let config = resources::route_config("web-routes", vec![route]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&config))]);
    let clusters = [("svc-a", a.local_addr()), ("svc-b", b.local_addr())];
    server.set(
        type_url::CLUSTER,
        (clusters.iter())
            .map(|(c, _)| {
                (
                    c.to_string(),
                    any(&eds_cluster(c, cluster::LbPolicy::RoundRobin)),
                )
            })
            .collect(),
    );
    server.set(
        type_url::ENDPOINT,
        (clusters.iter())
            .map(|(c, addr)| (c.to_string(), any(&resources::assignment(c, &[*addr]))))
            .collect(),
    );
    server.set(
        type_url::LISTENER,
        vec![(
            "web".into(),
            any(&resources::listener(
                "web",
                "127.0.0.1:0".parse().unwrap(),
                "web-routes",
            )),
        )],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    let addr = bound(&proxy).await;
    eventually("both clusters in force", async || {
        let a_up = send_h1(addr, get("/", &[("x-cluster", "svc-a")]))
            .await
            .status()
            == 200;
        a_up && send_h1(addr, get("/", &[("x-cluster", "svc-b")]))
            .await
            .status()
            == 200
    })
    .await;
    for (name, upstream) in [("svc-a", &a), ("svc-b", &b)] {
        let r = send_h2(addr, get_h2("/", &[("x-cluster", name)])).await;
        assert_eq!(
            r.headers()["x-noop-served-by"],
            upstream.local_addr().to_string().as_str()
        );
    }
    for headers in [&[][..], &[("x-cluster", "svc-c")][..]] {
        let r = send_h1(addr, get("/", headers)).await;
        assert_eq!(r.status(), 404, "{headers:?}");
        assert_eq!(text(r.into_body()).await, "cluster not found\n");
    }
    server.shutdown().await;
}

/// A route's `internal_redirect_policy` from the management server: the upstream's 302 is
/// followed to the location's route (its header rules applied to the request sent on), once
/// per route with the `previous_routes` predicate; a predicate not known here is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_redirects_over_xds() {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::config::route::v3::InternalRedirectPolicy;

    let (old, new) = (
        NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
        NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap(),
    );
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let predicate = |type_url: &str| TypedExtensionConfig {
        name: "predicate".into(),
        typed_config: Some(envoy_types::pb::google::protobuf::Any {
            type_url: type_url.into(),
            value: Vec::new(),
        }),
    };
    let routes = |predicate_url: &str| {
        let mut from = resources::forward("/old", "old");
        let Some(route::Action::Route(action)) = &mut from.action else {
            unreachable!()
        };
        action.internal_redirect_policy = Some(InternalRedirectPolicy {
            max_internal_redirects: Some(envoy_types::pb::google::protobuf::UInt32Value {
                value: 3,
            }),
            predicates: vec![predicate(predicate_url)],
            ..Default::default()
        });
        let mut to = resources::forward("/new", "new");
        to.request_headers_to_remove =
            vec!["x-noop-status".into(), "x-noop-response-header".into()];
        resources::route_config("web-routes", vec![from, to])
    };
    const PREVIOUS_ROUTES: &str = "type.googleapis.com/envoy.extensions.internal_redirect.previous_routes.v3.PreviousRoutesConfig";
    server.set(
        type_url::ROUTE,
        vec![("web-routes".into(), any(&routes(PREVIOUS_ROUTES)))],
    );
    let clusters = [("old", old.local_addr()), ("new", new.local_addr())];
    server.set(
        type_url::CLUSTER,
        (clusters.iter())
            .map(|(c, _)| {
                (
                    c.to_string(),
                    any(&eds_cluster(c, cluster::LbPolicy::RoundRobin)),
                )
            })
            .collect(),
    );
    server.set(
        type_url::ENDPOINT,
        (clusters.iter())
            .map(|(c, addr)| (c.to_string(), any(&resources::assignment(c, &[*addr]))))
            .collect(),
    );
    server.set(
        type_url::LISTENER,
        vec![(
            "web".into(),
            any(&resources::listener(
                "web",
                "127.0.0.1:0".parse().unwrap(),
                "web-routes",
            )),
        )],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    let addr = bound(&proxy).await;
    let redirected = || {
        get(
            "/old",
            &[
                ("x-noop-status", "302"),
                ("x-noop-response-header", "location: http://web.test/new/x"),
                ("x-noop-echo", "headers"),
            ],
        )
    };
    eventually("both clusters in force", async || {
        send_h1(addr, get("/new", &[])).await.status() == 200
    })
    .await;
    let r = send_h1(addr, redirected()).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-noop-served-by"],
        new.local_addr().to_string().as_str()
    );
    let seen = text(r.into_body()).await;
    assert!(seen.starts_with("GET /new/x HTTP/1.1\n"), "{seen}");
    assert!(seen.contains("x-envoy-original-url: http://"), "{seen}");

    // A redirect back to the same route is followed once (`previous_routes`), though the
    // most would allow three: the second request's redirect goes to the client, the echo
    // of what that request was.
    let looping = get(
        "/old",
        &[
            ("x-noop-status", "302"),
            (
                "x-noop-response-header",
                "location: http://web.test/old/again",
            ),
            ("x-noop-echo", "headers"),
        ],
    );
    let r = send_h1(addr, looping).await;
    assert_eq!(r.status(), 302);
    let seen = text(r.into_body()).await;
    assert!(seen.starts_with("GET /old/again HTTP/1.1\n"), "{seen}");
    assert!(
        seen.contains("x-envoy-original-url: http://legate.test/old\n"),
        "{seen}"
    );

    // A predicate this proxy does not have: the routes are refused, naming it.
    let nack = serve(
        &server,
        type_url::ROUTE,
        (
            "web-routes".into(),
            any(&routes(
                "type.googleapis.com/envoy.extensions.internal_redirect.allow_listed_routes.v3.AllowListedRoutesConfig",
            )),
        ),
    )
    .await
    .expect("NACK");
    assert!(nack.contains("predicates[0]"), "{nack}");
    // The last good routes still serve.
    assert_eq!(send_h1(addr, redirected()).await.status(), 200);
    server.shutdown().await;
}

/// The same from the config file: `headers` on a cluster of `weighted_clusters`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_clusters_carry_header_rules_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let up = upstream.local_addr();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{up}\"] }}
  - {{ name: backend-b, endpoints: [\"{up}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http_filters:
      - headers: {{}}
    routes:
      - match: {{ prefix: / }}
        filters: {{ headers: {{ request: {{ add: {{ x-order: route }} }} }} }}
        random_value_header: x-pick
        weighted_clusters:
          - cluster: backend
            weight: 1
            host_rewrite: a.backend
            headers:
              request: {{ set: {{ x-side: a }}, add: {{ x-order: cluster }} }}
              response: {{ set: {{ x-side: a }} }}
          - cluster: backend-b
            weight: 1
            host_rewrite: b.backend
            headers:
              request: {{ set: {{ x-side: b }}, add: {{ x-order: cluster }} }}
              response: {{ set: {{ x-side: b }} }}
"
    );
    let proxy = Proxy::start(&config, 1);
    each_side_gets_its_rules(proxy.addr()).await;
    a_number_picks_the_side(proxy.addr()).await;
}

/// A prober's view of a listener whose `/ready` is the proxy's health check: 200 (no body),
/// 503 once failed by the admin, 200 again once restored; other requests (another target,
/// the same path with a query) go to the routes, their responses marked
/// `x-envoy-immediate-health-check-fail` while the proxy fails.
async fn probes_follow_the_admin(addr: SocketAddr, admin: SocketAddr) {
    const FAIL: &str = "x-envoy-immediate-health-check-fail";
    let res = send_h1(addr, get("/ready", &[])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(text(res.into_body()).await, "");
    let other = send_h1(addr, get("/other", &[])).await;
    assert_eq!(other.status(), 500);
    assert!(other.headers().get(FAIL).is_none());
    assert_eq!(send_h1(addr, get("/ready?full=1", &[])).await.status(), 500);
    assert_eq!(admin_request(admin, "POST", "/healthcheck/fail").0, 200);
    let res = send_h1(addr, get("/ready", &[])).await;
    assert_eq!(res.status(), 503);
    assert!(res.headers().get(FAIL).is_none(), "the probe's own answer");
    let other = send_h1(addr, get("/other", &[])).await;
    assert_eq!(other.status(), 500);
    assert_eq!(other.headers()[FAIL], "true");
    assert_eq!(admin_request(admin, "POST", "/healthcheck/ok").0, 200);
    assert_eq!(send_h1(addr, get("/ready", &[])).await.status(), 200);
    let other = send_h1(addr, get("/other", &[])).await;
    assert!(other.headers().get(FAIL).is_none());
}

/// Envoy Gateway's readiness listener: the `health_check` filter matching `:path` `/ready`,
/// without pass-through, before routes that answer everything else 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readiness_listener_answers_probes() {
    use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
    use envoy_types::pb::envoy::extensions::filters::http::health_check::v3::HealthCheck;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let probe = |pass_through: bool| HealthCheck {
        pass_through_mode: Some(BoolValue {
            value: pass_through,
        }),
        headers: vec![HeaderMatcher {
            name: ":path".into(),
            header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
                StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact("/ready".into())),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }],
        ..Default::default()
    };
    let listener = |check: HealthCheck| {
        let filter = HttpFilter {
            name: "envoy.filters.http.health_check".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(&check))),
            ..Default::default()
        };
        let l = resources::listener_with_filters(
            "web",
            "127.0.0.1:0".parse().unwrap(),
            "unused",
            vec![filter],
        );
        with_manager(("web".into(), any(&l)), |hcm| {
            let mut routes = resources::route_config("ready_route", vec![]);
            routes.virtual_hosts[0].routes = vec![resources::direct("/", 500)];
            hcm.route_specifier =
                Some(http_connection_manager::RouteSpecifier::RouteConfig(routes));
        })
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener(probe(false))).await, None);
    let addr = bound(&proxy).await;
    probes_follow_the_admin(addr, proxy.admin.unwrap()).await;
    // A probe passed through to the upstream (with its cache) is not done here: refused.
    let nack = serve_listener(&server, listener(probe(true)))
        .await
        .expect("NACK");
    assert!(
        nack.contains("listener `web`") && nack.contains("pass_through_mode: true"),
        "{nack}"
    );
    assert_eq!(send_h1(addr, get("/ready", &[])).await.status(), 200);
    server.shutdown().await;
}

/// The same from the config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_check_filter_from_the_file() {
    let proxy = Proxy::start(
        "admin: { address: 127.0.0.1:0 }
listeners:
  - name: ready
    address: 127.0.0.1:0
    http_filters:
      - health_check: { path: /ready }
    routes:
      - match: { prefix: / }
        direct_response: { status: 500 }
",
        1,
    );
    probes_follow_the_admin(proxy.addr(), proxy.admin.unwrap()).await;
}

/// The host a request routes by and the upstream gets: `strip_any_host_port` or
/// `strip_matching_host_port`, and `strip_trailing_host_dot`, from the connection manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_lose_the_port_and_dot_the_connection_manager_strips() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut routes =
        resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    routes.virtual_hosts[0].domains = vec!["a.example".into()];
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let listener = |any_port: bool| {
        let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
        with_manager(("web".into(), any(&l)), |hcm| {
            if any_port {
                hcm.strip_port_mode = Some(
                    http_connection_manager::StripPortMode::StripAnyHostPort(true),
                );
            } else {
                hcm.strip_matching_host_port = true;
            }
            hcm.strip_trailing_host_dot = true;
        })
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener(true)).await, None);
    let addr = bound(&proxy).await;
    let host_seen = async |addr: SocketAddr, host: &str| {
        let mut req = get("/", &[("x-noop-echo", "headers")]);
        req.headers_mut().insert("host", host.parse().unwrap());
        let res = send_h1(addr, req).await;
        assert_eq!(res.status(), 200);
        echoed(&text(res.into_body()).await, "host")
    };
    eventually("the routes in force", async || {
        let mut req = get("/", &[]);
        req.headers_mut()
            .insert("host", "a.example".parse().unwrap());
        send_h1(addr, req).await.status() == 200
    })
    .await;
    assert_eq!(host_seen(addr, "a.example.:9999").await, ["a.example"]);
    assert_eq!(host_seen(addr, "a.example:1").await, ["a.example"]);

    // Only the listener's own port.
    assert_eq!(serve_listener(&server, listener(false)).await, None);
    let mut addr = addr;
    eventually("the matching port only stripped", async || {
        addr = bound(&proxy).await;
        host_seen(addr, "a.example:1").await == ["a.example:1"]
    })
    .await;
    let own = format!("a.example.:{}", addr.port());
    assert_eq!(host_seen(addr, &own).await, ["a.example"]);
    server.shutdown().await;
}

/// An HTTP/2 upload to `path` that sends one frame, then stalls for `stall` before finishing:
/// `Ok(status)`, or `Err(elapsed)` when the proxy reset the stream first.
async fn stalled_upload(addr: SocketAddr, path: &str, stall: Duration) -> Result<u16, Duration> {
    let (mut sender, _connection) = h2_client(addr).await;
    let (mut body, channel) =
        http_body_util::channel::Channel::<bytes::Bytes, std::convert::Infallible>::new(1);
    let request = http::Request::post(format!("http://legate.test{path}"))
        .body(channel)
        .unwrap();
    let started = std::time::Instant::now();
    let response = tokio::spawn(sender.send_request(request));
    body.send_data(bytes::Bytes::from_static(&[7; 100]))
        .await
        .unwrap();
    // Paced, not synchronised: the stall is what is tested. A reset ends the wait early.
    let mut response = response;
    tokio::select! {
        answer = &mut response => {
            return match answer.unwrap() {
                Ok(res) => Ok(res.status().as_u16()),
                Err(_) => Err(started.elapsed()),
            };
        }
        () = tokio::time::sleep(stall) => {}
    }
    let _ = body.send_data(bytes::Bytes::from_static(&[7; 100])).await;
    drop(body);
    match response.await.unwrap() {
        Ok(res) => Ok(res.status().as_u16()),
        Err(_) => Err(started.elapsed()),
    }
}

/// Routes' idle timeouts over the listener's `stream_idle_timeout` of 2 s: `/patient`'s
/// (an hour) lets a 3 s stall finish, `/impatient`'s (200 ms) resets the stream well before
/// the listener's would; `/plain` keeps the listener's.
async fn route_idle_timeouts_hold(addr: SocketAddr, admin: SocketAddr) {
    assert_eq!(
        stalled_upload(addr, "/patient", Duration::from_secs(3)).await,
        Ok(200)
    );
    let reset = stalled_upload(addr, "/impatient", Duration::from_secs(10))
        .await
        .expect_err("reset");
    assert!(reset < Duration::from_millis(1900), "{reset:?}");
    let reset = stalled_upload(addr, "/plain", Duration::from_secs(10))
        .await
        .expect_err("reset");
    assert!(reset >= Duration::from_secs(2), "{reset:?}");
    assert_eq!(stat(admin, "downstream_rq_idle_timeout"), 2);
}

/// Route idle timeouts as Envoy Gateway writes them (`route.idle_timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_idle_timeouts_from_the_management_server() {
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let with_idle = |prefix: &str, seconds: i64, nanos: i32| {
        let mut route = resources::forward(prefix, "backend");
        let Some(route::Action::Route(action)) = &mut route.action else {
            unreachable!()
        };
        action.idle_timeout = Some(PbDuration { seconds, nanos });
        route
    };
    let routes = resources::route_config(
        "web-routes",
        vec![
            with_idle("/patient", 3600, 0),
            with_idle("/impatient", 0, 200_000_000),
            resources::forward("/", "backend"),
        ],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let listener = with_manager(("web".into(), any(&l)), |hcm| {
        hcm.stream_idle_timeout = Some(PbDuration {
            seconds: 2,
            nanos: 0,
        });
    });
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    route_idle_timeouts_hold(addr, proxy.admin.unwrap()).await;
    server.shutdown().await;
}

/// The same from the config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_idle_timeouts_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http: {{ stream_idle_timeout: 2s }}
    routes:
      - {{ match: {{ prefix: /patient }}, cluster: backend, idle_timeout: 1h }}
      - {{ match: {{ prefix: /impatient }}, cluster: backend, idle_timeout: 200ms }}
      - {{ match: {{ prefix: / }}, cluster: backend }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    route_idle_timeouts_hold(proxy.addr(), proxy.admin.unwrap()).await;
}

/// What the upstream saw of a request with `host` (and `x-forwarded-host`, if given): the
/// `host` and `x-forwarded-host` lines; `None` when no route took it (404).
async fn forwarded_host(
    addr: SocketAddr,
    host: &str,
    xfh: Option<&str>,
) -> Option<(Vec<String>, Vec<String>)> {
    let mut req = get("/origin", &[("x-noop-echo", "headers")]);
    req.headers_mut().insert("host", host.parse().unwrap());
    if let Some(xfh) = xfh {
        req.headers_mut()
            .insert("x-forwarded-host", xfh.parse().unwrap());
    }
    let res = send_h1(addr, req).await;
    if res.status() == 404 {
        return None;
    }
    assert_eq!(res.status(), 200);
    let echo = text(res.into_body()).await;
    Some((echoed(&echo, "host"), echoed(&echo, "x-forwarded-host")))
}

/// A route matching `:authority` exactly (the port is part of it), its host rewritten and the
/// client's host appended to `x-forwarded-host`.
async fn authority_routes_and_forwarded_host_hold(addr: SocketAddr) {
    let rewritten = || vec!["rewritten.internal".to_owned()];
    assert_eq!(
        forwarded_host(addr, "gateway.example", None).await,
        Some((rewritten(), vec!["gateway.example".to_owned()]))
    );
    assert_eq!(
        forwarded_host(addr, "gateway.example", Some("edge.example")).await,
        Some((rewritten(), vec!["edge.example,gateway.example".to_owned()]))
    );
    // Already the last value: not appended twice.
    assert_eq!(
        forwarded_host(addr, "gateway.example", Some("gateway.example")).await,
        Some((rewritten(), vec!["gateway.example".to_owned()]))
    );
    assert_eq!(
        forwarded_host(addr, "gateway.example:8080", None).await,
        None
    );
    assert_eq!(forwarded_host(addr, "other.example", None).await, None);
}

/// The host from a request header (left as it was without the header), or from the path
/// by a regex substitution (on the path as it came, before its own rewrite).
async fn host_rewrites_hold(addr: SocketAddr) {
    let upstream_host = async |path: &str, headers: &[(&str, &str)]| {
        let mut all = vec![("x-noop-echo", "headers")];
        all.extend_from_slice(headers);
        let res = send_h1(addr, get(path, &all)).await;
        assert_eq!(res.status(), 200);
        let echo = text(res.into_body()).await;
        (echoed(&echo, "host"), echoed(&echo, "x-forwarded-host"))
    };
    assert_eq!(
        upstream_host("/by-header", &[("x-target", "picked.internal")]).await,
        (
            vec!["picked.internal".to_owned()],
            vec!["legate.test".to_owned()]
        )
    );
    assert_eq!(
        upstream_host("/by-header", &[]).await,
        (vec!["legate.test".to_owned()], vec![])
    );
    assert_eq!(
        upstream_host("/node/42/api/x", &[]).await,
        (vec!["backend-42.svc".to_owned()], vec![])
    );
}

/// Envoy Gateway's URL host rewrite: `:authority` matched, `host_rewrite_literal` and
/// `append_x_forwarded_host`; `host_rewrite_header` and `host_rewrite_path_regex`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authority_matches_and_forwarded_host_from_the_management_server() {
    use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut route = resources::forward("/origin", "backend");
    route.r#match.as_mut().unwrap().headers = vec![HeaderMatcher {
        name: ":authority".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(
                    "gateway.example".into(),
                )),
                ..Default::default()
            },
        )),
        ..Default::default()
    }];
    let Some(route::Action::Route(action)) = &mut route.action else {
        unreachable!()
    };
    action.host_rewrite_specifier = Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
        "rewritten.internal".into(),
    ));
    action.append_x_forwarded_host = true;
    let with_rewrite = |prefix: &str, rewrite: route_action::HostRewriteSpecifier, append| {
        let mut route = resources::forward(prefix, "backend");
        let Some(route::Action::Route(action)) = &mut route.action else {
            unreachable!()
        };
        action.host_rewrite_specifier = Some(rewrite);
        action.append_x_forwarded_host = append;
        route
    };
    let by_header = with_rewrite(
        "/by-header",
        route_action::HostRewriteSpecifier::HostRewriteHeader("X-Target".into()),
        true,
    );
    let by_path = with_rewrite(
        "/node/",
        route_action::HostRewriteSpecifier::HostRewritePathRegex(
            envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute {
                pattern: Some(envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher {
                    regex: "^/node/([0-9]+)/api.*".into(),
                    ..Default::default()
                }),
                substitution: "backend-\\1.svc".into(),
            },
        ),
        false,
    );
    let routes = resources::route_config("web-routes", vec![route, by_header, by_path]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        forwarded_host(addr, "gateway.example", None)
            .await
            .is_some()
    })
    .await;
    authority_routes_and_forwarded_host_hold(addr).await;
    host_rewrites_hold(addr).await;
    server.shutdown().await;
}

/// The same from the config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authority_matches_and_forwarded_host_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match:
          prefix: /origin
          headers: [{{ name: \":authority\", exact: gateway.example }}]
        cluster: backend
        host_rewrite: rewritten.internal
        append_x_forwarded_host: true
      - match: {{ prefix: /by-header }}
        cluster: backend
        host_rewrite_header: x-target
        append_x_forwarded_host: true
      - match: {{ prefix: /node/ }}
        cluster: backend
        host_rewrite_path_regex: {{ pattern: \"^/node/([0-9]+)/api.*\", substitution: \"backend-\\\\1.svc\" }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    authority_routes_and_forwarded_host_hold(proxy.addr()).await;
    host_rewrites_hold(proxy.addr()).await;
}

/// What a request to the rate-limited routes gets: its status and `x-ratelimit-remaining`.
async fn limited(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let res = send_h1(addr, get(path, headers)).await;
    let remaining = res
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (res.status().as_u16(), remaining)
}

/// Descriptors as Envoy Gateway writes a BackendTrafficPolicy's local rate limit rules: one
/// bucket for requests whose headers match, one per distinct value of a header, one per
/// client within a range (in shadow mode), and routes whose default bucket is not enforced.
async fn descriptors_hold(addr: SocketAddr, admin: SocketAddr) {
    // Matching headers: two an hour, with the draft's headers on each answer.
    let one = [("x-user-id", "one"), ("x-org-id", "foo")];
    assert_eq!(limited(addr, "/a", &one).await, (200, "1".into()));
    assert_eq!(limited(addr, "/a", &one).await, (200, "0".into()));
    let refused = send_h1(addr, get("/a", &one)).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-ratelimit-limit"], "2");
    assert_eq!(refused.headers()["x-rate-limited-by"], "edge");
    // Only one of the two headers: the rule does not describe the request; the default
    // bucket (1000) takes it.
    assert_eq!(limited(addr, "/a", &one[..1]).await, (200, "999".into()));
    // A bucket per tenant.
    let t1 = [("x-tenant", "t1")];
    assert_eq!(limited(addr, "/a", &t1).await.0, 200);
    assert_eq!(limited(addr, "/a", &t1).await.0, 429);
    assert_eq!(limited(addr, "/a", &[("x-tenant", "t2")]).await.0, 200);
    // Shadow mode: over the limit, counted, let through.
    for _ in 0..3 {
        assert_eq!(limited(addr, "/b", &[]).await.0, 200);
    }
    assert_eq!(
        stat_settled(admin, "http_local_rate_limit_shadow_mode", 2),
        2
    );
    // Not enforced: over the limit, counted, let through.
    let enforced = stat(admin, "http_local_rate_limit_enforced");
    let over = stat(admin, "http_local_rate_limit_rate_limited");
    for _ in 0..3 {
        assert_eq!(limited(addr, "/c", &[]).await.0, 200);
    }
    assert_eq!(
        stat_settled(admin, "http_local_rate_limit_rate_limited", over + 2),
        over + 2
    );
    assert_eq!(stat(admin, "http_local_rate_limit_enforced"), enforced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_rate_limit_descriptors_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
    use envoy_types::pb::envoy::config::route::v3::{
        HeaderMatcher, RateLimit, header_matcher, rate_limit,
    };
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        LocalRateLimitDescriptor, rate_limit_descriptor,
    };
    use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        AddressMatcher, StringMatcher, string_matcher,
    };
    use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, TokenBucket};
    use envoy_types::pb::google::protobuf::Duration as PbDuration;
    use envoy_types::pb::xds::core::v3::CidrRange;
    use rate_limit::action::{self, ActionSpecifier};

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let bucket = |max: u32, seconds: i64| TokenBucket {
        max_tokens: max,
        tokens_per_fill: Some(UInt32Value { value: max }),
        fill_interval: Some(PbDuration { seconds, nanos: 0 }),
    };
    let percent = |numerator| {
        Some(RuntimeFractionalPercent {
            default_value: Some(FractionalPercent {
                numerator,
                denominator: 0,
            }),
            ..Default::default()
        })
    };
    let entry = |key: &str, value: &str| rate_limit_descriptor::Entry {
        key: key.into(),
        value: value.into(),
    };
    let descriptor = |entries, max, shadow_mode| LocalRateLimitDescriptor {
        entries,
        token_bucket: Some(bucket(max, 3600)),
        shadow_mode,
    };
    let header_is = |name: &str, value: &str| HeaderMatcher {
        name: name.into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(value.into())),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    let header_value_match = |key: &str, name: &str, value: &str| rate_limit::Action {
        action_specifier: Some(ActionSpecifier::HeaderValueMatch(
            action::HeaderValueMatch {
                descriptor_key: key.into(),
                descriptor_value: key.into(),
                expect_match: Some(BoolValue { value: true }),
                headers: vec![header_is(name, value)],
                ..Default::default()
            },
        )),
    };
    let in_range = |key: &str, value: &str| rate_limit::Action {
        action_specifier: Some(ActionSpecifier::RemoteAddressMatch(
            action::RemoteAddressMatch {
                descriptor_key: key.into(),
                descriptor_value: value.into(),
                address_matcher: Some(AddressMatcher {
                    ranges: vec![CidrRange {
                        address_prefix: "127.0.0.0".into(),
                        prefix_len: Some(UInt32Value { value: 8 }),
                    }],
                    invert_match: false,
                }),
                ..Default::default()
            },
        )),
    };
    let base = LocalRateLimit {
        stat_prefix: "http_local_rate_limiter".into(),
        token_bucket: Some(bucket(1000, 60)),
        filter_enabled: percent(100),
        filter_enforced: percent(100),
        enable_x_ratelimit_headers: 1, // DRAFT_VERSION_03
        always_consume_default_token_bucket: Some(BoolValue { value: false }),
        ..Default::default()
    };
    let a = LocalRateLimit {
        descriptors: vec![
            descriptor(
                vec![
                    entry("rule-0-match-0", "rule-0-match-0"),
                    entry("rule-0-match-1", "rule-0-match-1"),
                ],
                2,
                false,
            ),
            descriptor(vec![entry("rule-1-tenant", "")], 1, false),
        ],
        rate_limits: vec![
            RateLimit {
                actions: vec![
                    header_value_match("rule-0-match-0", "x-user-id", "one"),
                    header_value_match("rule-0-match-1", "x-org-id", "foo"),
                ],
                ..Default::default()
            },
            RateLimit {
                actions: vec![rate_limit::Action {
                    action_specifier: Some(ActionSpecifier::RequestHeaders(
                        action::RequestHeaders {
                            header_name: "x-tenant".into(),
                            descriptor_key: "rule-1-tenant".into(),
                            skip_if_absent: false,
                        },
                    )),
                }],
                ..Default::default()
            },
        ],
        response_headers_to_add: vec![header("x-rate-limited-by", "edge", true)],
        ..base.clone()
    };
    let b = LocalRateLimit {
        descriptors: vec![descriptor(
            vec![
                entry("rule-0-masked", "127.0.0.0/8"),
                entry("rule-0-client", ""),
            ],
            1,
            true,
        )],
        rate_limits: vec![RateLimit {
            actions: vec![
                in_range("rule-0-masked", "127.0.0.0/8"),
                in_range("rule-0-client", "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%"),
            ],
            ..Default::default()
        }],
        ..base.clone()
    };
    let c = LocalRateLimit {
        token_bucket: Some(bucket(1, 3600)),
        filter_enforced: percent(0),
        ..base.clone()
    };
    let with_limit = |prefix: &str, limit: &LocalRateLimit| {
        let mut route = resources::forward(prefix, "backend");
        route
            .typed_per_filter_config
            .insert("envoy.filters.http.local_ratelimit".into(), any(limit));
        route
    };
    let routes = |a: &LocalRateLimit| {
        (
            "web-routes".to_owned(),
            any(&resources::route_config(
                "web-routes",
                vec![
                    with_limit("/a", a),
                    with_limit("/b", &b),
                    with_limit("/c", &c),
                    resources::forward("/", "backend"),
                ],
            )),
        )
    };
    server.set(type_url::ROUTE, vec![routes(&a)]);
    serve_backend(&server, upstream.local_addr());
    // Envoy Gateway's listener entry: no bucket, no share enabled; the routes say.
    let listener_filter = HttpFilter {
        name: "envoy.filters.http.local_ratelimit".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&LocalRateLimit {
            stat_prefix: "http_local_rate_limiter".into(),
            max_dynamic_descriptors: Some(UInt32Value { value: 10000 }),
            ..Default::default()
        }))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![listener_filter],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    descriptors_hold(addr, proxy.admin.unwrap()).await;

    // A descriptor's bucket that never fills, and buckets per connection: refused by name,
    // the routes in force serving on.
    let mut never = a.clone();
    never.descriptors[0]
        .token_bucket
        .as_mut()
        .unwrap()
        .fill_interval = Some(PbDuration::default());
    let nack = serve(&server, type_url::ROUTE, routes(&never))
        .await
        .expect("NACK");
    assert!(
        nack.contains("descriptors[0].token_bucket.fill_interval"),
        "{nack}"
    );
    let per_connection = LocalRateLimit {
        local_rate_limit_per_downstream_connection: true,
        ..a.clone()
    };
    let nack = serve(&server, type_url::ROUTE, routes(&per_connection))
        .await
        .expect("NACK");
    assert!(
        nack.contains("local_rate_limit_per_downstream_connection"),
        "{nack}"
    );
    assert_eq!(limited(addr, "/a", &[("x-tenant", "t1")]).await.0, 429);
    server.shutdown().await;
}

/// The same from the config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_rate_limit_descriptors_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let limit = |own: &str| {
        format!(
            "{{ token_bucket: {{ max_tokens: 1000, fill_interval: 60s }}, x_ratelimit_headers: always, always_consume_default_token_bucket: false, {own} }}"
        )
    };
    let a = limit(
        "descriptors: [
              { entries: [{ key: m0, value: m0 }, { key: m1, value: m1 }], token_bucket: { max_tokens: 2, fill_interval: 1h } },
              { entries: [{ key: tenant }], token_bucket: { max_tokens: 1, fill_interval: 1h } } ],
            rate_limits: [
              { actions: [
                  { header_value_match: { descriptor_key: m0, descriptor_value: m0, headers: [{ name: x-user-id, exact: one }] } },
                  { header_value_match: { descriptor_key: m1, descriptor_value: m1, headers: [{ name: x-org-id, exact: foo }] } } ] },
              { actions: [{ request_headers: { header_name: x-tenant, descriptor_key: tenant } }] } ],
            response_headers: { set: { x-rate-limited-by: edge } }",
    );
    let b = limit(
        "descriptors: [{ entries: [{ key: r }, { key: ip }], token_bucket: { max_tokens: 1, fill_interval: 1h }, shadow_mode: true }],
            rate_limits: [{ actions: [
              { remote_address_match: { descriptor_key: r, descriptor_value: 127.0.0.0/8, ranges: [127.0.0.0/8] } },
              { remote_address_match: { descriptor_key: ip, descriptor_value: '%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%', ranges: [127.0.0.0/8] } } ] }]",
    );
    let c = "{ token_bucket: { max_tokens: 1, fill_interval: 1h }, enforced: 0% }";
    let proxy = Proxy::start(
        &format!(
            "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: backend
    endpoints: [{}]
listeners:
  - name: web
    address: 127.0.0.1:0
    http_filters:
      - local_rate_limit: {{}}
    routes:
      - match: {{ prefix: /a }}
        cluster: backend
        filters:
          local_rate_limit: {a}
      - match: {{ prefix: /b }}
        cluster: backend
        filters:
          local_rate_limit: {b}
      - match: {{ prefix: /c }}
        cluster: backend
        filters:
          local_rate_limit: {c}
      - match: {{ prefix: / }}
        cluster: backend
",
            upstream.local_addr()
        ),
        1,
    );
    descriptors_hold(proxy.addr(), proxy.admin.unwrap()).await;
}

/// A request timeout of 300 ms: a body that stalls gets 408 (HTTP/1.1: and the connection
/// closed; HTTP/2: the stream answered), well before the stream idle timeout; a body that
/// ends in time waits for a slow upstream as long as the route allows.
async fn request_timeouts_hold(addr: SocketAddr) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    stream
        .write_all(b"POST / HTTP/1.1\r\nhost: legate.test\r\ncontent-length: 10\r\n\r\nabcde")
        .await
        .unwrap();
    let bytes = tokio::time::timeout(LIMIT, read_until_closed(&mut stream))
        .await
        .expect("the proxy closes the connection");
    let answer = String::from_utf8_lossy(&bytes);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.ends_with("request timeout\n"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(
        stalled_upload(addr, "/", Duration::from_secs(10)).await,
        Ok(408)
    );
    let slow_upstream = http::Request::post("/")
        .header("host", "legate.test")
        .header("x-noop-delay", "600ms")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"whole",
        )))
        .unwrap();
    let res = send_h1(addr, slow_upstream).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["x-noop-request-bytes"], "5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_from_the_management_server() {
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    // Envoy Gateway's ClientTrafficPolicy `requestReceivedTimeout`.
    let listener = with_manager(("web".into(), any(&l)), |hcm| {
        hcm.request_timeout = Some(PbDuration {
            seconds: 0,
            nanos: 300_000_000,
        });
        hcm.stream_idle_timeout = Some(PbDuration {
            seconds: 3600,
            nanos: 0,
        });
    });
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    request_timeouts_hold(addr).await;
    server.shutdown().await;
}

/// The same from the config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = Proxy::start(
        &format!(
            "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: backend
    endpoints: [{}]
  - name: backend_h2
    endpoints: [{}]
    protocol: http2
listeners:
  - name: web
    address: 127.0.0.1:0
    http: {{ request_timeout: 300ms, stream_idle_timeout: 1h }}
    routes:
      - match: {{ prefix: /h2 }}
        cluster: backend_h2
      - match: {{ prefix: / }}
        cluster: backend
",
            upstream.local_addr(),
            upstream.local_addr()
        ),
        1,
    );
    request_timeouts_hold(proxy.addr()).await;
    // Relayed to an HTTP/2 upstream, whose stream reset keeps no cause: 408 all the same.
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(b"POST /h2 HTTP/1.1\r\nhost: legate.test\r\ncontent-length: 10\r\n\r\nabcde")
        .await
        .unwrap();
    let bytes = tokio::time::timeout(LIMIT, read_until_closed(&mut stream))
        .await
        .expect("the proxy closes the connection");
    let answer = String::from_utf8_lossy(&bytes);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

/// The spans Envoy Gateway's tracing asks for: every request sampled, tagged with a literal,
/// a request header (or its default) and an environment variable's default; exported to
/// the collector its provider names, called by the provider's authority with its metadata.
async fn listener_tracing_holds(addr: SocketAddr, collector: &testbed::OtlpCollector) {
    assert_eq!(
        send_h1(addr, get("/traced", &[("x-request-id", "r-1")]))
            .await
            .status(),
        200
    );
    assert_eq!(send_h1(addr, get("/traced", &[])).await.status(), 200);
    let traced =
        |s: &&testbed::ReceivedSpan| s.kind == 2 && s.attributes["http.url"].ends_with("/traced");
    assert!(
        collector
            .wait_for(LIMIT, |spans| spans.iter().filter(traced).count() >= 2)
            .await
    );
    let spans = collector.spans();
    let ingress: Vec<_> = spans.iter().filter(traced).collect();
    let mut ids: Vec<&str> = ingress
        .iter()
        .map(|s| s.attributes["req1"].as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["-", "r-1"],
        "the header's value, or the default without it"
    );
    for span in ingress {
        assert_eq!(span.attributes["literal1"], "value1");
        assert_eq!(span.attributes["env1"], "fallback");
        assert_eq!(span.service_name, "gateway.edge");
        assert_eq!(span.resource["deployment.environment"], "test");
    }
    let caller = &collector.callers()[0];
    assert_eq!(caller.authority, "otel-collector.monitoring.svc");
    assert_eq!(caller.headers["x-tenant-id"], "tenant-123");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_manager_tracing_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::config::trace::v3::{OpenTelemetryConfig, tracing};
    use envoy_types::pb::envoy::extensions::tracers::opentelemetry::resource_detectors::v3::StaticConfigResourceDetectorConfig;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
    use envoy_types::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
    use envoy_types::pb::envoy::r#type::v3::Percent;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let collector = testbed::OtlpCollector::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    server.set(
        type_url::CLUSTER,
        vec![
            (
                "backend".into(),
                any(&eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            ),
            (
                "tracing-0".into(),
                any(&eds_cluster("tracing-0", cluster::LbPolicy::RoundRobin)),
            ),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            (
                "backend".into(),
                any(&resources::assignment("backend", &[upstream.local_addr()])),
            ),
            (
                "tracing-0".into(),
                any(&resources::assignment(
                    "tracing-0",
                    &[collector.local_addr()],
                )),
            ),
        ],
    );
    let tag = |name: &str, kind: custom_tag::Type| CustomTag {
        tag: name.into(),
        r#type: Some(kind),
    };
    let tracing = |spawn_upstream_span: bool| Tracing {
        client_sampling: Some(Percent { value: 0.0 }),
        random_sampling: Some(Percent { value: 100.0 }),
        overall_sampling: Some(Percent { value: 100.0 }),
        spawn_upstream_span: Some(BoolValue {
            value: spawn_upstream_span,
        }),
        custom_tags: vec![
            tag(
                "env1",
                custom_tag::Type::Environment(custom_tag::Environment {
                    name: "LEGATE_TEST_UNSET_VARIABLE".into(),
                    default_value: "fallback".into(),
                }),
            ),
            tag(
                "literal1",
                custom_tag::Type::Literal(custom_tag::Literal {
                    value: "value1".into(),
                }),
            ),
            tag(
                "req1",
                custom_tag::Type::RequestHeader(custom_tag::Header {
                    name: "X-Request-Id".into(),
                    default_value: "-".into(),
                }),
            ),
        ],
        provider: Some(tracing::Http {
            name: "envoy.tracers.opentelemetry".into(),
            config_type: Some(tracing::http::ConfigType::TypedConfig(any(
                &OpenTelemetryConfig {
                    grpc_service: Some(GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: "tracing-0".into(),
                                authority: "otel-collector.monitoring.svc".into(),
                                ..Default::default()
                            },
                        )),
                        initial_metadata: vec![HeaderValue {
                            key: "X-Tenant-ID".into(),
                            value: "tenant-123".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    service_name: "gateway.edge".into(),
                    resource_detectors: vec![TypedExtensionConfig {
                        name: "envoy.tracers.opentelemetry.resource_detectors.static_config".into(),
                        typed_config: Some(any(&StaticConfigResourceDetectorConfig {
                            attributes: [("deployment.environment".to_owned(), "test".to_owned())]
                                .into(),
                        })),
                    }],
                    ..Default::default()
                },
            ))),
        }),
        ..Default::default()
    };
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let traced = |t: Tracing| {
        with_manager(("web".into(), any(&l)), move |hcm| {
            hcm.tracing = Some(t);
        })
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, traced(tracing(true))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    listener_tracing_holds(addr, &collector).await;
    // No upstream spans asked for: refused by name, the listener in force serving on.
    let nack = serve_listener(&server, traced(tracing(false)))
        .await
        .expect("NACK");
    assert!(nack.contains("spawn_upstream_span: false"), "{nack}");
    assert_eq!(send_h1(addr, get("/", &[])).await.status(), 200);

    // Envoy Gateway's sampler: parent based over always on decides instead of a random
    // share of 0%; a sampler Legate does not have is refused by name.
    let with_sampler = |name: &str, sampler: Any| {
        let mut t = tracing(true);
        t.random_sampling = Some(Percent { value: 0.0 });
        if let Some(tracing::Http {
            config_type: Some(tracing::http::ConfigType::TypedConfig(provider)),
            ..
        }) = &mut t.provider
        {
            let mut otel = OpenTelemetryConfig::decode(provider.value.as_slice()).unwrap();
            otel.sampler = Some(
                envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig {
                    name: name.into(),
                    typed_config: Some(sampler),
                },
            );
            *provider = any(&otel);
        }
        traced(t)
    };
    let always_on = Any {
        type_url: "type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3.AlwaysOnSamplerConfig".into(),
        value: Vec::new(),
    };
    let parent_based = envoy_types::pb::envoy::extensions::tracers::opentelemetry::samplers::v3::ParentBasedSamplerConfig {
        wrapped_sampler: Some(envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig {
            name: "envoy.tracers.opentelemetry.samplers.always_on".into(),
            typed_config: Some(always_on),
        }),
    };
    assert_eq!(
        serve_listener(
            &server,
            with_sampler(
                "envoy.tracers.opentelemetry.samplers.parent_based",
                any(&parent_based)
            ),
        )
        .await,
        None
    );
    let before = collector.spans().len();
    assert_eq!(send_h1(addr, get("/sampled", &[])).await.status(), 200);
    assert!(
        collector
            .wait_for(LIMIT, |spans| spans[before..].iter().any(
                |s| s.kind == 2 && s.attributes["http.url"].ends_with("/sampled")
            ))
            .await,
        "sampled by the sampler, not the 0% share"
    );
    let dynatrace = Any {
        type_url: "type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3.DynatraceSamplerConfig".into(),
        value: Vec::new(),
    };
    let nack = serve_listener(
        &server,
        with_sampler("envoy.tracers.opentelemetry.samplers.dynatrace", dynatrace),
    )
    .await
    .expect("NACK");
    assert!(
        nack.contains("sampler `envoy.tracers.opentelemetry.samplers.dynatrace`"),
        "{nack}"
    );
    // A route's own tracing (Envoy Gateway's telemetry per route) and span names by
    // format: the listener samples nothing, the route everything, its request span named by
    // its own format, its tries by the listener's.
    let mut named = tracing(true);
    named.random_sampling = Some(Percent { value: 0.0 });
    named.operation = "%REQ(:AUTHORITY)%%PATH(NQ:ORIG)%".into();
    named.upstream_operation = "%UPSTREAM_HOST_NAME%%PATH(NQ:PATH)%".into();
    let mut own = resources::forward("/own", "backend");
    own.tracing = Some(envoy_types::pb::envoy::config::route::v3::Tracing {
        random_sampling: Some(envoy_types::pb::envoy::r#type::v3::FractionalPercent {
            numerator: 100,
            denominator: 0,
        }),
        custom_tags: vec![tag(
            "literal1",
            custom_tag::Type::Literal(custom_tag::Literal {
                value: "route".into(),
            }),
        )],
        operation: "custom-%REQ(x-custom)%".into(),
        ..Default::default()
    });
    let routes =
        resources::route_config("web-routes", vec![own, resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    assert_eq!(serve_listener(&server, traced(named)).await, None);
    let custom = ("x-custom", "abc");
    eventually("the route's own tracing in force", async || {
        send_h1(addr, get("/own", &[custom])).await.status() == 200
            && collector.spans().iter().any(|s| s.name == "custom-abc")
    })
    .await;
    // The listener's share for another route: nothing; the route's next request is.
    let before = collector.spans().len();
    // Read whole, so that its span, were it sampled, is recorded before the next request's.
    let plain = send_h1(addr, get("/plain", &[custom])).await;
    assert_eq!(plain.status(), 200);
    text(plain.into_body()).await;
    assert_eq!(
        send_h1(addr, get("/own/next", &[custom])).await.status(),
        200
    );
    assert!(
        collector
            .wait_for(LIMIT, |spans| spans[before..].iter().any(
                |s| s.kind == 2 && s.attributes["http.url"].ends_with("/own/next")
            ))
            .await
    );
    let spans = collector.spans();
    let recent = &spans[before..];
    assert!(
        !recent.iter().any(|s| s
            .attributes
            .get("http.url")
            .is_some_and(|u| u.ends_with("/plain"))),
        "{recent:#?}"
    );
    let server_span = recent
        .iter()
        .find(|s| s.kind == 2 && s.attributes["http.url"].ends_with("/own/next"))
        .unwrap();
    assert_eq!(server_span.name, "custom-abc");
    assert_eq!(server_span.attributes["literal1"], "route");
    assert_eq!(
        server_span.attributes["env1"], "fallback",
        "the listener's other tags"
    );
    let try_span = recent
        .iter()
        .find(|s| s.kind == 3 && s.trace_id == server_span.trace_id)
        .unwrap();
    assert_eq!(try_span.name, format!("{}/own/next", upstream.local_addr()));
    server.shutdown().await;
}

/// The same from the config file: the process's collector, the listener's tags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listener_tracing_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let collector = testbed::OtlpCollector::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = Proxy::start(
        &format!(
            "admin: {{ address: 127.0.0.1:0 }}
tracing:
  otlp:
    endpoint: {}
    authority: otel-collector.monitoring.svc
    headers: {{ x-tenant-id: tenant-123 }}
  service_name: gateway.edge
  resource_attributes: {{ deployment.environment: test }}
clusters:
  - name: backend
    endpoints: [{}]
listeners:
  - name: web
    address: 127.0.0.1:0
    tracing:
      random_sampling: 100
      custom_tags:
        - {{ tag: env1, environment: {{ name: LEGATE_TEST_UNSET_VARIABLE, default_value: fallback }} }}
        - {{ tag: literal1, literal: value1 }}
        - {{ tag: req1, request_header: {{ name: x-request-id, default_value: '-' }} }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
",
            collector.grpc_endpoint(),
            upstream.local_addr()
        ),
        1,
    );
    listener_tracing_holds(proxy.addr(), &collector).await;
}

/// Envoy Gateway's HTTPRoute cookie matches (its `http-route` scenario): a route whose
/// cookies all match, or the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_match_cookies_from_the_management_server() {
    use envoy_types::pb::envoy::config::route::v3::CookieMatcher;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        RegexMatcher, StringMatcher, string_matcher,
    };

    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let cookie = |name: &str, pattern: string_matcher::MatchPattern| CookieMatcher {
        name: name.into(),
        string_match: Some(StringMatcher {
            match_pattern: Some(pattern),
            ..Default::default()
        }),
        invert_match: false,
    };
    let mut matched = resources::direct("/", 200);
    if let Some(m) = matched.r#match.as_mut() {
        m.cookies = vec![
            cookie(
                "cookie-1",
                string_matcher::MatchPattern::Exact("xxx".into()),
            ),
            cookie(
                "cookie-2",
                string_matcher::MatchPattern::SafeRegex(RegexMatcher {
                    regex: "foo.*".into(),
                    ..Default::default()
                }),
            ),
        ];
    }
    let routes = resources::route_config("web-routes", vec![matched, resources::direct("/", 404)]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    let status = async |cookie: &str| {
        send_h1(addr, get("/", &[("cookie", cookie)]))
            .await
            .status()
    };
    eventually("the routes in force", async || {
        status("cookie-1=xxx; cookie-2=foobar").await == 200
    })
    .await;
    assert_eq!(status("cookie-2=foobar; cookie-1=xxx").await, 200);
    assert_eq!(status("cookie-1=xxx; cookie-2=bar").await, 404);
    assert_eq!(status("cookie-1=xxx").await, 404);
    server.shutdown().await;
}

/// The upstream that served a request to `path` with `headers`, and the `set-cookie` sent
/// back, if any.
async fn served_by(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (String, Option<String>) {
    let res = send_h1(addr, get(path, headers)).await;
    assert_eq!(res.status(), 200, "{path} {headers:?}");
    let cookie = res
        .headers()
        .get("set-cookie")
        .map(|c| c.to_str().unwrap().to_owned());
    let by = res.headers()["x-noop-served-by"]
        .to_str()
        .unwrap()
        .to_owned();
    (by, cookie)
}

/// Requests alike stay on one host of the ring-hash cluster `sticky` (four hosts) and on one
/// side of a `use_hash_policy` split, while different keys spread; a client without the
/// cookie gets one made, and the cookie then keeps it on one host; a round-robin cluster's
/// route makes no cookie (its policy never asks for the hash, as in Envoy).
async fn hash_policies_hold(addr: SocketAddr) {
    let mut hosts = std::collections::BTreeSet::new();
    let mut sides = std::collections::BTreeSet::new();
    for user in 0..16 {
        let user = format!("user-{user}");
        let headers = [("x-user", user.as_str())];
        let (first, cookie) = served_by(addr, "/sticky", &headers).await;
        assert_eq!(cookie, None, "the header was enough: no cookie made");
        let (side, _) = served_by(addr, "/split", &headers).await;
        for _ in 0..4 {
            assert_eq!(
                served_by(addr, "/sticky", &headers).await.0,
                first,
                "{user}"
            );
            assert_eq!(served_by(addr, "/split", &headers).await.0, side, "{user}");
        }
        hosts.insert(first);
        sides.insert(side);
    }
    // Sixteen keys all on one of four hosts (or one of two sides): 1 in 4^15 (2^15).
    assert!(hosts.len() > 1, "keys spread over the hosts: {hosts:?}");
    assert_eq!(sides.len(), 2, "keys spread over both sides");

    let (_, made) = served_by(addr, "/sticky", &[]).await;
    let made = made.expect("a cookie made for a client without one");
    let value = made
        .strip_prefix("session=\"")
        .and_then(|rest| rest.split_once('"'))
        .map(|(value, attributes)| {
            assert_eq!(attributes, "; Max-Age=60; Path=/; HttpOnly");
            value.to_owned()
        })
        .unwrap_or_else(|| panic!("a set-cookie as Envoy writes it: {made}"));
    assert_eq!(value.len(), 16, "{value}");
    let cookie = format!("session=\"{value}\"");
    let (host, again) = served_by(addr, "/sticky", &[("cookie", &cookie)]).await;
    assert_eq!(again, None, "the client sent the cookie: none made");
    for _ in 0..8 {
        assert_eq!(
            served_by(addr, "/sticky", &[("cookie", &cookie)]).await.0,
            host
        );
    }
    let (_, none) = served_by(addr, "/round-robin", &[]).await;
    assert_eq!(none, None, "a round-robin cluster asks for no hash");
}

/// Four upstreams, each answering with its own address.
async fn four_upstreams() -> Vec<testbed::NoopHandle> {
    let mut upstreams = Vec::new();
    for _ in 0..4 {
        upstreams.push(
            NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
                .await
                .unwrap(),
        );
    }
    upstreams
}

/// Istio's consistent-hash destination rules and Envoy Gateway's: a route's `hash_policy`
/// (a header, terminal; a cookie with a `ttl`), a split drawn by it (`use_hash_policy`);
/// `filter_state` and a header's `regex_rewrite` are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_policies_from_the_management_server() {
    use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
    use envoy_types::pb::envoy::config::route::v3::{WeightedCluster, weighted_cluster};

    let upstreams = four_upstreams().await;
    let addrs: Vec<SocketAddr> = upstreams.iter().map(|u| u.local_addr()).collect();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let by_user = HashPolicy {
        policy_specifier: Some(hash_policy::PolicySpecifier::Header(hash_policy::Header {
            header_name: "X-User".into(),
            regex_rewrite: None,
        })),
        terminal: true,
    };
    let by_cookie = HashPolicy {
        policy_specifier: Some(hash_policy::PolicySpecifier::Cookie(hash_policy::Cookie {
            name: "session".into(),
            ttl: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 60,
                nanos: 0,
            }),
            path: "/".into(),
            attributes: Vec::new(),
        })),
        terminal: false,
    };
    let with_policy = |prefix: &str, cluster: &str, policy: Vec<HashPolicy>| {
        let mut route = resources::forward(prefix, cluster);
        let Some(route::Action::Route(action)) = &mut route.action else {
            unreachable!()
        };
        action.hash_policy = policy;
        route
    };
    let sticky = with_policy(
        "/sticky",
        "sticky",
        vec![by_user.clone(), by_cookie.clone()],
    );
    let round_robin = with_policy("/round-robin", "backend", vec![by_cookie.clone()]);
    let mut split = with_policy("/split", "sticky", vec![by_user.clone()]);
    let Some(route::Action::Route(action)) = &mut split.action else {
        unreachable!()
    };
    let side = |cluster: &str| weighted_cluster::ClusterWeight {
        name: cluster.into(),
        weight: Some(UInt32Value { value: 1 }),
        ..Default::default()
    };
    action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
        WeightedCluster {
            clusters: vec![side("side-a"), side("side-b")],
            random_value_specifier: Some(weighted_cluster::RandomValueSpecifier::UseHashPolicy(
                BoolValue { value: true },
            )),
            ..Default::default()
        },
    ));
    let routes = resources::route_config("web-routes", vec![sticky, round_robin, split]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    let clusters = [
        ("sticky", cluster::LbPolicy::RingHash, &addrs[..]),
        ("backend", cluster::LbPolicy::RoundRobin, &addrs[..1]),
        ("side-a", cluster::LbPolicy::RoundRobin, &addrs[..1]),
        ("side-b", cluster::LbPolicy::RoundRobin, &addrs[1..2]),
    ];
    server.set(
        type_url::CLUSTER,
        (clusters.iter())
            .map(|(name, policy, _)| (name.to_string(), any(&eds_cluster(name, *policy))))
            .collect(),
    );
    server.set(
        type_url::ENDPOINT,
        (clusters.iter())
            .map(|(name, _, hosts)| (name.to_string(), any(&resources::assignment(name, hosts))))
            .collect(),
    );
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 2);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the clusters in force", async || {
        send_h1(addr, get("/split", &[])).await.status() == 200
            && send_h1(addr, get("/sticky", &[])).await.status() == 200
    })
    .await;
    hash_policies_hold(addr).await;

    for (policy, refused) in [
        (
            hash_policy::PolicySpecifier::FilterState(hash_policy::FilterState {
                key: "io.istio.peer".into(),
            }),
            "hash_policy[0]: not supported: filter_state",
        ),
        (
            hash_policy::PolicySpecifier::Header(hash_policy::Header {
                header_name: "x-user".into(),
                regex_rewrite: Some(Default::default()),
            }),
            "hash_policy[0].header: not supported: regex_rewrite",
        ),
    ] {
        let bad = with_policy(
            "/sticky",
            "sticky",
            vec![HashPolicy {
                policy_specifier: Some(policy),
                terminal: false,
            }],
        );
        let config = resources::route_config("web-routes", vec![bad]);
        let nack = serve(
            &server,
            type_url::ROUTE,
            ("web-routes".into(), any(&config)),
        )
        .await
        .expect("refused");
        assert!(nack.contains(refused), "{nack}");
    }
    // The last good routes serve on.
    hash_policies_hold(addr).await;
    server.shutdown().await;
}

/// The same from the config file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_policies_from_the_file() {
    let upstreams = four_upstreams().await;
    let all: Vec<String> = upstreams
        .iter()
        .map(|u| format!("\"{}\"", u.local_addr()))
        .collect();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: sticky, lb_policy: ring_hash, endpoints: [{all}] }}
  - {{ name: backend, endpoints: [{first}] }}
  - {{ name: side-a, endpoints: [{first}] }}
  - {{ name: side-b, endpoints: [{second}] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: /sticky }}
        cluster: sticky
        hash_policy:
          - {{ header: x-user, terminal: true }}
          - cookie: {{ name: session, ttl: 60s, path: / }}
      - match: {{ prefix: /round-robin }}
        cluster: backend
        hash_policy: [{{ cookie: {{ name: session, ttl: 60s, path: / }} }}]
      - match: {{ prefix: /split }}
        hash_policy: [{{ header: x-user, terminal: true }}]
        use_hash_policy: true
        weighted_clusters:
          - {{ cluster: side-a, weight: 1 }}
          - {{ cluster: side-b, weight: 1 }}
",
        all = all.join(", "),
        first = all[0],
        second = all[1],
    );
    let proxy = Proxy::start(&config, 2);
    hash_policies_hold(proxy.addr()).await;
}

/// A request to `/logged` and what each logger made of it: a text line, a JSON line and an
/// OpenTelemetry record (its body, attributes and resource as Envoy Gateway configures them,
/// sent with the collector's authority and metadata).
async fn every_logger_logs(
    addr: SocketAddr,
    collector: &testbed::OtlpCollector,
    (text_path, json_path): (&std::path::Path, &std::path::Path),
) {
    let res = send_h1(addr, get("/logged", &[("user-agent", "curl/8.0")])).await;
    assert_eq!(res.status(), 200);
    text_of(res).await;
    assert_eq!(wait_for_lines(text_path, 1).await, ["GET /logged 200"]);
    let json: serde_json::Value =
        serde_json::from_str(&wait_for_lines(json_path, 1).await[0]).unwrap();
    assert_eq!(json, serde_json::json!({ "method": "GET", "code": 200 }));
    assert!(
        collector
            .wait_for_logs(LIMIT, |logs| !logs.is_empty())
            .await,
        "the collector got the record"
    );
    let record = &collector.logs()[0];
    assert_eq!(record.body, "GET /logged curl/8.0 200");
    assert_eq!(record.attributes["k8s.namespace.name"], "edge-ns");
    assert_eq!(record.attributes["k8s.pod.name"], "-", "an unset variable");
    assert_eq!(record.attributes["response_code"], "200");
    assert_eq!(record.resource["log_name"], "otel_envoy_accesslog");
    assert_eq!(record.resource["k8s.cluster.name"], "cluster-1");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    assert!(
        record.time_unix_nano <= now && now - record.time_unix_nano < 60_000_000_000,
        "the request's time"
    );
    let caller = &collector.callers()[0];
    assert_eq!(caller.authority, "otel-collector.default.svc.cluster.local");
    assert_eq!(caller.headers["authorization"], "Bearer my-api-key");
}

/// Envoy Gateway's access logs: two file loggers (text and JSON) and an OpenTelemetry one
/// whose collector is a cluster's host, all on one connection manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(deprecated)] // the deprecated forms are the ones Envoy Gateway sends
async fn open_telemetry_access_logs_from_the_management_server() {
    use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
        FileAccessLog, file_access_log,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::grpc::v3::CommonGrpcAccessLogConfig;
    use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
    use envoy_types::pb::google::protobuf::{Struct, Value, value};
    use envoy_types::pb::opentelemetry::proto::common::v1::{
        AnyValue, KeyValue, KeyValueList, any_value,
    };

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let collector = testbed::OtlpCollector::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let logs = ScratchDir::new();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    let clusters = [
        ("backend", upstream.local_addr()),
        ("accesslog-0", collector.local_addr()),
    ];
    server.set(
        type_url::CLUSTER,
        (clusters.iter())
            .map(|(name, _)| {
                let cluster = eds_cluster(name, cluster::LbPolicy::RoundRobin);
                (name.to_string(), any(&cluster))
            })
            .collect(),
    );
    server.set(
        type_url::ENDPOINT,
        (clusters.iter())
            .map(|(name, addr)| {
                (
                    name.to_string(),
                    any(&resources::assignment(name, &[*addr])),
                )
            })
            .collect(),
    );
    let (text_path, json_path) = (logs.0.join("text.log"), logs.0.join("json.log"));
    let file = |path: &std::path::Path, format: file_access_log::AccessLogFormat| AccessLog {
        name: "envoy.access_loggers.file".into(),
        config_type: Some(access_log::ConfigType::TypedConfig(any(&FileAccessLog {
            path: path.display().to_string(),
            access_log_format: Some(format),
        }))),
        ..Default::default()
    };
    let string = |text: &str| AnyValue {
        value: Some(any_value::Value::StringValue(text.into())),
    };
    let pairs = |list: &[(&str, &str)]| KeyValueList {
        values: list
            .iter()
            .map(|(key, value)| KeyValue {
                key: (*key).into(),
                value: Some(string(value)),
                ..Default::default()
            })
            .collect(),
    };
    let otel = AccessLog {
        name: "envoy.access_loggers.open_telemetry".into(),
        config_type: Some(access_log::ConfigType::TypedConfig(any(
            &OpenTelemetryAccessLogConfig {
                common_config: Some(CommonGrpcAccessLogConfig {
                    log_name: "otel_envoy_accesslog".into(),
                    transport_api_version: 2, // V3
                    grpc_service: Some(GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: "accesslog-0".into(),
                                authority: "otel-collector.default.svc.cluster.local".into(),
                                ..Default::default()
                            },
                        )),
                        initial_metadata: vec![HeaderValue {
                            key: "Authorization".into(),
                            value: "Bearer my-api-key".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                body: Some(string(
                    "%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %REQ(USER-AGENT)% %RESPONSE_CODE%",
                )),
                attributes: Some(pairs(&[
                    ("k8s.namespace.name", "%ENVIRONMENT(ENVOY_POD_NAMESPACE)%"),
                    ("k8s.pod.name", "%ENVIRONMENT(LEGATE_TEST_UNSET_POD_NAME)%"),
                    ("response_code", "%RESPONSE_CODE%"),
                ])),
                resource_attributes: Some(pairs(&[("k8s.cluster.name", "cluster-1")])),
                ..Default::default()
            },
        ))),
        ..Default::default()
    };
    let json = Struct {
        fields: [("method", "%REQ(:METHOD)%"), ("code", "%RESPONSE_CODE%")]
            .iter()
            .map(|(k, v)| {
                (
                    (*k).to_owned(),
                    Value {
                        kind: Some(value::Kind::StringValue((*v).to_owned())),
                    },
                )
            })
            .collect(),
    };
    let loggers = vec![
        file(
            &text_path,
            file_access_log::AccessLogFormat::Format(
                "%REQ(:METHOD)% %REQ(:PATH)% %RESPONSE_CODE%\n".into(),
            ),
        ),
        file(
            &json_path,
            file_access_log::AccessLogFormat::JsonFormat(json),
        ),
        otel,
    ];
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let listener = with_manager(("web".into(), any(&l)), |hcm| hcm.access_log = loggers);
    let proxy = Proxy::start_with_env(
        &bootstrap(server.local_addr()),
        1,
        &[("ENVOY_POD_NAMESPACE", "edge-ns")],
    );
    assert_eq!(serve_listener(&server, listener).await, None);
    let addr = bound(&proxy).await;
    every_logger_logs(addr, &collector, (&text_path, &json_path)).await;
    server.shutdown().await;
}

/// The same from the config file: `access_log` as a list, one logger an `otlp` collector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_telemetry_access_logs_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let collector = testbed::OtlpCollector::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let logs = ScratchDir::new();
    let (text_path, json_path) = (logs.0.join("text.log"), logs.0.join("json.log"));
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{up}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    access_log:
      - {{ path: \"{text}\", format: \"%METHOD% %PATH% %RESPONSE_CODE%\\n\" }}
      - {{ path: \"{json}\", json_format: {{ method: \"%METHOD%\", code: \"%RESPONSE_CODE%\" }} }}
      - otlp:
          endpoint: \"{endpoint}\"
          authority: otel-collector.default.svc.cluster.local
          headers: {{ authorization: Bearer my-api-key }}
          log_name: otel_envoy_accesslog
          resource_attributes: {{ k8s.cluster.name: cluster-1 }}
        format: \"%METHOD% %PATH% %REQ(USER-AGENT)% %RESPONSE_CODE%\"
        attributes:
          k8s.namespace.name: \"%ENVIRONMENT(ENVOY_POD_NAMESPACE)%\"
          k8s.pod.name: \"%ENVIRONMENT(LEGATE_TEST_UNSET_POD_NAME)%\"
          response_code: \"%RESPONSE_CODE%\"
    routes:
      - {{ match: {{ prefix: / }}, cluster: backend }}
",
        up = upstream.local_addr(),
        text = text_path.display(),
        json = json_path.display(),
        endpoint = collector.grpc_endpoint(),
    );
    let proxy = Proxy::start_with_env(&config, 1, &[("ENVOY_POD_NAMESPACE", "edge-ns")]);
    every_logger_logs(proxy.addr(), &collector, (&text_path, &json_path)).await;
}

/// The client the upstream was told of (`x-client`, filled by a header rule with
/// `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%`), and its `x-forwarded-for`; `Err(status)`
/// when the proxy refused the request.
async fn client_seen(
    addr: SocketAddr,
    headers: &[(&str, &str)],
) -> Result<(Vec<String>, Vec<String>), u16> {
    let mut all = vec![("x-noop-echo", "headers")];
    all.extend_from_slice(headers);
    let res = send_h1(addr, get("/", &all)).await;
    if res.status() != 200 {
        return Err(res.status().as_u16());
    }
    let echo = text(res.into_body()).await;
    Ok((echoed(&echo, "x-client"), echoed(&echo, "x-forwarded-for")))
}

/// A header naming the client, refusing requests without it (403).
async fn a_header_names_the_client_or_the_request_is_refused(addr: SocketAddr) {
    assert_eq!(
        client_seen(addr, &[("x-real-ip", "203.0.113.7")]).await,
        Ok((vec!["203.0.113.7".into()], vec![]))
    );
    assert_eq!(client_seen(addr, &[]).await, Err(403));
    assert_eq!(
        client_seen(addr, &[("x-real-ip", "not-an-address")]).await,
        Err(403)
    );
}

/// A header naming the client, else `x-forwarded-for`'s entry one from the right, else the
/// peer; `x-forwarded-for` goes on as it came (nothing appended).
async fn a_header_then_forwarded_for_then_the_peer(addr: SocketAddr) {
    let xff = ("x-forwarded-for", "198.51.100.1, 192.0.2.9");
    assert_eq!(
        client_seen(addr, &[("x-real-ip", "203.0.113.7"), xff]).await,
        Ok((
            vec!["203.0.113.7".into()],
            vec!["198.51.100.1, 192.0.2.9".into()]
        ))
    );
    assert_eq!(
        client_seen(addr, &[xff]).await,
        Ok((
            vec!["198.51.100.1".into()],
            vec!["198.51.100.1, 192.0.2.9".into()]
        ))
    );
    assert_eq!(
        client_seen(addr, &[]).await,
        Ok((vec!["127.0.0.1".into()], vec![]))
    );
}

/// Envoy Gateway's client IP detection (`original_ip_detection_extensions`): its custom
/// header (refusing with 403, or not) and its `xff` by trusted hops; mixed with
/// `use_remote_address`, refused as Envoy refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_detection_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::extensions::http::original_ip_detection::custom_header::v3::CustomHeaderConfig;
    use envoy_types::pb::envoy::extensions::http::original_ip_detection::xff::v3::XffConfig;
    use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut route = resources::forward("/", "backend");
    route.request_headers_to_add = vec![header(
        "x-client",
        "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%",
        true,
    )];
    let routes = resources::route_config("web-routes", vec![route]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let custom = |reject: bool| TypedExtensionConfig {
        name: "envoy.extensions.http.original_ip_detection.custom_header".into(),
        typed_config: Some(any(&CustomHeaderConfig {
            header_name: "X-Real-IP".into(),
            allow_extension_to_set_address_as_trusted: true,
            reject_with_status: reject.then_some(HttpStatus {
                code: StatusCode::Forbidden as i32,
            }),
        })),
    };
    let xff = TypedExtensionConfig {
        name: "envoy.extensions.http.original_ip_detection.xff".into(),
        typed_config: Some(any(&XffConfig {
            xff_num_trusted_hops: 1,
            skip_xff_append: Some(BoolValue { value: true }),
            ..Default::default()
        })),
    };
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let detecting = |ways: Vec<TypedExtensionConfig>, remote: bool| {
        with_manager(("web".into(), any(&l)), move |hcm| {
            hcm.original_ip_detection_extensions = ways;
            hcm.use_remote_address = Some(BoolValue { value: remote });
        })
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(&server, detecting(vec![custom(true)], false)).await,
        None
    );
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        client_seen(addr, &[("x-real-ip", "203.0.113.7")])
            .await
            .is_ok()
    })
    .await;
    a_header_names_the_client_or_the_request_is_refused(addr).await;

    assert_eq!(
        serve_listener(&server, detecting(vec![custom(false), xff.clone()], false)).await,
        None
    );
    eventually("the second way in force", async || {
        client_seen(addr, &[]).await.is_ok()
    })
    .await;
    a_header_then_forwarded_for_then_the_peer(addr).await;

    let nack = serve_listener(&server, detecting(vec![xff], true))
        .await
        .expect("NACK");
    assert!(
        nack.contains("may not be mixed with use_remote_address"),
        "{nack}"
    );
    server.shutdown().await;
}

/// The same from the config file: `http.original_ip_detection` on two listeners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ip_detection_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let listener = |name: &str, ways: &str| {
        format!(
            "  - name: {name}
    address: 127.0.0.1:0
    http:
      original_ip_detection: {ways}
    http_filters:
      - headers: {{}}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
        filters: {{ headers: {{ request: {{ set: {{ x-client: \"%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%\" }} }} }} }}
"
        )
    };
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
listeners:
{}{}",
        upstream.local_addr(),
        listener(
            "strict",
            "[{ custom_header: { name: X-Real-IP, reject_with_status: 403 } }]"
        ),
        listener(
            "chain",
            "[{ custom_header: { name: x-real-ip } }, { xff: { num_trusted_hops: 1 } }]"
        ),
    );
    let config = format!(
        "{config}{}",
        listener(
            "ranges",
            "[{ xff: { trusted_cidrs: [127.0.0.0/8, 10.0.0.0/8], append_peer: true } }]"
        )
    );
    let proxy = Proxy::start(&config, 1);
    a_header_names_the_client_or_the_request_is_refused(proxy.addrs[0]).await;
    a_header_then_forwarded_for_then_the_peer(proxy.addrs[1]).await;
    // Trusted ranges: the first entry from the right outside them, the peer appended.
    assert_eq!(
        client_seen(
            proxy.addrs[2],
            &[("x-forwarded-for", "198.51.100.1, 10.0.0.5")]
        )
        .await,
        Ok((
            vec!["198.51.100.1".into()],
            vec!["198.51.100.1, 10.0.0.5, 127.0.0.1".into()]
        ))
    );
    assert_eq!(
        client_seen(proxy.addrs[2], &[]).await,
        Ok((vec!["127.0.0.1".into()], vec![])),
        "nothing found: the peer, nothing appended"
    );
}

/// What the upstream saw of a request whose early header changes route it: `x-tenant` is
/// overwritten to `acme` before routing (the only route matches it), `x-secret` removed,
/// `x-early` appended, `x-default` added where absent.
async fn early_header_mutations_hold(addr: SocketAddr) {
    let res = send_h1(
        addr,
        get(
            "/",
            &[
                ("x-noop-echo", "headers"),
                ("x-tenant", "other"),
                ("x-secret", "s"),
                ("x-default", "mine"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200, "routed by the header set before routing");
    let echo = text(res.into_body()).await;
    assert_eq!(echoed(&echo, "x-tenant"), ["acme"]);
    assert_eq!(echoed(&echo, "x-secret"), Vec::<String>::new());
    assert_eq!(echoed(&echo, "x-default"), ["mine"]);
    assert_eq!(echoed(&echo, "x-early"), ["one"]);
    let res = send_h1(addr, get("/", &[("x-noop-echo", "headers")])).await;
    let echo = text(res.into_body()).await;
    assert_eq!(echoed(&echo, "x-default"), ["d"]);
}

/// Envoy Gateway's early header mutation (`early_header_mutation_extensions`), before the
/// route is chosen; a list that changes one header out of the rules' order is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_header_mutations_from_the_management_server() {
    use envoy_types::pb::envoy::config::common::mutation_rules::v3::{
        HeaderMutation as Mutation, header_mutation,
    };
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
    use envoy_types::pb::envoy::extensions::http::early_header_mutation::header_mutation::v3::HeaderMutation;
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut route = resources::forward("/", "backend");
    route.r#match.as_mut().unwrap().headers = vec![HeaderMatcher {
        name: "x-tenant".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact("acme".into())),
                ..Default::default()
            },
        )),
        ..Default::default()
    }];
    let routes = resources::route_config("web-routes", vec![route]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let append =
        |name: &str, value: &str, action: header_value_option::HeaderAppendAction| Mutation {
            action: Some(header_mutation::Action::Append(HeaderValueOption {
                header: Some(HeaderValue {
                    key: name.into(),
                    value: value.into(),
                    ..Default::default()
                }),
                append_action: action as i32,
                ..Default::default()
            })),
        };
    let remove = |name: &str| Mutation {
        action: Some(header_mutation::Action::Remove(name.into())),
    };
    use header_value_option::HeaderAppendAction as Action;
    let extension = |mutations: Vec<Mutation>| TypedExtensionConfig {
        name: "envoy.http.early_header_mutation.header_mutation".into(),
        typed_config: Some(any(&HeaderMutation { mutations })),
    };
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let mutating = |mutations: Vec<Mutation>| {
        with_manager(("web".into(), any(&l)), move |hcm| {
            hcm.early_header_mutation_extensions = vec![extension(mutations)];
        })
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    let good = vec![
        remove("X-Secret"),
        append("x-tenant", "acme", Action::OverwriteIfExistsOrAdd),
        append("x-early", "one", Action::AppendIfExistsOrAdd),
        append("x-default", "d", Action::AddIfAbsent),
    ];
    assert_eq!(serve_listener(&server, mutating(good)).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    early_header_mutations_hold(addr).await;
    let nack = serve_listener(
        &server,
        mutating(vec![
            append("x-a", "1", Action::AppendIfExistsOrAdd),
            remove("x-a"),
        ]),
    )
    .await
    .expect("NACK");
    assert!(nack.contains("`x-a` changed again"), "{nack}");
    early_header_mutations_hold(addr).await;
    server.shutdown().await;
}

/// The same from the config file: `http.early_header_mutation`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_header_mutations_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http:
      early_header_mutation:
        remove: [x-secret]
        set: {{ x-tenant: acme }}
        add: {{ x-early: one }}
        add_if_absent: {{ x-default: d }}
    routes:
      - match: {{ prefix: /, headers: [{{ name: x-tenant, exact: acme }}] }}
        cluster: backend
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    early_header_mutations_hold(proxy.addr()).await;
}

/// `(content-encoding, etag, decoded body length)` of `path`'s answer to a client taking
/// `accept`.
async fn fetched(addr: SocketAddr, path: &str, accept: &str) -> (String, String, usize) {
    let res = send_h1(
        addr,
        get(
            path,
            &[
                ("accept-encoding", accept),
                ("x-noop-response-header", "etag: \"v1\""),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200, "{path}");
    let header = |name: &str| {
        res.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    };
    let (encoding, etag) = (header("content-encoding"), header("etag"));
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    let len = if encoding.is_empty() {
        body.len()
    } else {
        decompress(&encoding, &body).len()
    };
    (encoding, etag, len)
}

/// Filters off by default (`disabled`), turned on per route as Envoy Gateway does: its three
/// compressors, one `compression` filter here, on for the routes whose `CompressorPerRoute`
/// says so; an ext_authz filter on for the routes with `ExtAuthzPerRoute` settings or an
/// empty `FilterConfig`, and off (no check) for the rest. Compressors that disagree on
/// their settings are refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_off_by_default_turn_on_per_route() {
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
    use envoy_types::pb::envoy::config::route::v3::FilterConfig;
    use envoy_types::pb::envoy::extensions::compression::brotli::compressor::v3::Brotli;
    use envoy_types::pb::envoy::extensions::compression::gzip::compressor::v3::Gzip;
    use envoy_types::pb::envoy::extensions::compression::zstd::compressor::v3::Zstd;
    use envoy_types::pb::envoy::extensions::filters::http::compressor::v3::{
        Compressor, CompressorOverrides, CompressorPerRoute, ResponseDirectionOverrides,
        compressor, compressor_per_route,
    };
    use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
        CheckSettings, ExtAuthz, ExtAuthzPerRoute, ext_authz, ext_authz_per_route,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let sidecar = grpc_sidecar(alice_or_401()).await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    const AUTHZ: &str = "envoy.filters.http.ext_authz/securitypolicy/default/policy";
    let libraries = [
        ("brotli", any(&Brotli::default())),
        ("gzip", any(&Gzip::default())),
        ("zstd", any(&Zstd::default())),
    ];
    let compressing = |mut route: envoy_types::pb::envoy::config::route::v3::Route| {
        for (library, _) in &libraries {
            route.typed_per_filter_config.insert(
                format!("envoy.filters.http.compressor.{library}"),
                any(&CompressorPerRoute {
                    r#override: Some(compressor_per_route::Override::Overrides(
                        CompressorOverrides {
                            response_direction_config: Some(ResponseDirectionOverrides::default()),
                            compressor_library: None,
                        },
                    )),
                }),
            );
        }
        route
    };
    let mut checked = resources::forward("/checked", "backend");
    checked.typed_per_filter_config.insert(
        AUTHZ.into(),
        any(&ExtAuthzPerRoute {
            r#override: Some(ext_authz_per_route::Override::CheckSettings(
                CheckSettings::default(),
            )),
        }),
    );
    let mut wrapped = resources::forward("/wrapped", "backend");
    wrapped
        .typed_per_filter_config
        .insert(AUTHZ.into(), any(&FilterConfig::default()));
    let routes = resources::route_config(
        "web-routes",
        vec![
            compressing(resources::forward("/zipped", "backend")),
            checked,
            wrapped,
            resources::forward("/open", "backend"),
            resources::forward("/plain", "backend"),
        ],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    server.set(
        type_url::CLUSTER,
        vec![
            (
                "backend".into(),
                any(&eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            ),
            (
                "authz".into(),
                any(&eds_cluster("authz", cluster::LbPolicy::RoundRobin)),
            ),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            (
                "backend".into(),
                any(&resources::assignment("backend", &[upstream.local_addr()])),
            ),
            (
                "authz".into(),
                any(&resources::assignment(
                    "authz",
                    &[sidecar.local_addr().unwrap()],
                )),
            ),
        ],
    );
    // Envoy Gateway's chain: the policy's ext_authz and the three compressors, all off.
    let listener = |min_lengths: [u32; 3]| {
        // Envoy Gateway names the service's authority.
        let mut authz = resources::ext_authz_filter("authz");
        authz.name = AUTHZ.into();
        authz.disabled = true;
        authz.config_type = Some(http_filter::ConfigType::TypedConfig(any(&ExtAuthz {
            services: Some(ext_authz::Services::GrpcService(GrpcService {
                target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                    grpc_service::EnvoyGrpc {
                        cluster_name: "authz".into(),
                        authority: "authz.test".into(),
                        ..Default::default()
                    },
                )),
                ..Default::default()
            })),
            ..Default::default()
        })));
        let mut chain = vec![authz];
        for ((library, config), min) in libraries.iter().zip(min_lengths) {
            let compressor = Compressor {
                compressor_library: Some(TypedExtensionConfig {
                    name: format!("envoy.compression.{library}.compressor"),
                    typed_config: Some(config.clone()),
                }),
                response_direction_config: Some(compressor::ResponseDirectionConfig {
                    common_config: Some(compressor::CommonDirectionConfig {
                        min_content_length: Some(UInt32Value { value: min }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            chain.push(HttpFilter {
                name: format!("envoy.filters.http.compressor.{library}"),
                config_type: Some(http_filter::ConfigType::TypedConfig(any(&compressor))),
                disabled: true,
                ..Default::default()
            });
        }
        let l = resources::listener_with_filters(
            "web",
            "127.0.0.1:0".parse().unwrap(),
            "web-routes",
            chain,
        );
        ("web".to_owned(), any(&l))
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener([50, 50, 50])).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/checked", &[])).await.status() == 401
    })
    .await;
    let holds = async || {
        // The noop upstream's 100-byte text body, over the 50-byte minimum.
        assert_eq!(
            fetched(addr, "/zipped", "gzip, br").await,
            ("br".into(), String::new(), 100),
            "brotli first in the chain; a strong etag dropped, as Envoy"
        );
        assert_eq!(
            fetched(addr, "/zipped", "gzip").await,
            ("gzip".into(), String::new(), 100)
        );
        assert_eq!(
            fetched(addr, "/plain", "gzip, br").await,
            (String::new(), "\"v1\"".into(), 100),
            "off where no route turns it on"
        );
        let checks = sidecar.checks();
        assert_eq!(send_h1(addr, get("/open", &[])).await.status(), 200);
        assert_eq!(
            send_h1(addr, get("/nowhere", &[])).await.status(),
            404,
            "no route: not checked either, as Envoy"
        );
        assert_eq!(sidecar.checks(), checks, "not checked where not turned on");
        assert_eq!(send_h1(addr, get("/checked", &[])).await.status(), 401);
        assert_eq!(send_h1(addr, get("/wrapped", &[])).await.status(), 401);
        let alice = send_h1(addr, get("/checked", &[("x-user", "alice")])).await;
        assert_eq!(alice.status(), 200);
        assert_eq!(sidecar.checks(), checks + 3);
        let authorities = sidecar.authorities();
        assert!(
            !authorities.is_empty() && authorities.iter().all(|a| a == "authz.test"),
            "{authorities:?}"
        );
    };
    holds().await;
    // Compressors with their own minimum, as Envoy Gateway's per-library settings: each
    // applies its own once the client's choice has picked it. gzip's 200 bytes leave the
    // 100-byte body as it is; brotli's 50 do not.
    assert_eq!(serve_listener(&server, listener([50, 200, 50])).await, None);
    eventually("gzip's own minimum in force", async || {
        fetched(addr, "/zipped", "gzip").await.0.is_empty()
    })
    .await;
    assert_eq!(
        fetched(addr, "/zipped", "gzip").await,
        (String::new(), "\"v1\"".into(), 100)
    );
    assert_eq!(
        fetched(addr, "/zipped", "gzip, br").await,
        ("br".into(), String::new(), 100)
    );
    assert_eq!(
        fetched(addr, "/zipped", "zstd").await,
        ("zstd".into(), String::new(), 100)
    );
    server.shutdown().await;
}

/// The same from the file: compression off on the virtual host, `enabled` on one route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_off_on_the_host_turns_on_for_a_route_in_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http_filters:
      - compression: {{ encodings: [br, gzip], min_content_length: 50, etag: remove }}
    virtual_hosts:
      - name: all
        domains: [\"*\"]
        filters: {{ compression: disabled }}
        routes:
          - match: {{ prefix: /zipped }}
            cluster: backend
            filters: {{ compression: enabled }}
          - match: {{ prefix: / }}
            cluster: backend
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    let addr = proxy.addr();
    assert_eq!(
        fetched(addr, "/zipped", "gzip, br").await,
        ("br".into(), String::new(), 100)
    );
    assert_eq!(
        fetched(addr, "/", "gzip, br").await,
        (String::new(), "\"v1\"".into(), 100)
    );
}

/// What the `header_mutation` filter does to a request and its response, checked through
/// the upstream's echo: the request's changes (a pattern removing `x-strip-*`), and the
/// response's, made after the route's own (`x-resp`: the filter's value wins).
async fn header_mutation_filter_holds(addr: SocketAddr) {
    let res = send_h1(
        addr,
        get(
            "/",
            &[
                ("x-noop-echo", "headers"),
                ("x-gone", "1"),
                ("x-strip-a", "1"),
                ("x-strip-b", "2"),
                ("x-set", "old"),
                ("x-noop-response-header", "token-secret: t"),
                ("x-noop-response-header", "x-kept: k"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    let h = res.headers().clone();
    assert_eq!(
        h["x-resp"], "filter",
        "the filter's change after the route's"
    );
    assert!(!h.contains_key("token-secret"), "removed by its pattern");
    assert_eq!(h["x-kept"], "k");
    let echo = text(res.into_body()).await;
    assert_eq!(echoed(&echo, "x-added"), ["v1"]);
    assert_eq!(echoed(&echo, "x-set"), ["s"]);
    assert_eq!(echoed(&echo, "x-gone"), Vec::<String>::new());
    assert_eq!(echoed(&echo, "x-strip-a"), Vec::<String>::new());
    assert_eq!(echoed(&echo, "x-strip-b"), Vec::<String>::new());
}

/// Envoy Gateway's late header mutation: the `header_mutation` filter's ordered request and
/// response mutations, with `remove_on_match`; a list that changes a header out of the order
/// they apply in here is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_mutation_filter_from_the_management_server() {
    use envoy_types::pb::envoy::config::common::mutation_rules::v3::{
        HeaderMutation as Mutation, header_mutation,
    };
    use envoy_types::pb::envoy::extensions::filters::http::header_mutation::v3::{
        HeaderMutation, Mutations,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut route = resources::forward("/", "backend");
    route.response_headers_to_add = vec![header("x-resp", "route", true)];
    let routes = resources::route_config("web-routes", vec![route]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let append = |name: &str, value: &str, set: bool| Mutation {
        action: Some(header_mutation::Action::Append(header(name, value, set))),
    };
    let remove = |name: &str| Mutation {
        action: Some(header_mutation::Action::Remove(name.into())),
    };
    let remove_on = |pattern: string_matcher::MatchPattern| Mutation {
        action: Some(header_mutation::Action::RemoveOnMatch(
            header_mutation::RemoveOnMatch {
                key_matcher: Some(StringMatcher {
                    match_pattern: Some(pattern),
                    ..Default::default()
                }),
            },
        )),
    };
    use string_matcher::MatchPattern;
    let listener = |request: Vec<Mutation>, response: Vec<Mutation>| {
        let filter = HttpFilter {
            name: "envoy.filters.http.header_mutation".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(&HeaderMutation {
                mutations: Some(Mutations {
                    request_mutations: request,
                    response_mutations: response,
                    ..Default::default()
                }),
                ..Default::default()
            }))),
            ..Default::default()
        };
        let l = resources::listener_with_filters(
            "web",
            "127.0.0.1:0".parse().unwrap(),
            "web-routes",
            vec![filter],
        );
        ("web".to_owned(), any(&l))
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    let good = || {
        listener(
            vec![
                append("x-added", "v1", false),
                append("x-set", "s", true),
                remove("x-gone"),
                remove_on(MatchPattern::Prefix("x-strip-".into())),
            ],
            vec![
                append("x-resp", "filter", true),
                remove_on(MatchPattern::Suffix("-secret".into())),
            ],
        )
    };
    assert_eq!(serve_listener(&server, good()).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    header_mutation_filter_holds(addr).await;
    for (request, refused) in [
        (
            vec![append("x-a", "1", false), remove("x-a")],
            "`x-a` changed again",
        ),
        (
            vec![
                append("x-strip-me", "1", false),
                remove_on(MatchPattern::Prefix("x-strip-".into())),
            ],
            "`x-strip-me` changed again",
        ),
    ] {
        let nack = serve_listener(&server, listener(request, Vec::new()))
            .await
            .expect("NACK");
        assert!(
            nack.contains("listener `web`") && nack.contains(refused),
            "{nack}"
        );
        header_mutation_filter_holds(addr).await;
    }
    server.shutdown().await;
}

/// The same from the file: a `header_mutation` filter, with a route's `headers` rule on the
/// response before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_mutation_filter_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http_filters:
      - header_mutation:
          request:
            add: {{ x-added: v1 }}
            set: {{ x-set: s }}
            remove: [x-gone]
            remove_matching: [{{ prefix: x-strip- }}]
          response:
            set: {{ x-resp: filter }}
            remove_matching: [{{ suffix: -secret }}]
      - headers: {{}}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
        filters: {{ headers: {{ response: {{ set: {{ x-resp: route }} }} }} }}
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    header_mutation_filter_holds(proxy.addr()).await;
}

/// An upstream that answers every request with mixed-case names, and sends each request head
/// it read, as bytes, to the test.
async fn spelling_upstream() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = stream.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head: Vec<u8> = buf.drain(..end + 4).collect();
                        let _ = heads.send(String::from_utf8_lossy(&head).into_owned());
                        let reply =
                            b"HTTP/1.1 200 OK\r\nX-Served-By: raw\r\nContent-Length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, rx)
}

/// A request with mixed-case names through the proxy on `addr`: the head the upstream read,
/// and the response the client read.
async fn spelled_exchange(
    addr: SocketAddr,
    heads: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nX-Trace-ID: 7\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let response = tokio::time::timeout(LIMIT, read_until_closed(&mut stream))
        .await
        .expect("the proxy closes the connection");
    let head = tokio::time::timeout(LIMIT, heads.recv())
        .await
        .unwrap()
        .unwrap();
    (head, String::from_utf8_lossy(&response).into_owned())
}

/// Names keep the case they came with where the listener and the cluster both say so (Envoy
/// Gateway's `preserve_case` header formatter on both), over xDS and from the file; lower case
/// otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_names_keep_their_case_where_asked() {
    use envoy_types::pb::envoy::config::core::v3::{
        Http1ProtocolOptions, TypedExtensionConfig, http1_protocol_options,
    };
    use envoy_types::pb::envoy::extensions::http::header_formatters::preserve_case::v3::PreserveCaseFormatterConfig;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
        HttpProtocolOptions as UpstreamOptions, http_protocol_options as upstream_options,
    };

    let (upstream, mut heads) = spelling_upstream().await;
    let cased = |yes: bool| {
        format!(
            "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{upstream}\"], preserve_header_case: {yes} }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http: {{ preserve_header_case: true }}
    routes:
      - match: {{ prefix: / }}
        cluster: backend
"
        )
    };
    let proxy = Proxy::start(&cased(true), 1);
    let (head, response) = spelled_exchange(proxy.addr(), &mut heads).await;
    assert!(head.contains("\r\nX-Trace-ID: 7\r\n"), "{head}");
    assert!(response.contains("\r\nX-Served-By: raw\r\n"), "{response}");
    drop(proxy);
    let proxy = Proxy::start(&cased(false), 1);
    let (head, response) = spelled_exchange(proxy.addr(), &mut heads).await;
    assert!(head.contains("\r\nx-trace-id: 7\r\n"), "{head}");
    assert!(response.contains("\r\nx-served-by: raw\r\n"), "{response}");
    drop(proxy);

    // Over xDS, as Envoy Gateway writes both sides.
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let h1 = || Http1ProtocolOptions {
        header_key_format: Some(http1_protocol_options::HeaderKeyFormat {
            header_format: Some(
                http1_protocol_options::header_key_format::HeaderFormat::StatefulFormatter(
                    TypedExtensionConfig {
                        name: "preserve_case".into(),
                        typed_config: Some(any(&PreserveCaseFormatterConfig::default())),
                    },
                ),
            ),
        }),
        ..Default::default()
    };
    let mut backend = eds_cluster("backend", cluster::LbPolicy::RoundRobin);
    backend.typed_extension_protocol_options.insert(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
        any(&UpstreamOptions {
            upstream_protocol_options: Some(
                upstream_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    upstream_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            upstream_options::explicit_http_config::ProtocolConfig::HttpProtocolOptions(h1()),
                        ),
                    },
                ),
            ),
            ..Default::default()
        }),
    );
    server.set(type_url::CLUSTER, vec![("backend".into(), any(&backend))]);
    server.set(
        type_url::ENDPOINT,
        vec![(
            "backend".into(),
            any(&resources::assignment("backend", &[upstream])),
        )],
    );
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let listener = with_manager(("web".into(), any(&l)), move |hcm| {
        hcm.http_protocol_options = Some(h1());
    });
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    while heads.try_recv().is_ok() {}
    let (head, response) = spelled_exchange(addr, &mut heads).await;
    assert!(head.contains("\r\nX-Trace-ID: 7\r\n"), "{head}");
    assert!(response.contains("\r\nX-Served-By: raw\r\n"), "{response}");
    server.shutdown().await;
}

/// Retries by the response's headers, for requests that name themselves retriable, with the
/// tries counted in the response; and retries of tries that never left (a closed port).
async fn retry_conditions_hold(addr: SocketAddr, upstream: &testbed::NoopHandle) {
    let tries = async |headers: &[(&str, &str)]| {
        let before = upstream.requests();
        let res = send_h1(addr, get("/headers", headers)).await;
        assert_eq!(res.status(), 200);
        let count = res.headers()["x-envoy-attempt-count"]
            .to_str()
            .unwrap()
            .to_owned();
        (count, upstream.requests() - before)
    };
    let flagged = ("x-noop-response-header", "x-retry-me: 1");
    assert_eq!(
        tries(&[flagged, ("x-retriable", "yes")]).await,
        ("3".into(), 3),
        "retried on the header, twice"
    );
    assert_eq!(
        tries(&[flagged]).await,
        ("1".into(), 1),
        "a request the policy does not name is not retried"
    );
    assert_eq!(tries(&[("x-retriable", "yes")]).await, ("1".into(), 1));
    // Round robin over a closed port and the upstream: every other first try fails before
    // the request leaves, and is retried on the upstream.
    let mut counts = Vec::new();
    for _ in 0..4 {
        let res = send_h1(addr, get("/unsent", &[])).await;
        assert_eq!(res.status(), 200);
        counts.push(
            res.headers()["x-envoy-attempt-count"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert!(counts.iter().all(|c| c == "1" || c == "2"), "{counts:?}");
    assert!(counts.iter().any(|c| c == "2"), "{counts:?}");
}

/// Envoy's `retriable-headers` with `retriable_headers` and `retriable_request_headers`,
/// `reset-before-request`, the `previous_priorities` retry priority (taken with its update
/// frequency; tests/failover.rs shows it moving retries between priorities), and the
/// virtual host's
/// `include_attempt_count_in_response`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_conditions_from_the_management_server() {
    use envoy_types::pb::envoy::config::route::v3::{
        HeaderMatcher, RetryPolicy, header_matcher, retry_policy,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let closed = closed_port();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let with_retries = |mut route: envoy_types::pb::envoy::config::route::v3::Route,
                        policy: RetryPolicy| {
        if let Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(action)) =
            &mut route.action
        {
            action.retry_policy = Some(policy);
        }
        route
    };
    let by_headers = RetryPolicy {
        retry_on: "retriable-headers".into(),
        num_retries: Some(UInt32Value { value: 2 }),
        retriable_headers: vec![HeaderMatcher {
            name: "x-retry-me".into(),
            header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::PresentMatch(
                true,
            )),
            ..Default::default()
        }],
        retriable_request_headers: vec![HeaderMatcher {
            name: "x-retriable".into(),
            header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
                StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact("yes".into())),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }],
        retry_back_off: Some(retry_policy::RetryBackOff {
            base_interval: Some(PbDuration {
                seconds: 0,
                nanos: 1_000_000,
            }),
            max_interval: None,
        }),
        retry_priority: Some(retry_policy::RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(Any {
                type_url: "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig".into(),
                value: vec![8, 3], // update_frequency: 3
            })),
        }),
        ..Default::default()
    };
    let unsent = RetryPolicy {
        retry_on: "reset-before-request".into(),
        num_retries: Some(UInt32Value { value: 1 }),
        retry_host_predicate: vec![retry_policy::RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: None,
        }],
        host_selection_retry_max_attempts: 3,
        ..Default::default()
    };
    let mut routes = resources::route_config(
        "web-routes",
        vec![
            with_retries(resources::forward("/headers", "backend"), by_headers),
            with_retries(resources::forward("/unsent", "flaky"), unsent),
        ],
    );
    routes.virtual_hosts[0].include_attempt_count_in_response = true;
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    server.set(
        type_url::CLUSTER,
        vec![
            (
                "backend".into(),
                any(&eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            ),
            (
                "flaky".into(),
                any(&eds_cluster("flaky", cluster::LbPolicy::RoundRobin)),
            ),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            (
                "backend".into(),
                any(&resources::assignment("backend", &[upstream.local_addr()])),
            ),
            (
                "flaky".into(),
                any(&resources::assignment(
                    "flaky",
                    &[closed.addr, upstream.local_addr()],
                )),
            ),
        ],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/headers", &[])).await.status() == 200
    })
    .await;
    retry_conditions_hold(addr, &upstream).await;
    server.shutdown().await;
}

/// The same from the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_conditions_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let closed = closed_port();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{up}\"] }}
  - {{ name: flaky, endpoints: [\"{closed}\", \"{up}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    virtual_hosts:
      - name: all
        domains: [\"*\"]
        include_attempt_count_in_response: true
        routes:
          - match: {{ prefix: /headers }}
            cluster: backend
            retry_policy:
              retry_on: [retriable-headers]
              num_retries: 2
              retriable_headers: [{{ name: x-retry-me, present: true }}]
              retriable_request_headers: [{{ name: x-retriable, exact: \"yes\" }}]
              retry_back_off: {{ base_interval: 1ms }}
          - match: {{ prefix: /unsent }}
            cluster: flaky
            retry_policy: {{ retry_on: [reset-before-request], num_retries: 1 }}
",
        up = upstream.local_addr(),
        closed = closed.addr,
    );
    let proxy = Proxy::start(&config, 1);
    retry_conditions_hold(proxy.addr(), &upstream).await;
}

/// An upstream that sends a response head and the start of its body, then nothing more
/// (the connection held open), for each request it reads.
async fn stalling_upstream() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial";
                if stream.write_all(head).await.is_err() {
                    return;
                }
                // Held until the proxy lets go.
                let _ = stream.read(&mut chunk).await;
            });
        }
    });
    addr
}

/// `max_stream_duration` of 300 ms on the listener: a slow upstream's request gets 504 in
/// time, a request whose body stops half way 408, a response whose body stalls is cut off;
/// a route with `0s` has no limit. Each is counted.
async fn stream_durations_hold(addr: SocketAddr, admin: SocketAddr) {
    let started = std::time::Instant::now();
    let res = send_h1(addr, get("/", &[("x-noop-delay", "5s")])).await;
    assert_eq!(res.status(), 504);
    assert_eq!(text(res.into_body()).await, "downstream duration timeout\n");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let res = send_h1(addr, get("/exempt", &[("x-noop-delay", "500ms")])).await;
    assert_eq!(res.status(), 200, "no limit on the route");

    // Half a body, then nothing: the request is not whole when the time runs out.
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"POST / HTTP/1.1\r\nhost: a\r\ncontent-length: 10\r\n\r\nhalf.")
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(LIMIT, stream.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");

    // The head in time, the body not: the client gets the head and a cut body.
    let res = send_h1(addr, get("/stalled", &[])).await;
    assert_eq!(res.status(), 200);
    let body = tokio::time::timeout(LIMIT, http_body_util::BodyExt::collect(res.into_body()))
        .await
        .expect("the body ends");
    assert!(body.is_err(), "a cut body");
    assert_eq!(
        stat_settled(admin, "downstream_rq_max_duration_reached", 3),
        3
    );
}

/// Envoy's `common_http_protocol_options.max_stream_duration` and a route's
/// `max_stream_duration.max_stream_duration` (`0s`: none), over xDS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_stream_duration_from_the_management_server() {
    use envoy_types::pb::envoy::config::route::v3::route_action::MaxStreamDuration;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let stalling = stalling_upstream().await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut exempt = resources::forward("/exempt", "backend");
    if let Some(envoy_types::pb::envoy::config::route::v3::route::Action::Route(action)) =
        &mut exempt.action
    {
        action.max_stream_duration = Some(MaxStreamDuration {
            max_stream_duration: Some(PbDuration::default()),
            ..Default::default()
        });
    }
    let routes = resources::route_config(
        "web-routes",
        vec![
            exempt,
            resources::forward("/stalled", "stalling"),
            resources::forward("/", "backend"),
        ],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    server.set(
        type_url::CLUSTER,
        vec![
            (
                "backend".into(),
                any(&eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            ),
            (
                "stalling".into(),
                any(&eds_cluster("stalling", cluster::LbPolicy::RoundRobin)),
            ),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            (
                "backend".into(),
                any(&resources::assignment("backend", &[upstream.local_addr()])),
            ),
            (
                "stalling".into(),
                any(&resources::assignment("stalling", &[stalling])),
            ),
        ],
    );
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let listener = with_manager(("web".into(), any(&l)), |hcm| {
        hcm.common_http_protocol_options = Some(HttpProtocolOptions {
            max_stream_duration: Some(PbDuration {
                seconds: 0,
                nanos: 300_000_000,
            }),
            ..Default::default()
        });
    });
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/exempt", &[])).await.status() == 200
    })
    .await;
    stream_durations_hold(addr, proxy.admin.unwrap()).await;
    server.shutdown().await;
}

/// The same from the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_stream_duration_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let stalling = stalling_upstream().await;
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
  - {{ name: stalling, endpoints: [\"{stalling}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http: {{ max_stream_duration: 300ms }}
    routes:
      - {{ match: {{ prefix: /exempt }}, cluster: backend, max_stream_duration: 0s }}
      - {{ match: {{ prefix: /stalled }}, cluster: stalling }}
      - {{ match: {{ prefix: / }}, cluster: backend }}
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    stream_durations_hold(proxy.addr(), proxy.admin.unwrap()).await;
}

/// A gRPC upstream (HTTP/2, cleartext) that answers every call with the request's body and
/// the trailers `grpc-status: 0`, `grpc-message: echoed`, and sends each request's
/// `content-type` and `te` to the test.
async fn grpc_echo() -> (
    SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let header = |name: &str| {
                                req.headers()
                                    .get(name)
                                    .map(|v| v.to_str().unwrap().to_owned())
                                    .unwrap_or_default()
                            };
                            let _ = seen.send((header("content-type"), header("te")));
                            let body = req.into_body().collect().await?.to_bytes();
                            let (mut tx, out) = http_body_util::channel::Channel::<
                                bytes::Bytes,
                                hyper::Error,
                            >::new(4);
                            tokio::spawn(async move {
                                let _ = tx.send_data(body).await;
                                let mut trailers = http::HeaderMap::new();
                                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                                trailers.insert(
                                    "grpc-message",
                                    http::HeaderValue::from_static("echoed"),
                                );
                                let _ = tx.send_trailers(trailers).await;
                            });
                            let mut res = http::Response::new(out);
                            res.headers_mut().insert(
                                "content-type",
                                http::HeaderValue::from_static("application/grpc"),
                            );
                            Ok::<_, hyper::Error>(res)
                        }
                    });
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
            });
        }
    });
    (addr, rx)
}

/// A gRPC message: uncompressed, its length, its bytes.
fn grpc_message(payload: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8];
    m.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    m.extend_from_slice(payload);
    m
}

/// gRPC-Web calls, binary and base64 text, answered by a gRPC upstream through the
/// `grpc_web` filter: the upstream sees gRPC, the client gets gRPC-Web with the trailers as
/// the last message.
async fn grpc_web_holds(
    addr: SocketAddr,
    seen: &mut tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let call = grpc_message(b"hello");
    let trailer = b"grpc-status:0\r\ngrpc-message:echoed\r\n";
    let mut expected = call.clone();
    expected.push(0x80);
    expected.extend_from_slice(&(trailer.len() as u32).to_be_bytes());
    expected.extend_from_slice(trailer);

    let post = |content_type: &str, accept: &str, body: Vec<u8>| {
        http::Request::post("/echo.Echo/Say")
            .header("host", "grpc.test")
            .header("content-type", content_type)
            .header("accept", accept)
            .header("x-grpc-web", "1")
            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
            .unwrap()
    };
    let res = send_h1(
        addr,
        post(
            "application/grpc-web+proto",
            "application/grpc-web",
            call.clone(),
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/grpc-web+proto");
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(
        &body[..],
        &expected[..],
        "the echo, then the trailers as a message"
    );
    assert_eq!(
        seen.recv().await.unwrap(),
        ("application/grpc".into(), "trailers".into())
    );

    let res = send_h1(
        addr,
        post(
            "application/grpc-web-text",
            "application/grpc-web-text",
            b64.encode(&call).into_bytes(),
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(
        res.headers()["content-type"],
        "application/grpc-web-text+proto"
    );
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    // Each frame is padded as it goes: decoded four characters at a time, as clients do.
    let decoded: Vec<u8> = body
        .chunks(4)
        .flat_map(|group| b64.decode(group).unwrap())
        .collect();
    assert_eq!(decoded, expected, "base64 both ways");
    assert_eq!(seen.recv().await.unwrap().0, "application/grpc");

    // Not base64: the upstream never gets it whole, and the client is told, as Envoy tells
    // it: the 400 in gRPC's form (INTERNAL), in a gRPC-Web response.
    let res = send_h1(
        addr,
        post(
            "application/grpc-web-text",
            "application/grpc-web-text",
            b"!!!!".to_vec(),
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["grpc-status"], "13", "{:?}", res.headers());
    assert_eq!(
        res.headers()["content-type"],
        "application/grpc-web-text+proto"
    );
}

/// Envoy Gateway's chain, `grpc_web` then `grpc_stats`, over xDS, to an HTTP/2 cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_from_the_management_server() {
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    let (upstream, mut seen) = grpc_echo().await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut backend = eds_cluster("backend", cluster::LbPolicy::RoundRobin);
    #[allow(deprecated)]
    {
        backend.http2_protocol_options = Some(Http2ProtocolOptions::default());
    }
    server.set(type_url::CLUSTER, vec![("backend".into(), any(&backend))]);
    server.set(
        type_url::ENDPOINT,
        vec![(
            "backend".into(),
            any(&resources::assignment("backend", &[upstream])),
        )],
    );
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    let filter = |name: &str, type_url: &str, value: Vec<u8>| HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(Any {
            type_url: type_url.into(),
            value,
        })),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![
            filter(
                "envoy.filters.http.grpc_web",
                "type.googleapis.com/envoy.extensions.filters.http.grpc_web.v3.GrpcWeb",
                Vec::new(),
            ),
            filter(
                "envoy.filters.http.grpc_stats",
                "type.googleapis.com/envoy.extensions.filters.http.grpc_stats.v3.FilterConfig",
                vec![8, 1],
            ),
        ],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() != 404
    })
    .await;
    while seen.try_recv().is_ok() {}
    grpc_web_holds(addr, &mut seen).await;
    server.shutdown().await;
}

/// The same from the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_web_from_the_file() {
    let (upstream, mut seen) = grpc_echo().await;
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{upstream}\"], protocol: http2 }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http_filters:
      - grpc_web: {{}}
    routes:
      - {{ match: {{ prefix: / }}, cluster: backend }}
"
    );
    let proxy = Proxy::start(&config, 1);
    grpc_web_holds(proxy.addr(), &mut seen).await;
}

/// A POST of `size` bytes sent chunked (no `content-length`), with the upstream echoing the
/// headers it got.
async fn chunked_post(addr: SocketAddr, path: &str, size: usize) -> (u16, String) {
    let (mut tx, body) = http_body_util::channel::Channel::<bytes::Bytes, std::io::Error>::new(2);
    tokio::spawn(async move {
        let _ = tx.send_data(bytes::Bytes::from(vec![b'x'; size])).await;
    });
    let req = http::Request::post(path)
        .header("host", "a.test")
        .header("x-noop-echo", "headers")
        .body(body)
        .unwrap();
    let res = send_h1(addr, req).await;
    let status = res.status().as_u16();
    (status, text(res.into_body()).await)
}

/// The `buffer` filter off on the listener and on for one route (Envoy Gateway's
/// BackendTrafficPolicy): a body within the limit goes upstream whole with its length, a
/// longer one is answered 413 without reaching it; other routes stream as they came.
async fn buffering_holds(addr: SocketAddr, upstream: &testbed::NoopHandle) {
    let (status, echo) = chunked_post(addr, "/buffered", 500).await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&echo, "content-length"), ["500"]);
    assert_eq!(echoed(&echo, "transfer-encoding"), Vec::<String>::new());
    let before = upstream.requests();
    let (status, body) = chunked_post(addr, "/buffered", 2000).await;
    assert_eq!((status, body.as_str()), (413, "Payload Too Large"));
    assert_eq!(upstream.requests(), before, "never sent");
    let (status, echo) = chunked_post(addr, "/streamed", 2000).await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&echo, "content-length"), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_buffering_from_the_management_server() {
    use envoy_types::pb::envoy::extensions::filters::http::buffer::v3::{
        Buffer, BufferPerRoute, buffer_per_route,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut buffered = resources::forward("/buffered", "backend");
    buffered.typed_per_filter_config.insert(
        "envoy.filters.http.buffer".into(),
        any(&BufferPerRoute {
            r#override: Some(buffer_per_route::Override::Buffer(Buffer {
                max_request_bytes: Some(UInt32Value { value: 1000 }),
            })),
        }),
    );
    let routes = resources::route_config(
        "web-routes",
        vec![buffered, resources::forward("/", "backend")],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let filter = HttpFilter {
        name: "envoy.filters.http.buffer".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&Buffer {
            max_request_bytes: Some(UInt32Value { value: 4_194_304 }),
        }))),
        disabled: true,
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![filter],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    buffering_holds(addr, &upstream).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_buffering_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http: {{ request_timeout: 300ms }}
    http_filters:
      - buffer: {{ max_request_bytes: 1000 }}
    routes:
      - {{ match: {{ prefix: /buffered }}, cluster: backend }}
      - {{ match: {{ prefix: / }}, cluster: backend, filters: {{ buffer: disabled }} }}
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    buffering_holds(proxy.addr(), &upstream).await;
    // A body that stops half way while the filter reads it: the request timeout still holds.
    let mut stream = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    stream
        .write_all(b"POST /buffered HTTP/1.1\r\nhost: a\r\ncontent-length: 10\r\n\r\nhalf.")
        .await
        .unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(LIMIT, stream.read(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}

/// A request of `method` to `path` on host `a.test` with these headers: its status.
async fn status_of(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "a.test");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    send_h1(addr, req).await.status().as_u16()
}

/// CSRF checks as Envoy Gateway's CSRF policy sets them: off on the listener (0%), on for
/// `/forms` with two more origins allowed, shadowed on `/shadow`.
async fn csrf_holds(addr: SocketAddr, admin: SocketAddr) {
    let post =
        async |path: &str, headers: &[(&str, &str)]| status_of(addr, "POST", path, headers).await;
    assert_eq!(
        post("/forms", &[("origin", "https://a.test")]).await,
        200,
        "its own origin"
    );
    assert_eq!(
        post("/forms", &[("origin", "https://evil.test")]).await,
        403
    );
    assert_eq!(
        post("/forms", &[("origin", "https://x.trusted.com")]).await,
        200
    );
    assert_eq!(
        post("/forms", &[("referer", "http://a.test/page?q")]).await,
        200
    );
    assert_eq!(post("/forms", &[]).await, 403, "no origin at all");
    assert_eq!(
        status_of(addr, "GET", "/forms", &[("origin", "https://evil.test")]).await,
        200,
        "a GET changes nothing"
    );
    assert_eq!(
        post("/", &[("origin", "https://evil.test")]).await,
        200,
        "0% here"
    );
    assert_eq!(
        post("/shadow", &[("origin", "https://evil.test")]).await,
        200,
        "counted only"
    );
    assert_eq!(stat_settled(admin, "http_csrf_request_invalid", 3), 3);
    assert_eq!(stat_settled(admin, "http_csrf_missing_source_origin", 1), 1);
    assert_eq!(stat_settled(admin, "http_csrf_request_valid", 3), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csrf_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
    use envoy_types::pb::envoy::extensions::filters::http::csrf::v3::CsrfPolicy;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        RegexMatcher, StringMatcher, string_matcher,
    };
    use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let percent = |numerator: u32| RuntimeFractionalPercent {
        default_value: Some(FractionalPercent {
            numerator,
            denominator: 0,
        }),
        runtime_key: String::new(),
    };
    let with_policy = |prefix: &str, policy: CsrfPolicy| {
        let mut route = resources::forward(prefix, "backend");
        route
            .typed_per_filter_config
            .insert("envoy.filters.http.csrf".into(), any(&policy));
        route
    };
    let forms = CsrfPolicy {
        filter_enabled: Some(percent(100)),
        shadow_enabled: None,
        additional_origins: vec![
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(
                    "www.example.com".into(),
                )),
                ..Default::default()
            },
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::SafeRegex(RegexMatcher {
                    regex: r".*\.trusted\.com".into(),
                    ..Default::default()
                })),
                ..Default::default()
            },
        ],
    };
    let shadow = CsrfPolicy {
        filter_enabled: Some(percent(0)),
        shadow_enabled: Some(percent(100)),
        additional_origins: Vec::new(),
    };
    let routes = resources::route_config(
        "web-routes",
        vec![
            with_policy("/forms", forms),
            with_policy("/shadow", shadow),
            resources::forward("/", "backend"),
        ],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let filter = HttpFilter {
        name: "envoy.filters.http.csrf".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&CsrfPolicy {
            filter_enabled: Some(RuntimeFractionalPercent::default()),
            ..Default::default()
        }))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![filter],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        status_of(addr, "GET", "/forms", &[]).await == 200
    })
    .await;
    csrf_holds(addr, proxy.admin.unwrap()).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csrf_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http_filters:
      - csrf: {{ enabled: 0% }}
    routes:
      - match: {{ prefix: /forms }}
        cluster: backend
        filters:
          csrf: {{ additional_origins: [{{ exact: www.example.com }}, {{ regex: \".*\\\\.trusted\\\\.com\" }}] }}
      - {{ match: {{ prefix: /shadow }}, cluster: backend, filters: {{ csrf: {{ enabled: 0%, shadow: 100% }} }} }}
      - {{ match: {{ prefix: / }}, cluster: backend }}
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    csrf_holds(proxy.addr(), proxy.admin.unwrap()).await;
}

/// A WebSocket upgrade the listener is told to ignore goes upstream as a plain request.
async fn ignored_upgrades_hold(addr: SocketAddr) {
    let res = send_h1(
        addr,
        get(
            "/",
            &[
                ("x-noop-echo", "headers"),
                ("connection", "upgrade"),
                ("upgrade", "websocket"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    let echo = text(res.into_body()).await;
    assert_eq!(echoed(&echo, "upgrade"), Vec::<String>::new(), "{echo}");
}

/// Envoy Gateway's `ignore_http_11_upgrade`, `scheme_header_transformation.match_upstream`
/// (what this proxy does) and HTTP/2 `connection_idle_interval` (nothing a server sends)
/// taken; a fixed `scheme_to_overwrite` refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_ignored_and_schemes_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::{
        Http1ProtocolOptions, KeepaliveSettings, SchemeHeaderTransformation,
        scheme_header_transformation,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
    use envoy_types::pb::google::protobuf::Duration as PbDuration;
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let listener = |overwrite: Option<&'static str>| {
        with_manager(("web".into(), any(&l)), move |hcm| {
            hcm.upgrade_configs = vec![http_connection_manager::UpgradeConfig {
                upgrade_type: "websocket".into(),
                ..Default::default()
            }];
            hcm.http_protocol_options = Some(Http1ProtocolOptions {
                ignore_http_11_upgrade: vec![StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact("websocket".into())),
                    ..Default::default()
                }],
                ..Default::default()
            });
            hcm.http2_protocol_options = Some(Http2ProtocolOptions {
                connection_keepalive: Some(KeepaliveSettings {
                    interval: Some(PbDuration {
                        seconds: 60,
                        nanos: 0,
                    }),
                    timeout: Some(PbDuration {
                        seconds: 10,
                        nanos: 0,
                    }),
                    connection_idle_interval: Some(PbDuration {
                        seconds: 30,
                        nanos: 0,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
            hcm.scheme_header_transformation = Some(SchemeHeaderTransformation {
                match_upstream: true,
                transformation: overwrite.map(|s| {
                    scheme_header_transformation::Transformation::SchemeToOverwrite(s.into())
                }),
            });
        })
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, listener(None)).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
    })
    .await;
    ignored_upgrades_hold(addr).await;
    let nack = serve_listener(&server, listener(Some("https")))
        .await
        .expect("NACK");
    assert!(nack.contains("scheme_to_overwrite"), "{nack}");
    ignored_upgrades_hold(addr).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrades_ignored_from_the_file() {
    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let config = format!(
        "admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: backend, endpoints: [\"{}\"] }}
listeners:
  - name: web
    address: 127.0.0.1:0
    http: {{ ignore_http11_upgrade: [{{ exact: websocket }}] }}
    routes:
      - {{ match: {{ prefix: / }}, cluster: backend, upgrades: [websocket] }}
",
        upstream.local_addr()
    );
    let proxy = Proxy::start(&config, 1);
    ignored_upgrades_hold(proxy.addr()).await;
}

/// Envoy Gateway's HTTP authorization: ext_authz with an `http_service` whose cluster has the
/// sidecar, a path prefix, the request headers it may see and the answer's headers that go
/// upstream on an allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_authz_http_service_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::{
        BackoffStrategy, HttpUri, RetryPolicy, http_uri,
    };
    use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
        AuthorizationResponse, ExtAuthz, HttpService, ext_authz,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        ListStringMatcher, StringMatcher, string_matcher,
    };
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let sidecar = testbed::AuthzSidecar::start(
        testbed::SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        testbed::SidecarMode::Http,
        testbed::AuthzRules {
            add_headers: vec![("x-authz-user".into(), "alice".into())],
            ..alice_or_401()
        },
    )
    .await
    .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    server.set(
        type_url::CLUSTER,
        vec![
            (
                "backend".into(),
                any(&eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            ),
            (
                "authz".into(),
                any(&eds_cluster("authz", cluster::LbPolicy::RoundRobin)),
            ),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            (
                "backend".into(),
                any(&resources::assignment("backend", &[upstream.local_addr()])),
            ),
            (
                "authz".into(),
                any(&resources::assignment(
                    "authz",
                    &[sidecar.local_addr().unwrap()],
                )),
            ),
        ],
    );
    let exact = |name: &str| StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Exact(name.into())),
        ignore_case: true,
    };
    let authz = ExtAuthz {
        services: Some(ext_authz::Services::HttpService(HttpService {
            server_uri: Some(HttpUri {
                uri: "http://authz.test/auth".into(),
                timeout: Some(PbDuration {
                    seconds: 10,
                    nanos: 0,
                }),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster("authz".into())),
            }),
            path_prefix: "/authz".into(),
            authorization_response: Some(AuthorizationResponse {
                allowed_upstream_headers: Some(ListStringMatcher {
                    patterns: vec![exact("x-authz-user"), exact("x-ext-authz-saw")],
                }),
                ..Default::default()
            }),
            ..Default::default()
        })),
        allowed_headers: Some(ListStringMatcher {
            patterns: vec![exact("x-user")],
        }),
        transport_api_version: 2,
        ..Default::default()
    };
    let filter = HttpFilter {
        name: "envoy.filters.http.ext_authz".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&authz))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![filter],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 401
    })
    .await;
    let res = send_h1(
        addr,
        get(
            "/orders?id=7",
            &[("x-user", "alice"), ("x-noop-echo", "headers")],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    let echo = text(res.into_body()).await;
    assert_eq!(echoed(&echo, "x-authz-user"), ["alice"]);
    assert_eq!(echoed(&echo, "x-ext-authz-saw"), ["GET /authz/orders?id=7"]);
    assert_eq!(
        send_h1(addr, get("/orders", &[("x-user", "eve")]))
            .await
            .status(),
        401
    );

    // Envoy Gateway's retry policy and path override: a second service whose first check
    // fails (a 503, which is an error, 403, unless retried).
    let flaky = testbed::AuthzSidecar::start(
        testbed::SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        testbed::SidecarMode::Http,
        testbed::AuthzRules {
            failing_first: 1,
            ..alice_or_401()
        },
    )
    .await
    .unwrap();
    server.set(
        type_url::CLUSTER,
        vec![
            (
                "backend".into(),
                any(&eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            ),
            (
                "authz".into(),
                any(&eds_cluster("authz", cluster::LbPolicy::RoundRobin)),
            ),
            (
                "flaky".into(),
                any(&eds_cluster("flaky", cluster::LbPolicy::RoundRobin)),
            ),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            (
                "backend".into(),
                any(&resources::assignment("backend", &[upstream.local_addr()])),
            ),
            (
                "authz".into(),
                any(&resources::assignment(
                    "authz",
                    &[sidecar.local_addr().unwrap()],
                )),
            ),
            (
                "flaky".into(),
                any(&resources::assignment(
                    "flaky",
                    &[flaky.local_addr().unwrap()],
                )),
            ),
        ],
    );
    let mut authz = authz;
    if let Some(ext_authz::Services::HttpService(http)) = &mut authz.services {
        if let Some(uri) = &mut http.server_uri {
            uri.http_upstream_type = Some(http_uri::HttpUpstreamType::Cluster("flaky".into()));
        }
        http.path_prefix.clear();
        http.path_override = "/auth/hello".into();
        http.retry_policy = Some(RetryPolicy {
            num_retries: Some(envoy_types::pb::google::protobuf::UInt32Value { value: 2 }),
            retry_on: "5xx,deadline-exceeded,internal,unavailable".into(),
            retry_back_off: Some(BackoffStrategy {
                base_interval: Some(PbDuration {
                    seconds: 0,
                    nanos: 5_000_000,
                }),
                max_interval: None,
            }),
            ..Default::default()
        });
    }
    let filter = HttpFilter {
        name: "envoy.filters.http.ext_authz".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&authz))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![filter],
    );
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    let alice = || {
        get(
            "/orders",
            &[("x-user", "alice"), ("x-noop-echo", "headers")],
        )
    };
    eventually("the flaky service asked", async || {
        let res = send_h1(addr, alice()).await;
        assert_eq!(res.status(), 200, "a failed check was not retried");
        echoed(&text(res.into_body()).await, "x-ext-authz-saw") == ["GET /auth/hello"]
    })
    .await;
    assert_eq!(flaky.checks(), 2);

    // A policy this proxy cannot honour is refused by name.
    if let Some(ext_authz::Services::HttpService(http)) = &mut authz.services
        && let Some(policy) = &mut http.retry_policy
    {
        policy.host_selection_retry_max_attempts = 3;
    }
    let filter = HttpFilter {
        name: "envoy.filters.http.ext_authz".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&authz))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![filter],
    );
    let nack = serve_listener(&server, ("web".into(), any(&l))).await;
    assert!(
        nack.as_deref()
            .is_some_and(|r| r.contains("host_selection_retry_max_attempts")),
        "{nack:?}"
    );
    server.shutdown().await;
}

/// Envoy Gateway's gRPC authorization with its retry policy (`grpc_service.retry_policy`):
/// a call failed with UNAVAILABLE is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_authz_grpc_retries_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::{
        BackoffStrategy, GrpcService, RetryPolicy, grpc_service,
    };
    use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{ExtAuthz, ext_authz};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::google::protobuf::Duration as PbDuration;

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let flaky = testbed::AuthzSidecar::start(
        testbed::SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        testbed::SidecarMode::Grpc,
        testbed::AuthzRules {
            failing_first: 1,
            ..alice_or_401()
        },
    )
    .await
    .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let routes = resources::route_config("web-routes", vec![resources::forward("/", "backend")]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    let clusters = [
        ("backend", upstream.local_addr()),
        ("authz", flaky.local_addr().unwrap()),
    ];
    server.set(
        type_url::CLUSTER,
        (clusters.iter())
            .map(|(c, _)| {
                (
                    c.to_string(),
                    any(&eds_cluster(c, cluster::LbPolicy::RoundRobin)),
                )
            })
            .collect(),
    );
    server.set(
        type_url::ENDPOINT,
        (clusters.iter())
            .map(|(c, addr)| (c.to_string(), any(&resources::assignment(c, &[*addr]))))
            .collect(),
    );
    let authz = ExtAuthz {
        services: Some(ext_authz::Services::GrpcService(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: "authz".into(),
                    authority: "grpc-backend.default:9000".into(),
                    ..Default::default()
                },
            )),
            timeout: Some(PbDuration {
                seconds: 10,
                nanos: 0,
            }),
            retry_policy: Some(RetryPolicy {
                num_retries: Some(envoy_types::pb::google::protobuf::UInt32Value { value: 2 }),
                retry_on: "5xx,deadline-exceeded,internal,unavailable".into(),
                retry_back_off: Some(BackoffStrategy {
                    base_interval: Some(PbDuration {
                        seconds: 0,
                        nanos: 5_000_000,
                    }),
                    // Each call may take this long (Envoy's per-try timeout).
                    max_interval: Some(PbDuration {
                        seconds: 5,
                        nanos: 0,
                    }),
                }),
                ..Default::default()
            }),
            ..Default::default()
        })),
        transport_api_version: 2,
        ..Default::default()
    };
    let filter = HttpFilter {
        name: "envoy.filters.http.ext_authz".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&authz))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![filter],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    // The first check the service gets fails; its retry allows.
    let res = send_h1(addr, get("/", &[("x-user", "alice")])).await;
    assert_eq!(res.status(), 200);
    assert_eq!(flaky.checks(), 2);
    assert_eq!(
        send_h1(addr, get("/", &[("x-user", "eve")])).await.status(),
        401
    );
    assert_eq!(flaky.checks(), 3);
    server.shutdown().await;
}

/// Envoy Gateway's response overrides: a `custom_response` filter per policy, off in the
/// chain and turned on by routes, whose matcher picks responses by status and headers and
/// whose `LocalResponsePolicy` gives the new body and headers. A redirect policy (an internal
/// redirect) is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_responses_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::{
        SubstitutionFormatString, substitution_format_string,
    };
    use envoy_types::pb::envoy::config::route::v3::FilterConfig;
    use envoy_types::pb::envoy::extensions::filters::http::custom_response::v3::CustomResponse;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
    use envoy_types::pb::envoy::extensions::http::custom_response::local_response_policy::v3::LocalResponsePolicy;
    use envoy_types::pb::envoy::r#type::matcher::v3::HttpResponseHeaderMatchInput;
    use envoy_types::pb::xds::core::v3::TypedExtensionConfig;
    use envoy_types::pb::xds::r#type::matcher::v3::matcher::matcher_list::predicate::{
        MatchType, PredicateList, SinglePredicate, single_predicate,
    };
    use envoy_types::pb::xds::r#type::matcher::v3::matcher::matcher_list::{
        FieldMatcher, Predicate,
    };
    use envoy_types::pb::xds::r#type::matcher::v3::matcher::{
        MatcherList, MatcherType, OnMatch, on_match,
    };
    use envoy_types::pb::xds::r#type::matcher::v3::{Matcher, StringMatcher, string_matcher};

    let upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    const POLICY: &str = "envoy.filters.http.custom_response/backendtrafficpolicy/default/p";
    let mut on = resources::forward("/", "backend");
    on.typed_per_filter_config.insert(
        POLICY.into(),
        any(&FilterConfig {
            config: Some(Any::default()),
            ..Default::default()
        }),
    );
    let routes = resources::route_config(
        "web-routes",
        vec![resources::forward("/plain", "backend"), on],
    );
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    serve_backend(&server, upstream.local_addr());
    let exact = |value: &str| StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Exact(value.into())),
        ignore_case: false,
    };
    let single = |input: Any, value: StringMatcher| Predicate {
        match_type: Some(MatchType::SinglePredicate(SinglePredicate {
            input: Some(TypedExtensionConfig {
                name: "input".into(),
                typed_config: Some(input),
            }),
            matcher: Some(single_predicate::Matcher::ValueMatch(value)),
        })),
    };
    let status = || Any {
        type_url: "type.googleapis.com/envoy.type.matcher.v3.HttpResponseStatusCodeMatchInput"
            .into(),
        value: Vec::new(),
    };
    let header_input = |name: &str| {
        any(&HttpResponseHeaderMatchInput {
            header_name: name.into(),
        })
    };
    // Envoy Gateway writes the deprecated `text_format`.
    #[allow(deprecated)]
    let policy = |text: &str, content_type: &str| TypedExtensionConfig {
        name: "rule".into(),
        typed_config: Some(any(&LocalResponsePolicy {
            body_format: Some(SubstitutionFormatString {
                format: Some(substitution_format_string::Format::TextFormat(text.into())),
                ..Default::default()
            }),
            response_headers_to_add: vec![header("content-type", content_type, true)],
            ..Default::default()
        })),
    };
    let rule = |predicate: Predicate, action: TypedExtensionConfig| FieldMatcher {
        predicate: Some(predicate),
        on_match: Some(OnMatch {
            keep_matching: false,
            on_match: Some(on_match::OnMatch::Action(action)),
        }),
    };
    let custom = |rules: Vec<FieldMatcher>| CustomResponse {
        custom_response_matcher: Some(Matcher {
            on_no_match: None,
            matcher_type: Some(MatcherType::MatcherList(MatcherList { matchers: rules })),
        }),
    };
    let rules = vec![
        rule(
            single(status(), exact("404")),
            policy("gateway-1 Not Found", "text/plain"),
        ),
        rule(
            Predicate {
                match_type: Some(MatchType::AndMatcher(PredicateList {
                    predicate: vec![
                        single(status(), exact("503")),
                        single(header_input("X-Error-Type"), exact("upstream-timeout")),
                    ],
                })),
            },
            policy(r#"{"error":"combined match"}"#, "application/json"),
        ),
    ];
    let listener = |custom: &CustomResponse| {
        let filter = HttpFilter {
            name: POLICY.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(custom))),
            disabled: true,
            ..Default::default()
        };
        let l = resources::listener_with_filters(
            "web",
            "127.0.0.1:0".parse().unwrap(),
            "web-routes",
            vec![filter],
        );
        ("web".to_owned(), any(&l))
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(&server, listener(&custom(rules.clone()))).await,
        None
    );
    let addr = bound(&proxy).await;
    eventually("the routes in force", async || {
        let res = send_h1(addr, get("/", &[("x-noop-status", "404")])).await;
        text(res.into_body()).await == "gateway-1 Not Found"
    })
    .await;
    let res = send_h1(
        addr,
        get(
            "/",
            &[
                ("x-noop-status", "503"),
                ("x-noop-response-header", "x-error-type: upstream-timeout"),
            ],
        ),
    )
    .await;
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["content-type"], "application/json");
    assert_eq!(text(res.into_body()).await, r#"{"error":"combined match"}"#);
    // Where no route turns the filter on, responses stay as they are.
    let res = send_h1(addr, get("/plain", &[("x-noop-status", "404")])).await;
    assert!(
        text(res.into_body())
            .await
            .starts_with("ok: legate testbed")
    );

    // An internal redirect is refused by name.
    let mut with_redirect = rules;
    with_redirect.push(rule(
        single(status(), exact("401")),
        TypedExtensionConfig {
            name: "redirect".into(),
            typed_config: Some(Any {
                type_url: "type.googleapis.com/envoy.extensions.http.custom_response.redirect_policy.v3.RedirectPolicy".into(),
                value: Vec::new(),
            }),
        },
    ));
    let nack = serve_listener(&server, listener(&custom(with_redirect)))
        .await
        .expect("NACK");
    assert!(
        nack.contains("custom_response") && nack.contains("internal redirects"),
        "{nack}"
    );
    // An `and` of one predicate is invalid, as Envoy validates it.
    let lone = vec![rule(
        Predicate {
            match_type: Some(MatchType::AndMatcher(PredicateList {
                predicate: vec![single(status(), exact("503"))],
            })),
        },
        policy("alone", "text/plain"),
    )];
    let nack = serve_listener(&server, listener(&custom(lone)))
        .await
        .expect("NACK");
    assert!(
        nack.contains("and_matcher.predicate") && nack.contains("at least two"),
        "{nack}"
    );
    server.shutdown().await;
}

/// Envoy Gateway's HTTPRoute for CONNECT (its `http-connect-terminate` scenario): a route
/// with `connect_matcher` and a `CONNECT` upgrade with `connect_config`. The tunnel ends at
/// the proxy and reaches the backend over TCP; a `connect_config` asking for what Legate does
/// not do is NACKed by name, the last good routes serving on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_routes_from_the_management_server() {
    use envoy_types::pb::envoy::config::route::v3::route_match::ConnectMatcher;

    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let connect_route = |allow_post: bool| {
        let mut route = resources::forward("/", "backend");
        route.r#match = Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::ConnectMatcher(
                ConnectMatcher {},
            )),
            ..Default::default()
        });
        if let Some(route::Action::Route(action)) = &mut route.action {
            action.upgrade_configs = vec![route_action::UpgradeConfig {
                upgrade_type: "CONNECT".into(),
                connect_config: Some(route_action::upgrade_config::ConnectConfig {
                    allow_post,
                    ..Default::default()
                }),
                ..Default::default()
            }];
        }
        let mut config = resources::route_config("web-routes", vec![route]);
        config.virtual_hosts[0].domains = vec!["gateway.envoyproxy.io".into()];
        config.ignore_port_in_host_matching = true;
        ("web-routes".to_owned(), any(&config))
    };
    server.set(type_url::ROUTE, vec![connect_route(false)]);
    serve_backend(&server, echo_addr);
    let gateway = Manager {
        underscores: http_protocol_options::HeadersWithUnderscoresAction::RejectRequest,
        server: (
            http_connection_manager::ServerHeaderTransformation::PassThrough,
            "",
        ),
        router: Router {
            suppress_envoy_headers: true,
            ..Default::default()
        },
        stream_window: 65536,
    };
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 1);
    assert_eq!(
        serve_listener(&server, gateway_listener(&gateway)).await,
        None
    );
    let addr = bound(&proxy).await;

    let tunnel_echoes = async |addr: SocketAddr| {
        let mut stream = tokio::time::timeout(LIMIT, tokio::net::TcpStream::connect(addr))
            .await
            .unwrap()
            .unwrap();
        stream
            .write_all(b"CONNECT gateway.envoyproxy.io:443 HTTP/1.1\r\nhost: gateway.envoyproxy.io:443\r\n\r\nping")
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        let reading = async {
            while !got.ends_with(b"ping") && stream.read(&mut byte).await.unwrap() == 1 {
                got.push(byte[0]);
            }
        };
        tokio::time::timeout(LIMIT, reading)
            .await
            .expect("the tunnel answers in time");
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
        assert!(text.ends_with("\r\n\r\nping"), "the echo came back: {text}");
    };
    tunnel_echoes(addr).await;
    // A path request matches no route of this host.
    let res = send_h1(
        addr,
        http::Request::get("/")
            .header("host", "gateway.envoyproxy.io")
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap(),
    )
    .await;
    assert_eq!(res.status(), 404);

    let nack = serve(&server, type_url::ROUTE, connect_route(true))
        .await
        .expect("allow_post is refused");
    assert!(
        nack.contains("upgrade_configs[0].connect_config") && nack.contains("allow_post"),
        "{nack}"
    );
    tunnel_echoes(addr).await;
}

/// A cluster's own `hash_policy` (`HttpProtocolOptions.hash_policy`) replaces its routes':
/// requests of one tenant stay on one host of the ring-hash cluster whoever the user, and
/// tenants spread. Envoy Gateway's shape on a least-request cluster (where Envoy does not
/// read it) is taken too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_hash_policy_replaces_its_routes() {
    use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions as Upstream;

    let upstreams = four_upstreams().await;
    let addrs: Vec<SocketAddr> = upstreams.iter().map(|u| u.local_addr()).collect();
    let least_upstream = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let by_header = |name: &str| HashPolicy {
        policy_specifier: Some(hash_policy::PolicySpecifier::Header(hash_policy::Header {
            header_name: name.into(),
            regex_rewrite: None,
        })),
        terminal: false,
    };
    let mut route = resources::forward("/", "sticky");
    if let Some(route::Action::Route(action)) = &mut route.action {
        action.hash_policy = vec![by_header("x-user")];
    }
    // Copies to the ring-hash cluster follow its policy too.
    let mut other = resources::forward("/other", "least");
    if let Some(route::Action::Route(action)) = &mut other.action {
        action.request_mirror_policies = vec![route_action::RequestMirrorPolicy {
            cluster: "sticky".into(),
            ..Default::default()
        }];
    }
    let routes = resources::route_config("web-routes", vec![other, route]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    let with_policy = |name: &str, lb: cluster::LbPolicy, policy: HashPolicy| {
        let mut c = eds_cluster(name, lb);
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            any(&Upstream {
                hash_policy: vec![policy],
                ..Default::default()
            }),
        );
        (name.to_string(), any(&c))
    };
    let source_ip = HashPolicy {
        policy_specifier: Some(hash_policy::PolicySpecifier::ConnectionProperties(
            hash_policy::ConnectionProperties { source_ip: true },
        )),
        terminal: false,
    };
    server.set(
        type_url::CLUSTER,
        vec![
            with_policy("sticky", cluster::LbPolicy::RingHash, by_header("x-tenant")),
            with_policy("least", cluster::LbPolicy::LeastRequest, source_ip),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            (
                "sticky".into(),
                any(&resources::assignment("sticky", &addrs)),
            ),
            (
                "least".into(),
                any(&resources::assignment(
                    "least",
                    &[least_upstream.local_addr()],
                )),
            ),
        ],
    );
    let l = resources::listener("web", "127.0.0.1:0".parse().unwrap(), "web-routes");
    let proxy = Proxy::start(&bootstrap(server.local_addr()), 2);
    assert_eq!(serve_listener(&server, ("web".into(), any(&l))).await, None);
    let addr = bound(&proxy).await;
    eventually("the clusters in force", async || {
        send_h1(addr, get("/", &[])).await.status() == 200
            && send_h1(addr, get("/other", &[])).await.status() == 200
    })
    .await;
    let mut tenants_hosts = std::collections::BTreeSet::new();
    for tenant in 0..16 {
        let tenant = format!("tenant-{tenant}");
        let (first, _) = served_by(addr, "/", &[("x-tenant", &tenant), ("x-user", "u-0")]).await;
        for user in 1..6 {
            let user = format!("u-{user}");
            let (host, _) = served_by(addr, "/", &[("x-tenant", &tenant), ("x-user", &user)]).await;
            assert_eq!(host, first, "{tenant} stays on one host whoever the user");
        }
        tenants_hosts.insert(first);
    }
    // Sixteen tenants all on one of four hosts: 1 in 4^15.
    assert!(tenants_hosts.len() > 1, "tenants spread: {tenants_hosts:?}");

    // Eight copies of one tenant's requests: all on one host of the four.
    let before: Vec<u64> = upstreams.iter().map(|u| u.requests()).collect();
    for user in 0..8 {
        let user = format!("u-{user}");
        let res = send_h1(
            addr,
            get("/other", &[("x-tenant", "t-1"), ("x-user", &user)]),
        )
        .await;
        assert_eq!(res.status(), 200);
    }
    let mut added = Vec::new();
    eventually("the eight copies arrived", async || {
        added = (upstreams.iter().zip(&before))
            .map(|(u, b)| u.requests() - b)
            .collect();
        added.iter().sum::<u64>() == 8
    })
    .await;
    assert!(added.contains(&8), "one host took every copy: {added:?}");
}
