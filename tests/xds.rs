//! xDS: the real binary configured only by a bootstrap that names the testbed's management
//! server, serving what the server sends (listeners, routes, clusters, endpoints) over real
//! HTTP/1.1 on 127.0.0.1, in both variants of the protocol. A keep-alive client runs at a
//! steady rate through every change and must see no failure.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

mod common;

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster;
use envoy_types::pb::envoy::config::core::v3::{BindConfig, SocketAddress};
use testbed::resources::{self, eds_cluster};
use testbed::xds::{any, type_url};
use testbed::{ManagementServer, NoopUpstream};

use common::xds::*;
use common::*;

const LIMIT: Duration = Duration::from_secs(20);

/// Serves the server's config; follows endpoint, route and cluster changes; refuses an
/// unsupported cluster with a NACK and keeps serving; never fails a steady client.
async fn follows_the_management_server(protocol: &str) {
    let (one, two) = upstreams().await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    server.set(
        type_url::CLUSTER,
        vec![named(eds_cluster("backend", cluster::LbPolicy::RoundRobin))],
    );
    server.set(type_url::LISTENER, vec![listener("web", "web-routes")]);
    server.set(
        type_url::ROUTE,
        vec![route_config("web-routes", &[("/", "backend")])],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), protocol), 2);
    let addr = listener_address(&proxy, "web").await;

    // The cluster waits for its endpoints: its route answers 503 until they come.
    assert_eq!(answer(addr, "/").await.0, 503);
    let warming = config_dump(&proxy)["xds"]["warming_clusters"].clone();
    assert_eq!(warming, serde_json::json!(["backend"]));
    server.set(
        type_url::ENDPOINT,
        vec![assignment("backend", &[one.local_addr()])],
    );
    eventually("the endpoints in force", async || {
        answer(addr, "/").await == (200, one.local_addr().to_string())
    })
    .await;
    let steady = SteadyClient::start(addr).await;
    steady.keeps_going().await;

    // An endpoint-only change.
    server.set(
        type_url::ENDPOINT,
        vec![assignment("backend", &[two.local_addr()])],
    );
    eventually("traffic on the new endpoint", async || {
        answer(addr, "/").await == (200, two.local_addr().to_string())
    })
    .await;
    steady.keeps_going().await;

    // A route change.
    server.set(
        type_url::ROUTE,
        vec![route_config(
            "web-routes",
            &[("/direct", ""), ("/", "backend")],
        )],
    );
    eventually("the new route", async || {
        answer(addr, "/direct").await.0 == 204
    })
    .await;
    steady.keeps_going().await;

    // A cluster change: another policy, the same endpoints.
    server.set(
        type_url::CLUSTER,
        vec![named(eds_cluster(
            "backend",
            cluster::LbPolicy::LeastRequest,
        ))],
    );
    eventually("the new policy", async || {
        config_dump(&proxy)["clusters"][0]["lb_policy"] == "least_request"
    })
    .await;
    assert_eq!(answer(addr, "/").await, (200, two.local_addr().to_string()));
    steady.keeps_going().await;

    // The same endpoints again (in state of the world, under a new version): ACKed, and
    // no new config is built for them. In delta the server sends nothing for unchanged
    // bytes, so there the check below holds trivially.
    let generation = config_dump(&proxy)["generation"].clone();
    let acks = |requests: &[testbed::xds::SeenRequest]| {
        requests
            .iter()
            .filter(|r| r.type_url == type_url::ENDPOINT && r.is_ack())
            .count()
    };
    let acked = acks(&server.requests());
    server.set(
        type_url::ENDPOINT,
        vec![assignment("backend", &[two.local_addr()])],
    );
    if protocol == "sotw" {
        assert!(
            server
                .wait_for(LIMIT, |requests, _| acks(requests) > acked)
                .await,
            "the resend is ACKed"
        );
    }
    assert_eq!(config_dump(&proxy)["generation"], generation);

    // An unsupported field: NACKed with the reason; the last good config keeps serving.
    let mut bad = eds_cluster("backend", cluster::LbPolicy::Random);
    bad.upstream_bind_config = Some(BindConfig {
        source_address: Some(SocketAddress {
            address: "127.0.0.1".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    server.set(type_url::CLUSTER, vec![named(bad)]);
    assert!(
        server
            .wait_for(LIMIT, |requests, _| requests.iter().any(|r| r.is_nack()))
            .await,
        "no NACK"
    );
    let nack = server.requests().into_iter().find(|r| r.is_nack()).unwrap();
    assert_eq!(nack.type_url, type_url::CLUSTER);
    let detail = nack.error_detail.unwrap();
    assert!(
        detail.contains("cluster `backend`") && detail.contains("upstream_bind_config"),
        "{detail}"
    );
    let refused = server
        .responses()
        .into_iter()
        .rfind(|r| r.type_url == type_url::CLUSTER)
        .unwrap();
    assert_eq!(nack.response_nonce, refused.nonce);
    assert_eq!(answer(addr, "/").await, (200, two.local_addr().to_string()));
    steady.keeps_going().await;
    // The NACK is the last word on clusters until the server changes them: no retry loop,
    // up to the endpoints' next ACK below (a retry after a longer wait would not be seen).
    let acked = acks(&server.requests());
    server.set(
        type_url::ENDPOINT,
        vec![assignment("backend", &[two.local_addr(), one.local_addr()])],
    );
    assert!(
        server
            .wait_for(LIMIT, |requests, _| acks(requests) > acked)
            .await,
        "the endpoints' change is ACKed"
    );
    let requests = server.requests();
    let at = requests.iter().position(|r| r.is_nack()).unwrap();
    assert!(
        requests[at + 1..]
            .iter()
            .all(|r| r.type_url != type_url::CLUSTER),
        "{:?}",
        &requests[at + 1..]
    );
    let admin = proxy.admin.unwrap();
    assert!(stat(admin, "xds_update_rejected_total") >= 1);
    assert!(stat(admin, "xds_update_success_total") >= 5);
    assert_eq!(stat(admin, "control_plane_connected_state"), 1);
    let dump = config_dump(&proxy);
    assert_eq!(dump["clusters"][0]["lb_policy"], "least_request");
    assert!(
        dump["xds"]["last_rejected"]
            .as_str()
            .unwrap()
            .contains("upstream_bind_config")
    );
    let resources = dump["xds"]["resources"].as_array().unwrap();
    let kinds: Vec<&str> = resources
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "listener",
            "route_configuration",
            "cluster",
            "cluster_load_assignment"
        ]
    );
    assert!(
        resources
            .iter()
            .all(|r| r["version"] != "" && r["last_updated_unix"].as_u64() > Some(0))
    );

    let (sent, failures) = steady.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {sent} failed: {failures:?}",
        failures.len()
    );

    // Removal: the listener goes (and its port with it), then the cluster.
    server.set(type_url::LISTENER, vec![]);
    eventually("the listener removed", async || {
        config_dump(&proxy)["listeners"]
            .as_array()
            .unwrap()
            .is_empty()
    })
    .await;
    // Each worker closes its socket as it applies the change, which may be just after the
    // dump shows it.
    eventually("its port closed", async || {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    server.set(type_url::CLUSTER, vec![]);
    eventually("the cluster removed", async || {
        config_dump(&proxy)["clusters"]
            .as_array()
            .unwrap()
            .is_empty()
    })
    .await;
    // The routes and endpoints nothing names any more are gone too (the status follows the
    // swap, so it is polled).
    eventually("nothing held", async || {
        config_dump(&proxy)["xds"]["resources"] == serde_json::json!([])
    })
    .await;
    server.shutdown().await;
    drop(proxy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_the_world_follows_the_management_server() {
    follows_the_management_server("sotw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_follows_the_management_server() {
    follows_the_management_server("delta").await;
}

/// The server goes away: the proxy keeps serving; it comes back with other endpoints: the
/// proxy reconnects, says what it has, and follows.
async fn survives_the_server_going_away(protocol: &str) {
    let (one, two) = upstreams().await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server_addr = server.local_addr();
    serve_backend(&server, one.local_addr());
    let proxy = Proxy::start(&bootstrap(server_addr, protocol), 1);
    let addr = listener_address(&proxy, "web").await;
    eventually("serving", async || answer(addr, "/").await.0 == 200).await;
    let steady = SteadyClient::start(addr).await;
    let admin = proxy.admin.unwrap();

    server.shutdown().await;
    eventually("the stream seen down", async || {
        stat(admin, "control_plane_connected_state") == 0
    })
    .await;
    assert_eq!(answer(addr, "/").await, (200, one.local_addr().to_string()));

    let again = ManagementServer::start(server_addr).await.unwrap();
    serve_backend(&again, two.local_addr());
    eventually("the new server's endpoints", async || {
        answer(addr, "/").await == (200, two.local_addr().to_string())
    })
    .await;
    assert_eq!(stat(admin, "control_plane_connected_state"), 1);
    let first = again.requests();
    assert_eq!(
        first[0].node_id.as_deref(),
        Some("edge-1"),
        "the node on the new stream"
    );
    if protocol == "delta" {
        let cds = first
            .iter()
            .find(|r| r.type_url == type_url::CLUSTER)
            .unwrap();
        assert_eq!(
            cds.initial_versions.keys().collect::<Vec<_>>(),
            ["backend"],
            "the proxy says which clusters it holds"
        );
    }
    let (sent, failures) = steady.finish().await;
    assert!(
        failures.is_empty(),
        "{} of {sent} failed: {failures:?}",
        failures.len()
    );
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_of_the_world_survives_the_server_going_away() {
    survives_the_server_going_away("sotw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_survives_the_server_going_away() {
    survives_the_server_going_away("delta").await;
}

/// An ext_authz filter from the server, calling the sidecar its cluster names; a route that
/// turns it off by `typed_per_filter_config`. The listener waits for the authorization
/// cluster, and its requests are checked from the first one served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_authz_from_the_management_server() {
    let (upstream, _) = upstreams().await;
    let sidecar = grpc_sidecar(alice_or_401()).await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();

    // The listener's chain: ext_authz (by the cluster `authz`), then the router.
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![resources::ext_authz_filter("authz")],
    );
    let open = resources::without_ext_authz(resources::forward("/public", "backend"));
    let routes =
        resources::route_config("web-routes", vec![open, resources::forward("/", "backend")]);

    server.set(type_url::LISTENER, vec![("web".into(), any(&l))]);
    server.set(type_url::ROUTE, vec![("web-routes".into(), any(&routes))]);
    server.set(
        type_url::CLUSTER,
        vec![
            named(eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            named(eds_cluster("authz", cluster::LbPolicy::RoundRobin)),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![assignment("backend", &[upstream.local_addr()])],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 1);
    // Without the authorization cluster's endpoint the listener waits.
    assert!(
        server
            .wait_for(LIMIT, |requests, _| requests
                .iter()
                .any(|r| r.type_url == type_url::ENDPOINT && r.is_ack()))
            .await
    );
    assert_eq!(
        config_dump(&proxy)["xds"]["warming_listeners"],
        serde_json::json!(["web"])
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            assignment("backend", &[upstream.local_addr()]),
            assignment("authz", &[sidecar.local_addr().unwrap()]),
        ],
    );
    let addr = listener_address(&proxy, "web").await;
    assert_eq!(answer(addr, "/private").await.0, 401, "checked, refused");
    let alice = send_h1(addr, get("/private", &[("x-user", "alice")])).await;
    assert_eq!(alice.status(), 200, "checked, allowed");
    let checks = sidecar.checks();
    assert_eq!(answer(addr, "/public/x").await.0, 200, "not checked");
    assert_eq!(sidecar.checks(), checks);
    server.shutdown().await;
}

/// A file listener beside the server's: reloading the file keeps the server's resources, an
/// xDS update keeps the file's, and a server listener named like a file one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_and_the_server_share_the_config() {
    let (upstream, _) = upstreams().await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    serve_backend(&server, upstream.local_addr());
    let file = |status: u16| {
        format!(
            "{}listeners:\n  - name: health\n    address: 127.0.0.1:0\n    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: {status} }}\n",
            bootstrap(server.local_addr(), "sotw")
        )
    };
    let proxy = Proxy::start(&file(200), 1);
    let health = proxy.addr();
    let web = listener_address(&proxy, "web").await;
    eventually("the server's routes", async || {
        answer(web, "/").await.0 == 200
    })
    .await;

    proxy.rewrite_config(&file(204));
    let (status, body) = admin_request(proxy.admin.unwrap(), "POST", "/reload");
    assert_eq!(status, 200, "{body}");
    assert_eq!(answer(health, "/").await.0, 204, "the file's change");
    assert_eq!(answer(web, "/").await.0, 200, "the server's listener stays");

    server.set(
        type_url::ROUTE,
        vec![route_config("web-routes", &[("/", "")])],
    );
    eventually("the server's change", async || {
        answer(web, "/").await.0 == 204
    })
    .await;
    assert_eq!(
        answer(health, "/").await.0,
        204,
        "the file's listener stays"
    );

    server.set(
        type_url::LISTENER,
        vec![
            listener("web", "web-routes"),
            listener("health", "web-routes"),
        ],
    );
    assert!(
        server
            .wait_for(LIMIT, |requests, _| requests.iter().any(|r| r.is_nack()))
            .await
    );
    let nack = server.requests().into_iter().find(|r| r.is_nack()).unwrap();
    let detail = nack.error_detail.unwrap();
    assert!(
        detail.contains("listener `health`") && detail.contains("duplicate listener name"),
        "{detail}"
    );
    assert_eq!(answer(web, "/").await.0, 204);
    server.shutdown().await;
}

/// The management server on a Unix socket (`address: unix:/path`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_management_server_on_a_unix_socket() {
    let dir = ScratchDir::new();
    let socket = dir.0.join("xds.sock");
    let server = ManagementServer::start_unix(&socket).await.unwrap();
    server.set(type_url::LISTENER, vec![listener("web", "web-routes")]);
    server.set(
        type_url::ROUTE,
        vec![route_config("web-routes", &[("/", "")])],
    );
    let bootstrap = format!(
        "admin: {{ address: 127.0.0.1:0 }}\nnode: {{ id: edge-1 }}\ndynamic_resources: {{ ads: {{ address: \"unix:{}\" }} }}\n",
        socket.display()
    );
    let proxy = Proxy::start(&bootstrap, 1);
    let web = listener_address(&proxy, "web").await;
    assert_eq!(answer(web, "/").await.0, 204);
    server.shutdown().await;
}

/// Routes from the management server that use splits, a mirror, a redirect, a rewrite and
/// regex, header-prefix and query matching behave as the same routes from the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_features_from_the_management_server() {
    use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
    use envoy_types::pb::envoy::config::route::v3::{
        HeaderMatcher, QueryParameterMatcher, RedirectAction, Route, RouteAction, WeightedCluster,
        header_matcher, query_parameter_matcher, redirect_action, route, route_action, route_match,
        weighted_cluster,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        RegexMatcher, StringMatcher, string_matcher,
    };
    use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
    use envoy_types::pb::google::protobuf::UInt32Value;

    let (one, two) = upstreams().await;
    let shadow = NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let split = |clusters: &[(&str, u32)]| {
        route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: clusters
                .iter()
                .map(|(name, weight)| weighted_cluster::ClusterWeight {
                    name: (*name).into(),
                    weight: Some(UInt32Value { value: *weight }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    };
    let with_action = |mut r: Route, action: RouteAction| {
        r.action = Some(route::Action::Route(action));
        r
    };
    let mut routes = Vec::new();
    // 3:1 between one and two; a cluster of weight 0 gets nothing.
    routes.push(with_action(
        resources::forward("/split", "one"),
        RouteAction {
            cluster_specifier: Some(split(&[("one", 3), ("two", 1), ("shadow", 0)])),
            ..Default::default()
        },
    ));
    // Half of a split names a cluster the server never sent: the rest takes it all.
    routes.push(with_action(
        resources::forward("/half-missing", "one"),
        RouteAction {
            cluster_specifier: Some(split(&[("two", 1), ("not-sent", 1)])),
            ..Default::default()
        },
    ));
    // Rewritten, and every request copied to `shadow` (100 of 100).
    routes.push(with_action(
        resources::forward("/api/", "one"),
        RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster("one".into())),
            prefix_rewrite: "/v2/".into(),
            request_mirror_policies: vec![route_action::RequestMirrorPolicy {
                cluster: "shadow".into(),
                runtime_fraction: Some(RuntimeFractionalPercent {
                    default_value: Some(FractionalPercent {
                        numerator: 100,
                        denominator: 0,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
    ));
    // https, a new prefix, 308.
    let mut old = resources::direct("/old/", 200);
    old.action = Some(route::Action::Redirect(RedirectAction {
        scheme_rewrite_specifier: Some(redirect_action::SchemeRewriteSpecifier::HttpsRedirect(
            true,
        )),
        path_rewrite_specifier: Some(redirect_action::PathRewriteSpecifier::PrefixRewrite(
            "/new/".into(),
        )),
        response_code: redirect_action::RedirectResponseCode::PermanentRedirect as i32,
        ..Default::default()
    }));
    routes.push(old);
    // A whole-path regex, with a header prefix and a query parameter.
    let mut regex = resources::direct("/", 202);
    let matcher = regex.r#match.as_mut().unwrap();
    matcher.path_specifier = Some(route_match::PathSpecifier::SafeRegex(RegexMatcher {
        regex: "/users/[0-9]+".into(),
        ..Default::default()
    }));
    matcher.headers = vec![HeaderMatcher {
        name: "user-agent".into(),
        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
            StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Prefix("curl/".into())),
                ..Default::default()
            },
        )),
        ..Default::default()
    }];
    matcher.query_parameters = vec![QueryParameterMatcher {
        name: "debug".into(),
        query_parameter_match_specifier: Some(
            query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true),
        ),
    }];
    routes.push(regex);
    routes.push(resources::direct("/", 404));

    let (name, l) = listener("web", "web-routes");
    server.set(type_url::LISTENER, vec![(name, l)]);
    server.set(
        type_url::ROUTE,
        vec![(
            "web-routes".into(),
            any(&resources::route_config("web-routes", routes)),
        )],
    );
    server.set(
        type_url::CLUSTER,
        ["one", "two", "shadow"]
            .iter()
            .map(|n| named(eds_cluster(n, cluster::LbPolicy::RoundRobin)))
            .collect(),
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            assignment("one", &[one.local_addr()]),
            assignment("two", &[two.local_addr()]),
            assignment("shadow", &[shadow.local_addr()]),
        ],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 2);
    let addr = listener_address(&proxy, "web").await;
    let (one_addr, two_addr) = (one.local_addr().to_string(), two.local_addr().to_string());

    // 400 requests at 3:1: two's share has a standard deviation of 8.7; 60 to 140 is more
    // than four and a half of them either way. None reaches the weight-0 cluster.
    let mut to_two = 0;
    for _ in 0..400 {
        let (status, by) = answer(addr, "/split").await;
        assert_eq!(status, 200);
        assert!(by == one_addr || by == two_addr, "{by}");
        to_two += usize::from(by == two_addr);
    }
    assert!((60..=140).contains(&to_two), "{to_two} of 400 to two");
    for _ in 0..20 {
        assert_eq!(answer(addr, "/half-missing").await, (200, two_addr.clone()));
    }

    let echoed = send_h1(addr, get("/api/users", &[("x-noop-echo", "headers")])).await;
    assert_eq!(echoed.status(), 200);
    let text = text(echoed.into_body()).await;
    assert!(text.starts_with("GET /v2/users "), "{text}");
    let admin = proxy.admin.unwrap();
    assert_eq!(stat_settled(admin, "upstream_rq_shadow", 1), 1);

    let moved = send_h1(addr, get("/old/page?x=1", &[])).await;
    assert_eq!(moved.status(), 308);
    assert_eq!(
        moved.headers()["location"],
        "https://legate.test/new/page?x=1"
    );

    let curl = [("user-agent", "curl/8.5")];
    assert_eq!(
        send_h1(addr, get("/users/42?debug", &curl)).await.status(),
        202
    );
    for (path, headers) in [
        ("/users/42", &curl[..]),
        ("/users/42?debug", &[("user-agent", "Mozilla/5.0")][..]),
        ("/users/4x2?debug", &curl[..]),
    ] {
        assert_eq!(
            send_h1(addr, get(path, headers)).await.status(),
            404,
            "{path}"
        );
    }
    assert!(
        server.requests().iter().all(|r| !r.is_nack()),
        "every resource taken"
    );
    server.shutdown().await;
}

/// A cluster added before another in name order moves the other's place in the config; a
/// listener whose routes did not change must still send its traffic to the cluster its
/// routes name (the routes refer to clusters by their place once validated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_does_not_move_unchanged_routes_to_another() {
    let (one, two) = upstreams().await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    server.set(
        type_url::CLUSTER,
        vec![named(eds_cluster("middle", cluster::LbPolicy::RoundRobin))],
    );
    server.set(
        type_url::ENDPOINT,
        vec![assignment("middle", &[one.local_addr()])],
    );
    server.set(type_url::LISTENER, vec![listener("web", "web-routes")]);
    server.set(
        type_url::ROUTE,
        vec![route_config("web-routes", &[("/", "middle")])],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 1);
    let addr = listener_address(&proxy, "web").await;
    eventually("served by the cluster's host", async || {
        answer(addr, "/").await == (200, one.local_addr().to_string())
    })
    .await;
    let generation = stat(proxy.admin.unwrap(), "config_generation");
    server.set(
        type_url::CLUSTER,
        vec![
            named(eds_cluster("first", cluster::LbPolicy::RoundRobin)),
            named(eds_cluster("middle", cluster::LbPolicy::RoundRobin)),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            assignment("first", &[two.local_addr()]),
            assignment("middle", &[one.local_addr()]),
        ],
    );
    eventually("the new cluster in force", async || {
        config_dump(&proxy)["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "first")
            && stat(proxy.admin.unwrap(), "config_generation") > generation
    })
    .await;
    for _ in 0..5 {
        assert_eq!(answer(addr, "/").await, (200, one.local_addr().to_string()));
    }
    server.shutdown().await;
}

/// Envoy Gateway's JWT authentication: a provider whose key set is fetched through a cluster
/// (sent after the listener: the listener waits for it), a requirement named by one route,
/// the filter off on another. Enforced there, with the key set fetched through the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_authn_from_a_control_plane_fetches_keys_through_its_cluster() {
    use envoy_types::pb::envoy::config::core::v3::{HttpUri, http_uri};
    use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
        JwtAuthentication, JwtProvider, JwtRequirement, PerRouteConfig, RemoteJwks, jwt_provider,
        jwt_requirement, per_route_config,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpFilter, http_filter,
    };
    use envoy_types::pb::google::protobuf::Duration as PbDuration;
    use jwt::mint::{SigningKey, jwks};

    let (one, _two) = upstreams().await;
    let key = SigningKey::es256("gw");
    let keys = common::jwks::JwksServer::start(jwks(&[&key]), true).await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    serve_backend(&server, one.local_addr());
    let provider = JwtProvider {
        issuer: "https://gw.example".into(),
        audiences: vec!["store".into()],
        jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::RemoteJwks(RemoteJwks {
            http_uri: Some(HttpUri {
                uri: "https://keys.gw.example/jwks".into(),
                http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster("jwks".into())),
                timeout: Some(PbDuration {
                    seconds: 10,
                    nanos: 0,
                }),
            }),
            cache_duration: Some(PbDuration {
                seconds: 300,
                nanos: 0,
            }),
            ..Default::default()
        })),
        forward: true,
        payload_in_metadata: "gw".into(),
        ..Default::default()
    };
    let filter = JwtAuthentication {
        providers: [("gw".to_string(), provider)].into(),
        requirement_map: [(
            "store/policy".to_string(),
            JwtRequirement {
                requires_type: Some(jwt_requirement::RequiresType::ProviderName("gw".into())),
            },
        )]
        .into(),
        ..Default::default()
    };
    let jwt_filter = HttpFilter {
        name: "envoy.filters.http.jwt_authn".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&filter))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![jwt_filter],
    );
    server.set(type_url::LISTENER, vec![("web".into(), any(&l))]);
    let per_route = |specifier| {
        any(&PerRouteConfig {
            requirement_specifier: Some(specifier),
        })
    };
    let mut store = resources::forward("/store", "backend");
    store.typed_per_filter_config.insert(
        "envoy.filters.http.jwt_authn".into(),
        per_route(per_route_config::RequirementSpecifier::RequirementName(
            "store/policy".into(),
        )),
    );
    let mut open = resources::forward("/", "backend");
    open.typed_per_filter_config.insert(
        "envoy.filters.http.jwt_authn".into(),
        per_route(per_route_config::RequirementSpecifier::Disabled(true)),
    );
    let table = resources::route_config("web-routes", vec![store, open]);
    server.set(
        type_url::ROUTE,
        vec![("web-routes".to_string(), any(&table))],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 1);
    // The key set's cluster comes after the listener.
    server.set(
        type_url::CLUSTER,
        vec![
            named(eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            named(eds_cluster("jwks", cluster::LbPolicy::RoundRobin)),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            assignment("backend", &[one.local_addr()]),
            assignment("jwks", &[keys.addr]),
        ],
    );
    let addr = listener_address(&proxy, "web").await;
    let token = key.sign(
        &serde_json::json!({"iss": "https://gw.example", "aud": "store", "exp": 4_000_000_000u64}),
    );
    let status = async |path: &str, token: &str| {
        let auth = format!("Bearer {token}");
        let headers: &[(&str, &str)] = if token.is_empty() {
            &[]
        } else {
            &[("authorization", &auth)]
        };
        send_h1(addr, get(path, headers)).await.status().as_u16()
    };
    eventually("the route's requirement in force", async || {
        status("/store", "").await == 401
    })
    .await;
    eventually("the key set fetched through its cluster", async || {
        status("/store", &token).await == 200
    })
    .await;
    assert_eq!(status("/", "").await, 200, "off on the other route");
    assert!(keys.fetches.load(std::sync::atomic::Ordering::SeqCst) >= 1);
}

/// Envoy Gateway's global rate limit: the `ratelimit` filter names the service by its cluster
/// (which comes after the listener), and a route's `RateLimitPerRoute` gives the rules: a
/// generic key and a header match. Requests the rules describe are counted by the service;
/// others are not asked about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_rate_limit_from_a_control_plane_asks_the_service_of_its_cluster() {
    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
    use envoy_types::pb::envoy::config::ratelimit::v3::RateLimitServiceConfig;
    use envoy_types::pb::envoy::config::route::v3::rate_limit::{Action, action};
    use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, RateLimit, header_matcher};
    use envoy_types::pb::envoy::extensions::filters::http::ratelimit::v3::{
        RateLimit as RateLimitFilter, RateLimitPerRoute,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpFilter, http_filter,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

    let (one, _two) = upstreams().await;
    let rls = testbed::RateLimitService::start("127.0.0.1:0".parse().unwrap(), 2)
        .await
        .unwrap();
    let service = rls.local_addr();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    serve_backend(&server, one.local_addr());
    let filter = RateLimitFilter {
        domain: "first-listener".into(),
        // Envoy's 20 ms default is short for a debug build's first call, which connects.
        timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 5,
            nanos: 0,
        }),
        enable_x_ratelimit_headers: 1,
        disable_x_envoy_ratelimited_header: true,
        rate_limit_service: Some(RateLimitServiceConfig {
            grpc_service: Some(GrpcService {
                target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                    grpc_service::EnvoyGrpc {
                        cluster_name: "ratelimit_cluster".into(),
                        ..Default::default()
                    },
                )),
                ..Default::default()
            }),
            transport_api_version: 2,
        }),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![HttpFilter {
            name: "envoy.filters.http.ratelimit".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(&filter))),
            ..Default::default()
        }],
    );
    server.set(type_url::LISTENER, vec![("web".into(), any(&l))]);
    let action = |spec| Action {
        action_specifier: Some(spec),
    };
    let rules = RateLimitPerRoute {
        domain: "first-listener".into(),
        rate_limits: vec![RateLimit {
            actions: vec![
                action(action::ActionSpecifier::GenericKey(action::GenericKey {
                    descriptor_key: "first-route".into(),
                    descriptor_value: "first-route".into(),
                    ..Default::default()
                })),
                action(action::ActionSpecifier::HeaderValueMatch(
                    action::HeaderValueMatch {
                        descriptor_key: "rule-0-match-0".into(),
                        descriptor_value: "rule-0-match-0".into(),
                        expect_match: Some(envoy_types::pb::google::protobuf::BoolValue {
                            value: true,
                        }),
                        headers: vec![HeaderMatcher {
                            name: "x-user-id".into(),
                            header_match_specifier: Some(
                                header_matcher::HeaderMatchSpecifier::StringMatch(StringMatcher {
                                    match_pattern: Some(string_matcher::MatchPattern::Exact(
                                        "one".into(),
                                    )),
                                    ..Default::default()
                                }),
                            ),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )),
            ],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut limited = resources::forward("/", "backend");
    limited
        .typed_per_filter_config
        .insert("envoy.filters.http.ratelimit".into(), any(&rules));
    let table = resources::route_config("web-routes", vec![limited]);
    server.set(
        type_url::ROUTE,
        vec![("web-routes".to_string(), any(&table))],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 1);
    // The service's cluster after the listener: the listener waits for it.
    server.set(
        type_url::CLUSTER,
        vec![
            named(eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            named(eds_cluster(
                "ratelimit_cluster",
                cluster::LbPolicy::RoundRobin,
            )),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            assignment("backend", &[one.local_addr()]),
            assignment("ratelimit_cluster", &[service]),
        ],
    );
    let addr = listener_address(&proxy, "web").await;
    let call = async |user: &str| {
        let response = send_h1(addr, get("/", &[("x-user-id", user)])).await;
        let remaining = (response.headers().get("x-ratelimit-remaining"))
            .map(|v| v.to_str().unwrap().to_owned());
        let marked = response.headers().contains_key("x-envoy-ratelimited");
        (response.status().as_u16(), remaining, marked)
    };
    assert_eq!(call("one").await, (200, Some("1".into()), false));
    assert_eq!(call("one").await, (200, Some("0".into()), false));
    assert_eq!(
        call("one").await,
        (429, Some("0".into()), false),
        "the header is disabled"
    );
    // The header does not match: the rule describes nothing, and the service is not asked.
    assert_eq!(call("two").await, (200, None, false));
    let asked = rls.asked();
    assert_eq!(asked.len(), 3);
    assert_eq!(
        asked[0],
        (
            "first-listener".to_owned(),
            vec![vec![
                "first-route=first-route".to_owned(),
                "rule-0-match-0=rule-0-match-0".to_owned()
            ]]
        )
    );
}

/// Envoy Gateway's external processing: an `ext_proc` filter per policy, off in the chain and
/// turned on by the routes it is for (an empty `FilterConfig`), calling the processor of its
/// cluster (which arrives after the listener): the request headers and buffered body
/// processed on that route, nothing on the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext_proc_from_a_control_plane_processes_the_routes_that_turn_it_on() {
    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
    use envoy_types::pb::envoy::config::route::v3::FilterConfig;
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
        BodySendMode, HeaderSendMode,
    };
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::{
        ExternalProcessor, ProcessingMode,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpFilter, http_filter,
    };

    const NAME: &str = "envoy.filters.http.ext_proc/envoyextensionpolicy/default/policy/extproc/0";
    let (one, _two) = upstreams().await;
    let processor = testbed::ExtProcessor::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    serve_backend(&server, one.local_addr());
    let filter = ExternalProcessor {
        grpc_service: Some(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                grpc_service::EnvoyGrpc {
                    cluster_name: "envoyextensionpolicy/default/policy/0/processor".into(),
                    authority: "processor.default:9000".into(),
                    ..Default::default()
                },
            )),
            timeout: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: 10,
                nanos: 0,
            }),
            ..Default::default()
        }),
        // Envoy's 200 ms default is short for a debug build's first call, which connects.
        message_timeout: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 5,
            nanos: 0,
        }),
        processing_mode: Some(ProcessingMode {
            request_header_mode: HeaderSendMode::Send as i32,
            response_header_mode: HeaderSendMode::Skip as i32,
            request_body_mode: BodySendMode::Buffered as i32,
            request_trailer_mode: HeaderSendMode::Skip as i32,
            response_trailer_mode: HeaderSendMode::Skip as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![HttpFilter {
            name: NAME.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(&filter))),
            disabled: true,
            ..Default::default()
        }],
    );
    server.set(type_url::LISTENER, vec![("web".into(), any(&l))]);
    let mut processed = resources::forward("/processed", "backend");
    processed.typed_per_filter_config.insert(
        NAME.into(),
        any(&FilterConfig {
            config: None,
            ..Default::default()
        }),
    );
    let table = resources::route_config(
        "web-routes",
        vec![processed, resources::forward("/", "backend")],
    );
    server.set(
        type_url::ROUTE,
        vec![("web-routes".to_string(), any(&table))],
    );
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 1);
    server.set(
        type_url::CLUSTER,
        vec![
            named(eds_cluster("backend", cluster::LbPolicy::RoundRobin)),
            named(eds_cluster(
                "envoyextensionpolicy/default/policy/0/processor",
                cluster::LbPolicy::RoundRobin,
            )),
        ],
    );
    server.set(
        type_url::ENDPOINT,
        vec![
            assignment("backend", &[one.local_addr()]),
            assignment(
                "envoyextensionpolicy/default/policy/0/processor",
                &[processor.local_addr()],
            ),
        ],
    );
    let addr = listener_address(&proxy, "web").await;
    let post = |path: &str| {
        http::Request::post(path)
            .header("host", "web.test")
            .header("x-noop-echo", "body")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(
                b"quiet",
            )))
            .unwrap()
    };
    let response = send_h1(addr, post("/processed")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(text(response.into_body()).await, "QUIET");
    assert_eq!(
        processor.lines(),
        ["request_headers eos=false", "request_body 5 eos=true"]
    );
    let response = send_h1(addr, post("/elsewhere")).await;
    assert_eq!(text(response.into_body()).await, "quiet");
    assert_eq!(
        processor.lines().len(),
        2,
        "the other route is not processed"
    );
}

/// Envoy Gateway's authorization: an RBAC filter without rules on the listener, and a route's
/// `RBACPerRoute` in the matcher form (allow one header value, deny the rest). Enforced on
/// that route only, and lifted live when the route's settings go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_rules_from_a_route_are_enforced_and_follow_changes() {
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpFilter, http_filter,
    };

    let (one, _two) = upstreams().await;
    let server = ManagementServer::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    serve_backend(&server, one.local_addr());
    let rbac_filter = HttpFilter {
        name: "envoy.filters.http.rbac".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&Rbac::default()))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![rbac_filter],
    );
    server.set(type_url::LISTENER, vec![("web".into(), any(&l))]);
    let admins_only = resources::rbac_allowing_header("admins", "x-role", "admin", false);
    let routes = |guarded: bool| {
        let mut admin = resources::forward("/admin", "backend");
        if guarded {
            admin
                .typed_per_filter_config
                .insert("envoy.filters.http.rbac".into(), any(&admins_only));
        }
        let table = resources::route_config(
            "web-routes",
            vec![admin, resources::forward("/", "backend")],
        );
        vec![("web-routes".to_string(), any(&table))]
    };
    server.set(type_url::ROUTE, routes(true));
    let proxy = Proxy::start(&bootstrap(server.local_addr(), "delta"), 1);
    let addr = listener_address(&proxy, "web").await;
    let status = async |path: &str, headers: &[(&str, &str)]| {
        send_h1(addr, get(path, headers)).await.status().as_u16()
    };
    eventually("the route's rules in force", async || {
        status("/admin", &[]).await == 403
    })
    .await;
    assert_eq!(status("/admin", &[("x-role", "admin")]).await, 200);
    assert_eq!(status("/admin", &[("x-role", "guest")]).await, 403);
    assert_eq!(status("/", &[]).await, 200, "no rules on the other route");

    server.set(type_url::ROUTE, routes(false));
    eventually("the rules lifted", async || {
        status("/admin", &[]).await == 200
    })
    .await;
}
