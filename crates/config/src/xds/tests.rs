//! Translation of Envoy's messages into config sections: what is honoured, what is refused
//! (by name), and how held resources are joined (warming, unknown clusters).

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, OutlierDetection, cluster};
use envoy_types::pb::envoy::config::core::v3::{BindConfig, HealthStatus};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, cluster_load_assignment,
    lb_endpoint,
};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{
    HeaderMatcher, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, header_matcher,
    route, route_action, route_match,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration, UInt32Value};
use prost::{Message, Name};

use testbed::resources;

use super::*;
use crate::RawEndpoint;
use crate::envoy::fields;

fn pack<M: Message + Name>(message: &M) -> Any {
    testbed::xds::any(message)
}

/// What the management server's resources make of a file that only names it.
fn compose_ads(resources: &mut Resources) -> Result<crate::Config, ConfigError> {
    let Sections {
        listeners,
        clusters,
        ..
    } = resources.sections()?;
    let origin = crate::Config::from_yaml(
        "node: { id: n }\ndynamic_resources: { ads: { address: \"127.0.0.1:1\" } }\n",
    )
    .unwrap()
    .origin;
    compose(&origin, listeners, clusters)
}

fn listener(name: &str, rds: &str) -> Listener {
    resources::listener(name, "127.0.0.1:0".parse().unwrap(), rds)
}

fn routes(name: &str, cluster: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: name.into(),
        virtual_hosts: vec![VirtualHost {
            name: "all".into(),
            domains: vec!["*".into()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    headers: vec![HeaderMatcher {
                        name: "x-canary".into(),
                        header_match_specifier: Some(
                            header_matcher::HeaderMatchSpecifier::PresentMatch(true),
                        ),
                        invert_match: true,
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                        cluster.into(),
                    )),
                    timeout: Some(PbDuration {
                        seconds: 0,
                        nanos: 0,
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn eds_cluster(name: &str) -> Cluster {
    resources::eds_cluster(name, cluster::LbPolicy::LeastRequest)
}

fn lb_endpoint(port: u16, status: HealthStatus, weight: Option<u32>) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
            address: resources::socket(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
            ..Default::default()
        })),
        health_status: status as i32,
        load_balancing_weight: weight.map(|value| UInt32Value { value }),
        ..Default::default()
    }
}

fn assignment(name: &str, endpoints: Vec<LbEndpoint>) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.into(),
        endpoints: vec![LocalityLbEndpoints {
            lb_endpoints: endpoints,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Held as if it came encoded: the digest follows its contents, as a real encoding's does.
fn held<T: std::fmt::Debug>(value: T) -> Held<T> {
    let encoded = format!("{value:?}");
    Held::new(value, "1".into(), encoded.as_bytes())
}

/// Endpoints of `name`: one healthy host on 127.0.0.1:`port`, as held.
fn held_endpoints(name: &str, port: u16) -> Held<XdsEndpoints> {
    let cla = assignment(name, vec![lb_endpoint(port, HealthStatus::Healthy, None)]);
    held(XdsEndpoints::decode(&pack(&cla)).unwrap())
}

/// EDS clusters, each with its endpoints: one healthy host on 127.0.0.1 at the port given.
fn hold_eds_clusters(resources: &mut Resources, clusters: &[(&str, u16)]) {
    for &(name, port) in clusters {
        resources.clusters.insert(
            name.into(),
            held(XdsCluster::decode(&pack(&eds_cluster(name))).unwrap()),
        );
        resources
            .endpoints
            .insert(name.into(), held_endpoints(name, port));
    }
}

/// Routes `name` sending everything to `cluster`, as held.
fn held_routes(name: &str, cluster: &str) -> Held<XdsRoutes> {
    held(XdsRoutes::decode(&pack(&routes(name, cluster))).unwrap())
}

/// Listener `name` taking its routes from RDS `rds`, as held.
fn held_listener(name: &str, rds: &str) -> Held<XdsListener> {
    held(XdsListener::decode(&pack(&listener(name, rds))).unwrap())
}

#[test]
fn a_cluster_keeps_envoys_defaults_and_names_its_eds_service() {
    let cluster = XdsCluster::decode(&pack(&eds_cluster("web"))).unwrap();
    assert_eq!(cluster.eds.as_deref(), Some("web"));
    let raw = cluster
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.lb_policy.as_deref(), Some("least_request"));
    assert_eq!(raw.connect_timeout, Some(Duration::from_secs(5)));
    assert!(raw.dynamic && raw.endpoints.is_empty());
}

#[test]
fn durations_out_of_bounds_are_refused() {
    for seconds in [-1, 1_000_000_001, i64::MAX] {
        let mut c = eds_cluster("web");
        c.connect_timeout = Some(PbDuration { seconds, nanos: 0 });
        let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
        assert!(error.contains("connect_timeout"), "{error}");
    }
}

#[test]
fn outlier_detection_enforces_as_envoy_does() {
    let mut c = eds_cluster("web");
    c.outlier_detection = Some(OutlierDetection::default());
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let outliers = raw.outlier_detection.unwrap();
    // 5xx enforced by default, gateway failures only when asked.
    assert_eq!(outliers.consecutive_5xx, Some(5));
    assert_eq!(outliers.consecutive_gateway_failure, Some(0));
    // Success rate and failure percentage with Envoy's defaults once checked.
    let config = crate::cluster::check::outlier_detection(outliers, "o").unwrap();
    assert_eq!(config.success_rate, crate::RateEjection::SUCCESS_RATE);
    assert_eq!(
        config.failure_percentage,
        crate::RateEjection::FAILURE_PERCENTAGE
    );
    assert_eq!(config.interval, Duration::from_secs(10));
    assert!(!config.always_eject_one_host && config.uneject_on_health_check);

    // Envoy Gateway's: local-origin settings that Envoy reads only when split.
    c.outlier_detection = Some(OutlierDetection {
        consecutive_local_origin_failure: Some(UInt32Value { value: 5 }),
        failure_percentage_threshold: Some(UInt32Value { value: 90 }),
        always_eject_one_host: Some(envoy_types::pb::google::protobuf::BoolValue { value: true }),
        ..Default::default()
    });
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let outliers = raw.outlier_detection.unwrap();
    assert_eq!(outliers.always_eject_one_host, Some(true));
    assert_eq!(outliers.failure_percentage.unwrap().threshold, Some(90));
    // Envoy Gateway's `health-check` scenario: local-origin failures split out.
    c.outlier_detection = Some(OutlierDetection {
        split_external_local_origin_errors: true,
        consecutive_local_origin_failure: Some(UInt32Value { value: 3 }),
        ..Default::default()
    });
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let outliers = raw.outlier_detection.unwrap();
    assert_eq!(outliers.split_external_local_origin_errors, Some(true));
    assert_eq!(outliers.consecutive_local_origin_failure, Some(3));
    let config = crate::cluster::check::outlier_detection(outliers, "o").unwrap();
    let local = config.local_origin.unwrap();
    assert_eq!(
        (
            local.consecutive_failure,
            local.success_rate_enforcing,
            local.failure_percentage_enforcing
        ),
        (3, 100, 0)
    );
}

#[test]
fn an_unsupported_field_is_refused_by_name() {
    let mut c = eds_cluster("web");
    c.upstream_bind_config = Some(BindConfig::default());
    c.connection_pool_per_downstream_connection = true;
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(
        error.contains("cluster `web`")
            && error.contains("upstream_bind_config")
            && error.contains("connection_pool_per_downstream_connection"),
        "{error}"
    );

    let mut l = listener("edge", "routes");
    l.transparent = Some(envoy_types::pb::google::protobuf::BoolValue { value: true });
    let error = XdsListener::decode(&pack(&l)).unwrap_err().to_string();
    assert!(
        error.contains("listener `edge`") && error.contains("transparent"),
        "{error}"
    );
}

#[test]
fn the_wrong_type_is_refused() {
    let error = XdsListener::decode(&pack(&eds_cluster("web"))).unwrap_err();
    assert!(matches!(error, ResourceError::Decode { .. }), "{error}");
}

#[test]
fn endpoints_keep_their_health_priority_and_locality_and_merge_repeats() {
    let mut cla = assignment(
        "web",
        vec![
            lb_endpoint(8001, HealthStatus::Healthy, Some(2)),
            lb_endpoint(8002, HealthStatus::Draining, None),
            lb_endpoint(8003, HealthStatus::Unknown, None),
            lb_endpoint(8001, HealthStatus::Unknown, Some(3)),
            lb_endpoint(8004, HealthStatus::Degraded, None),
        ],
    );
    let mut failover = cla.endpoints[0].clone();
    failover.priority = 1;
    failover.locality = Some(envoy_types::pb::envoy::config::core::v3::Locality {
        region: "eu".into(),
        zone: "b".into(),
        ..Default::default()
    });
    failover.load_balancing_weight = Some(UInt32Value { value: 3 });
    failover.lb_endpoints = vec![lb_endpoint(9001, HealthStatus::Timeout, None)];
    cla.endpoints.push(failover);
    cla.policy = Some(cluster_load_assignment::Policy {
        overprovisioning_factor: Some(UInt32Value { value: 120 }),
        ..Default::default()
    });
    let endpoints = XdsEndpoints::decode(&pack(&cla)).unwrap();
    let summary: Vec<_> = endpoints
        .hosts
        .iter()
        .map(|h| {
            (
                h.address.as_str(),
                h.weight,
                h.priority,
                h.locality.as_deref(),
                h.locality_weight,
                h.health.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            // Listed twice: the first, as Envoy keeps it.
            ("127.0.0.1:8001", Some(2), Some(0), None, None, None),
            (
                "127.0.0.1:8002",
                Some(1),
                Some(0),
                None,
                None,
                Some("draining")
            ),
            ("127.0.0.1:8003", Some(1), Some(0), None, None, None),
            (
                "127.0.0.1:8004",
                Some(1),
                Some(0),
                None,
                None,
                Some("degraded")
            ),
            (
                "127.0.0.1:9001",
                Some(1),
                Some(1),
                Some("eu/b/"),
                Some(3),
                Some("unhealthy")
            ),
        ]
    );
    assert_eq!(endpoints.overprovisioning_factor, Some(120));

    // What Envoy's priority arithmetic cannot follow is refused by name.
    cla.policy = Some(cluster_load_assignment::Policy {
        weighted_priority_health: true,
        ..Default::default()
    });
    assert!(
        XdsEndpoints::decode(&pack(&cla))
            .unwrap_err()
            .to_string()
            .contains("policy")
    );
}

#[test]
fn routes_translate_matches_and_timeouts() {
    let config = XdsRoutes::decode(&pack(&routes("r", "web"))).unwrap();
    let ready: BTreeMap<&str, bool> = [("web", true)].into_iter().collect();
    let hosts = config.section(&ready, &["websocket".into()], &[], None);
    let route = &hosts[0].routes[0];
    assert_eq!(route.cluster.as_deref(), Some("web"));
    assert_eq!(route.matcher.prefix.as_deref(), Some("/"));
    // Present, inverted: the header must be absent.
    assert_eq!(route.matcher.headers[0].present, Some(false));
    // `0s` is no timeout in Envoy: the longest wait here.
    assert_eq!(route.timeout, Some(Duration::from_secs(24 * 3600)));
    assert_eq!(route.upgrades, ["websocket"]);

    // The listener's upgrades are offered only where the cluster speaks HTTP/1.1: the same
    // routes to an HTTP/2 cluster are valid, without them.
    let h2: BTreeMap<&str, bool> = [("web", false)].into_iter().collect();
    let hosts = config.section(&h2, &["websocket".into()], &[], None);
    assert!(hosts[0].routes[0].upgrades.is_empty());

    // Nor those the route itself names.
    let mut own = routes("r", "web");
    let Some(route::Action::Route(action)) = &mut own.virtual_hosts[0].routes[0].action else {
        panic!("a forwarding route");
    };
    action.upgrade_configs = vec![route_action::UpgradeConfig {
        upgrade_type: "websocket".into(),
        ..Default::default()
    }];
    let own = XdsRoutes::decode(&pack(&own)).unwrap();
    assert_eq!(
        own.section(&ready, &[], &[], None)[0].routes[0].upgrades,
        ["websocket"]
    );
    assert!(
        own.section(&h2, &[], &[], None)[0].routes[0]
            .upgrades
            .is_empty()
    );
}

/// Contour's global rate limit: the virtual host's and the route action's `rate_limits`
/// become the route table's own rules (stage kept); what changes a descriptor and is not done
/// here is refused by name.
#[test]
fn route_and_host_rate_limits_translate_with_their_stage() {
    use envoy_types::pb::envoy::config::route::v3::RateLimit;
    use envoy_types::pb::envoy::config::route::v3::rate_limit::{Action, Override, action};
    let rule = |value: &str, stage: u32| RateLimit {
        stage: Some(UInt32Value { value: stage }),
        actions: vec![Action {
            action_specifier: Some(action::ActionSpecifier::GenericKey(action::GenericKey {
                descriptor_value: value.into(),
                ..Default::default()
            })),
        }],
        ..Default::default()
    };
    let mut config = routes("r", "web");
    config.virtual_hosts[0].rate_limits = vec![rule("host", 0)];
    let Some(route::Action::Route(action)) = &mut config.virtual_hosts[0].routes[0].action else {
        panic!("a forwarding route");
    };
    action.rate_limits = vec![rule("route", 1)];
    #[allow(deprecated)]
    {
        action.include_vh_rate_limits =
            Some(envoy_types::pb::google::protobuf::BoolValue { value: true });
    }
    let ready: BTreeMap<&str, bool> = [("web", true)].into_iter().collect();
    let hosts = XdsRoutes::decode(&pack(&config))
        .unwrap()
        .section(&ready, &[], &[], None);
    assert_eq!(hosts[0].rate_limits.len(), 1);
    let route = &hosts[0].routes[0];
    assert_eq!(route.rate_limits[0].stage, Some(1));
    assert_eq!(route.include_vh_rate_limits, Some(true));

    let Some(route::Action::Route(action)) = &mut config.virtual_hosts[0].routes[0].action else {
        panic!("a forwarding route");
    };
    action.rate_limits[0].limit = Some(Override::default());
    let err = XdsRoutes::decode(&pack(&config)).unwrap_err().to_string();
    assert!(
        err.contains("rate_limits[0]") && err.contains("limit"),
        "{err}"
    );
}

#[test]
fn connect_routes_translate_as_envoy_gateway_sends_them() {
    use envoy_types::pb::envoy::config::route::v3::route_match::ConnectMatcher;

    let connect = |connect_config: Option<route_action::upgrade_config::ConnectConfig>| {
        let mut config = routes("r", "web");
        let route = &mut config.virtual_hosts[0].routes[0];
        let m = route.r#match.as_mut().unwrap();
        m.path_specifier = Some(route_match::PathSpecifier::ConnectMatcher(
            ConnectMatcher {},
        ));
        m.headers.clear();
        let Some(route::Action::Route(action)) = &mut route.action else {
            panic!("a forwarding route");
        };
        action.upgrade_configs = vec![route_action::UpgradeConfig {
            upgrade_type: "CONNECT".into(),
            connect_config,
            ..Default::default()
        }];
        XdsRoutes::decode(&pack(&config))
    };
    let ready: BTreeMap<&str, bool> = [("web", true)].into_iter().collect();
    let h2: BTreeMap<&str, bool> = [("web", false)].into_iter().collect();
    // `connect_config: {}`: terminated here, whatever HTTP the cluster speaks.
    let terminated = connect(Some(Default::default())).unwrap();
    for clusters in [&ready, &h2] {
        let route = &terminated.section(clusters, &[], &[], None)[0].routes[0];
        assert_eq!(route.matcher.connect, Some(true));
        assert_eq!(route.matcher.prefix, None, "no path to match");
        assert_eq!(route.connect, Some(crate::ConnectMode::Terminate));
        assert!(route.upgrades.is_empty());
    }
    // Without it, forwarded; to an HTTP/2 cluster, not offered (as the other upgrades).
    let forwarded = connect(None).unwrap();
    let route = &forwarded.section(&ready, &[], &[], None)[0].routes[0];
    assert_eq!(route.connect, Some(crate::ConnectMode::Forward));
    assert_eq!(
        forwarded.section(&h2, &[], &[], None)[0].routes[0].connect,
        None
    );
    // The connection manager's CONNECT upgrade forwards on every route that does not say.
    let plain = XdsRoutes::decode(&pack(&routes("r", "web"))).unwrap();
    let route = &plain.section(&ready, &["connect".into()], &[], None)[0].routes[0];
    assert_eq!(route.connect, Some(crate::ConnectMode::Forward));
    assert!(route.upgrades.is_empty());
    // What Legate does not do with a tunnel is refused by name.
    let refused = connect(Some(route_action::upgrade_config::ConnectConfig {
        allow_post: true,
        ..Default::default()
    }));
    let error = refused.err().unwrap().to_string();
    assert!(
        error.contains("upgrade_configs[0].connect_config") && error.contains("allow_post"),
        "{error}"
    );
}

#[test]
fn a_route_to_a_cluster_not_there_answers_503() {
    let config = XdsRoutes::decode(&pack(&routes("r", "gone"))).unwrap();
    let hosts = config.section(&BTreeMap::<&str, bool>::new(), &[], &[], None);
    let route = &hosts[0].routes[0];
    assert!(route.cluster.is_none() && route.timeout.is_none());
    assert_eq!(route.direct_response.as_ref().map(|d| d.status), Some(503));
}

/// An EDS cluster `web`, and a listener `edge` that takes its routes from `r1`: neither has
/// what it waits for yet.
fn web_behind_edge() -> Resources {
    let mut resources = Resources::default();
    resources.clusters.insert(
        "web".into(),
        held(XdsCluster::decode(&pack(&eds_cluster("web"))).unwrap()),
    );
    resources
        .listeners
        .insert("edge".into(), held_listener("edge", "r1"));
    resources
}

/// [`web_behind_edge`] with what both wait for: `r1` routing to `web`, whose one host is
/// on port 8001.
fn web_behind_edge_ready() -> Resources {
    let mut resources = web_behind_edge();
    resources
        .routes
        .insert("r1".into(), held_routes("r1", "web"));
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8001));
    resources
}

#[test]
fn names_are_gathered_again_only_when_a_listener_or_cluster_changes() {
    let mut resources = web_behind_edge_ready();
    resources.sections().unwrap();
    resources.retain_wanted();
    let gathered = resources.subscriptions();
    assert_eq!(*gathered.endpoints, names(["web"]));

    // Routes or endpoints changing name nothing new: the same sets, not gathered again.
    resources
        .routes
        .insert("r1".into(), held_routes("r1", "api"));
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8002));
    resources.sections().unwrap();
    resources.retain_wanted();
    assert!(Arc::ptr_eq(&gathered, &resources.subscriptions()));
    let copy = resources.clone();
    assert!(Arc::ptr_eq(&gathered, &copy.subscriptions()));

    // A cluster added is seen at once, kept or not.
    resources.clusters.insert(
        "api".into(),
        held(XdsCluster::decode(&pack(&eds_cluster("api"))).unwrap()),
    );
    assert_eq!(*resources.subscriptions().endpoints, names(["api", "web"]));
    // So is a listener that names other routes (its version with r1 serves meanwhile).
    resources
        .listeners
        .insert("edge".into(), held_listener("edge", "r2"));
    resources.retain_wanted();
    assert_eq!(*resources.subscriptions().routes, names(["r1", "r2"]));
}

#[test]
fn clusters_are_made_again_only_when_what_they_are_made_from_changes() {
    let made = || CLUSTERS_MADE.with(std::cell::Cell::get);
    let mut resources = web_behind_edge_ready();
    let start = made();
    let first = resources.sections().unwrap();
    assert_eq!(made() - start, 1);
    let port = |s: &Sections| format!("{:?}", s.clusters[0].endpoints);

    // A route change makes the same clusters, without making them again; so does a copy.
    resources
        .routes
        .insert("r1".into(), held_routes("r1", "api"));
    let second = resources.sections().unwrap();
    assert_eq!(made() - start, 1);
    assert!(Arc::ptr_eq(&first.clusters[0], &second.clusters[0]));
    assert_ne!(first.inputs, second.inputs);
    let mut copy = resources.clone();
    assert_eq!(copy.sections().unwrap().inputs, second.inputs);
    assert_eq!(made() - start, 1);

    // Their endpoints changing makes them again, and the new ones are in force.
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8002));
    let third = resources.sections().unwrap();
    assert_eq!(made() - start, 2);
    assert!(port(&third).contains("8002"), "{}", port(&third));
    assert!(port(&first).contains("8001"));
    // So does a cluster going: its listener's routes answer 503 and it warms no more.
    resources.clusters.remove("web");
    let fourth = resources.sections().unwrap();
    assert_eq!(made() - start, 3);
    assert!(fourth.clusters.is_empty() && fourth.warming.clusters.is_empty());
}

#[test]
fn clusters_wait_for_endpoints_and_listeners_for_routes() {
    let mut resources = web_behind_edge();
    assert_eq!(*resources.subscriptions().endpoints, names(["web"]));
    assert_eq!(*resources.subscriptions().routes, names(["r1"]));
    let Sections {
        listeners,
        clusters,
        warming,
        ..
    } = resources.sections().unwrap();
    assert!(listeners.is_empty() && clusters.is_empty());
    assert_eq!(warming.clusters, ["web"]);
    assert_eq!(warming.listeners, ["edge"]);

    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8001));
    resources
        .routes
        .insert("r1".into(), held_routes("r1", "web"));
    let Sections {
        listeners,
        clusters,
        warming,
        ..
    } = resources.sections().unwrap();
    assert_eq!(warming, Warming::default());
    assert!(matches!(&clusters[0].endpoints[..], [e] if e.address.to_string() == "127.0.0.1:8001"));
    assert_eq!(
        listeners[0].virtual_hosts[0].route(0).cluster.as_deref(),
        Some("web")
    );

    // Updated to routes that have not come: the previous version keeps serving.
    resources
        .listeners
        .insert("edge".into(), held_listener("edge", "r2"));
    let Sections {
        listeners, warming, ..
    } = resources.sections().unwrap();
    assert_eq!(warming.listeners, ["edge"]);
    assert_eq!(
        listeners.len(),
        1,
        "the version with routes serves meanwhile"
    );
    // r1 stays wanted while the old version serves; r2 is asked for.
    assert_eq!(*resources.subscriptions().routes, names(["r1", "r2"]));
    let warming_inputs = resources.sections().unwrap().inputs;

    resources
        .routes
        .insert("r2".into(), held_routes("r2", "web"));
    let Sections {
        warming, inputs, ..
    } = resources.sections().unwrap();
    assert_eq!(warming, Warming::default());
    assert_ne!(inputs, warming_inputs, "the new routes are in force");
    resources.retain_wanted();
    assert_eq!(
        resources.routes.keys().collect::<Vec<_>>(),
        ["r2"],
        "r1 is no longer named by anything"
    );

    // An update that changes nothing the sections are made of has the same inputs.
    resources
        .routes
        .insert("r9".into(), held_routes("r9", "web"));
    assert_eq!(resources.sections().unwrap().inputs, inputs);
    resources.retain_wanted();
    assert!(!resources.routes.contains_key("r9"));
    // So do endpoints nothing names, though nothing else changed.
    resources
        .endpoints
        .insert("stray".into(), held_endpoints("stray", 9));
    resources.retain_wanted();
    assert_eq!(resources.endpoints.keys().collect::<Vec<_>>(), ["web"]);

    // Without its cluster the endpoints go too.
    resources.clusters.clear();
    resources.retain_wanted();
    assert!(resources.endpoints.is_empty());
}

#[test]
fn a_dynamic_name_clashing_with_the_files_is_named_in_the_error() {
    let file = "listeners:\n  - name: edge\n    address: 127.0.0.1:0\n    routes:\n      - { match: { prefix: / }, direct_response: { status: 200 } }\n";
    let config = crate::Config::from_yaml(file).unwrap();
    let l = XdsListener::decode(&pack(&listener("edge", "r"))).unwrap();
    let r = XdsRoutes::decode(&pack(&routes("r", "web"))).unwrap();
    let error = compose(
        &config.origin,
        vec![
            l.section(
                &|_: &str| Some(&r),
                &BTreeMap::<&str, bool>::new(),
                &Default::default(),
                None,
            )
            .unwrap(),
        ],
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(error.starts_with("listener `edge`.name"), "{error}");
}

#[test]
fn a_route_configuration_without_routes_answers_404() {
    let empty = RouteConfiguration {
        name: "r".into(),
        ..Default::default()
    };
    let hosts = XdsRoutes::decode(&pack(&empty)).unwrap().section(
        &BTreeMap::<&str, bool>::new(),
        &[],
        &[],
        None,
    );
    assert_eq!(hosts.len(), 1);
    assert_eq!(
        hosts[0].routes[0]
            .direct_response
            .as_ref()
            .map(|d| d.status),
        Some(404)
    );
}

#[test]
fn the_bootstrap_needs_a_node_and_an_address() {
    let yaml = |ads: &str| format!("node: {{ id: edge-1 }}\ndynamic_resources: {{ ads: {ads} }}\n");
    let config = crate::Config::from_yaml(&yaml("{ address: \"unix:/run/xds.sock\" }")).unwrap();
    let xds = config.xds.unwrap();
    assert_eq!(
        xds.address,
        crate::ServiceEndpoint::Unix("/run/xds.sock".into())
    );
    assert_eq!(xds.protocol, AdsProtocol::Sotw);
    assert!(
        config.listeners.is_empty(),
        "every listener may come from the server"
    );
    for (bad, key) in [
        (
            yaml("{ address: nowhere }"),
            "dynamic_resources.ads.address",
        ),
        (
            yaml("{ address: \"127.0.0.1:1\", protocol: rest }"),
            "dynamic_resources.ads.protocol",
        ),
        (
            "dynamic_resources: { ads: { address: \"127.0.0.1:1\" } }\n".into(),
            "node",
        ),
    ] {
        let error = crate::Config::from_yaml(&bad).unwrap_err().to_string();
        assert!(error.starts_with(key), "{error}");
    }
}

#[test]
#[allow(deprecated)] // a field set only to be found
fn set_fields_reads_field_numbers_of_every_wire_type() {
    let mut c = Cluster {
        name: "x".into(),
        use_tcp_for_dns_lookups: true,
        ..Default::default()
    };
    c.per_connection_buffer_limit_bytes = Some(UInt32Value { value: 7 });
    let names = fields::set_fields(&c, fields::CLUSTER);
    assert_eq!(
        names,
        [
            "name",
            "per_connection_buffer_limit_bytes",
            "use_tcp_for_dns_lookups"
        ]
    );
    assert_eq!(
        fields::set_fields(&c, &[]),
        ["field 1", "field 5", "field 45"]
    );
}

#[test]
fn tls_contexts_take_files_and_refuse_inline_keys() {
    use envoy_types::pb::envoy::config::core::v3::{
        DataSource, TransportSocket, data_source, transport_socket,
    };
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, TlsCertificate,
        UpstreamTlsContext, common_tls_context,
    };
    let file = |path: &str| {
        Some(DataSource {
            specifier: Some(data_source::Specifier::Filename(path.into())),
            ..Default::default()
        })
    };
    let common = |key: Option<DataSource>| CommonTlsContext {
        tls_certificates: vec![TlsCertificate {
            certificate_chain: file("/etc/edge/cert.pem"),
            private_key: key,
            ..Default::default()
        }],
        validation_context_type: Some(
            common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext {
                    trusted_ca: file("/etc/edge/ca.pem"),
                    ..Default::default()
                },
            ),
        ),
        alpn_protocols: vec!["h2".into(), "http/1.1".into()],
        ..Default::default()
    };
    let socket = |any: Any| TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any)),
    };
    let downstream = |key| DownstreamTlsContext {
        common_tls_context: Some(common(key)),
        require_client_certificate: Some(envoy_types::pb::google::protobuf::BoolValue {
            value: true,
        }),
        ..Default::default()
    };

    let mut l = listener("edge", "r");
    l.filter_chains[0].transport_socket =
        Some(socket(pack(&downstream(file("/etc/edge/key.pem")))));
    l.filter_chains[0].transport_socket_connect_timeout = Some(PbDuration {
        seconds: 3,
        nanos: 0,
    });
    let r = XdsRoutes::decode(&pack(&routes("r", "web"))).unwrap();
    let raw = XdsListener::decode(&pack(&l))
        .unwrap()
        .section(
            &|_: &str| Some(&r),
            &BTreeMap::<&str, bool>::new(),
            &Default::default(),
            None,
        )
        .unwrap();
    let tls = raw.tls.unwrap();
    assert_eq!(tls.handshake_timeout, Some(Duration::from_secs(3)));
    assert_eq!(tls.certificates[0].cert_chain, "/etc/edge/cert.pem");
    assert_eq!(tls.certificates[0].private_key, "/etc/edge/key.pem");
    assert_eq!(tls.alpn.unwrap(), ["h2", "http/1.1"]);
    let client = tls.client_certificate.unwrap();
    assert_eq!(
        (client.ca.as_str(), client.required),
        ("/etc/edge/ca.pem", Some(true))
    );

    let inline = |text: &str| {
        Some(DataSource {
            specifier: Some(data_source::Specifier::InlineString(text.into())),
            ..Default::default()
        })
    };
    let pem = "Bag Attributes\n-----BEGIN PRIVATE KEY-----\nMC4=\n-----END PRIVATE KEY-----\n";
    l.filter_chains[0].transport_socket = Some(socket(pack(&downstream(inline(pem)))));
    let raw = XdsListener::decode(&pack(&l))
        .unwrap()
        .section(
            &|_: &str| Some(&r),
            &BTreeMap::<&str, bool>::new(),
            &Default::default(),
            None,
        )
        .unwrap();
    assert!(
        raw.tls.unwrap().certificates[0]
            .private_key
            .starts_with("-----BEGIN PRIVATE KEY")
    );
    l.filter_chains[0].transport_socket = Some(socket(pack(&downstream(inline("no pem")))));
    let error = XdsListener::decode(&pack(&l)).unwrap_err().to_string();
    assert!(
        error.contains("private_key") && error.contains("without a PEM block"),
        "{error}"
    );

    let mut c = eds_cluster("web");
    c.transport_socket = Some(socket(pack(&UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            validation_context_type: Some(
                common_tls_context::ValidationContextType::ValidationContext(
                    CertificateValidationContext {
                        trusted_ca: file("/etc/edge/ca.pem"),
                        ..Default::default()
                    },
                ),
            ),
            ..Default::default()
        }),
        sni: "api.internal".into(),
        ..Default::default()
    })));
    let tls = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named")
        .tls
        .unwrap();
    assert_eq!(tls.ca.as_deref(), Some("/etc/edge/ca.pem"));
    assert_eq!(tls.server_name.as_deref(), Some("api.internal"));
    assert!(tls.client_certificate.is_none());
}

#[test]
fn ext_authz_calls_the_one_host_of_its_cluster_and_routes_may_turn_it_off() {
    let l = resources::listener_with_filters(
        "edge",
        "127.0.0.1:0".parse().unwrap(),
        "r",
        vec![resources::ext_authz_filter("authz")],
    );
    let open = resources::without_ext_authz(resources::forward("/public", "web"));
    let r = resources::route_config("r", vec![open, resources::forward("/", "web")]);
    let mut resources = Resources::default();
    resources
        .listeners
        .insert("edge".into(), held(XdsListener::decode(&pack(&l)).unwrap()));
    resources
        .routes
        .insert("r".into(), held(XdsRoutes::decode(&pack(&r)).unwrap()));
    for name in ["web", "authz"] {
        resources.clusters.insert(
            name.into(),
            held(XdsCluster::decode(&pack(&eds_cluster(name))).unwrap()),
        );
    }
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8001));
    let Sections {
        listeners, warming, ..
    } = resources.sections().unwrap();
    assert!(listeners.is_empty(), "waits for the authorization cluster");
    assert_eq!(warming.listeners, ["edge"]);

    resources
        .endpoints
        .insert("authz".into(), held_endpoints("authz", 9191));
    let config = compose_ads(&mut resources).unwrap();
    let dumped = serde_json::to_value(&config.listeners[0]).unwrap();
    assert_eq!(
        dumped["http_filters"][0]["ext_authz"]["grpc"]["address"], "127.0.0.1:9191",
        "{dumped}"
    );
    assert!(dumped["http_filters"][0]["ext_authz"]["grpc"]["tls"].is_null());

    // A cluster that speaks TLS: so do the checks through it.
    use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
    let mut authz = eds_cluster("authz");
    authz.transport_socket = Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(
            &UpstreamTlsContext {
                sni: "authz.internal".into(),
                ..Default::default()
            },
        ))),
    });
    resources.clusters.insert(
        "authz".into(),
        held(XdsCluster::decode(&pack(&authz)).unwrap()),
    );
    let config = compose_ads(&mut resources).unwrap();
    let dumped = serde_json::to_value(&config.listeners[0]).unwrap();
    assert_eq!(
        dumped["http_filters"][0]["ext_authz"]["grpc"]["tls"]["server_name"], "authz.internal",
        "{dumped}"
    );
}

/// Envoy Gateway's one authorization filter per policy, each off in the chain and turned on
/// by the routes its policy covers: each is a filter of its own here, named by its suffix.
#[test]
fn several_ext_authz_filters_are_told_apart_by_name() {
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::envoy::config::route::v3::FilterConfig;
    use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ExtAuthz;
    use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
        ExtAuthzPerRoute, ext_authz_per_route,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter;
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        ListStringMatcher, StringMatcher, string_matcher::MatchPattern,
    };
    // As Envoy Gateway writes a gRPC service's: the headers sent, the route metadata sent.
    let named = |policy: &str, cluster: &str| {
        let mut filter = resources::ext_authz_filter(cluster);
        filter.name = format!("envoy.filters.http.ext_authz/securitypolicy/{policy}");
        filter.disabled = true;
        if let Some(http_filter::ConfigType::TypedConfig(any)) = &mut filter.config_type {
            let mut authz: ExtAuthz = prost::Message::decode(any.value.as_slice()).unwrap();
            authz.allowed_headers = Some(ListStringMatcher {
                patterns: vec![StringMatcher {
                    match_pattern: Some(MatchPattern::Exact("Header1".into())),
                    ignore_case: true,
                }],
            });
            authz.route_metadata_context_namespaces = vec!["envoy-gateway".into()];
            authz.clear_route_cache = policy == "users";
            *any = pack(&authz);
        }
        filter
    };
    let l = resources::listener_with_filters(
        "edge",
        "127.0.0.1:0".parse().unwrap(),
        "r",
        vec![
            named("users", "authz-users"),
            named("tenants", "authz-tenants"),
        ],
    );
    let turn_on = |mut route: Route, policy: &str| {
        route.typed_per_filter_config.insert(
            format!("envoy.filters.http.ext_authz/securitypolicy/{policy}"),
            pack(&FilterConfig {
                config: Some(pack(&ExtAuthzPerRoute {
                    r#override: Some(ext_authz_per_route::Override::CheckSettings(
                        Default::default(),
                    )),
                })),
                ..Default::default()
            }),
        );
        route
    };
    let mut tagged = resources::forward("/users", "web");
    tagged.metadata = Some(Metadata {
        filter_metadata: [(
            "envoy-gateway".to_string(),
            envoy_types::pb::google::protobuf::Struct {
                fields: [(
                    "name".to_string(),
                    envoy_types::pb::google::protobuf::Value {
                        kind: Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
                            "users".into(),
                        )),
                    },
                )]
                .into(),
            },
        )]
        .into(),
        ..Default::default()
    });
    let r = resources::route_config(
        "r",
        vec![
            turn_on(tagged, "users"),
            turn_on(turn_on(resources::forward("/", "web"), "users"), "tenants"),
            // Envoy Gateway's older form: a `FilterConfig` whose `config` is an empty `Any`.
            {
                let mut route = resources::forward("/empty", "web");
                route.typed_per_filter_config.insert(
                    "envoy.filters.http.ext_authz/securitypolicy/users".into(),
                    pack(&FilterConfig {
                        config: Some(Any::default()),
                        ..Default::default()
                    }),
                );
                route
            },
        ],
    );
    let mut resources = Resources::default();
    resources
        .listeners
        .insert("edge".into(), held(XdsListener::decode(&pack(&l)).unwrap()));
    resources
        .routes
        .insert("r".into(), held(XdsRoutes::decode(&pack(&r)).unwrap()));
    hold_eds_clusters(
        &mut resources,
        &[
            ("web", 8001),
            ("authz-users", 9191),
            ("authz-tenants", 9192),
        ],
    );
    let config = compose_ads(&mut resources).unwrap();
    let dumped = serde_json::to_value(&config.listeners[0]).unwrap();
    let chain = &dumped["http_filters"];
    assert_eq!(
        chain[0]["ext_authz/securitypolicy/users"]["grpc"]["address"], "127.0.0.1:9191",
        "{dumped}"
    );
    assert_eq!(
        chain[1]["ext_authz/securitypolicy/tenants"]["grpc"]["address"], "127.0.0.1:9192",
        "{dumped}"
    );
    assert_eq!(
        chain[0]["ext_authz/securitypolicy/users"]["grpc"]["allowed_headers"],
        serde_json::json!(["header1"]),
        "{dumped}"
    );
    assert_eq!(
        chain[0]["ext_authz/securitypolicy/users"]["route_metadata_context_namespaces"],
        serde_json::json!(["envoy-gateway"]),
        "{dumped}"
    );
    assert_eq!(
        chain[0]["ext_authz/securitypolicy/users"]["clear_route_cache"], true,
        "{dumped}"
    );
    assert!(
        chain[1]["ext_authz/securitypolicy/tenants"]
            .get("clear_route_cache")
            .is_none(),
        "{dumped}"
    );
    let routes = &config.listeners[0].route_config.routes;
    assert_eq!(
        serde_json::to_value(&routes[0].metadata).unwrap(),
        serde_json::json!({"envoy-gateway": {"name": "users"}})
    );
    let on = |route: usize, policy: &str| {
        let filters = routes[route]
            .filters
            .of_filter(&format!("ext_authz/securitypolicy/{policy}"));
        !filters.ext_authz.disabled
    };
    assert!(on(0, "users") && !on(0, "tenants"), "{dumped}");
    assert!(on(1, "users") && on(1, "tenants"), "{dumped}");
    assert!(on(2, "users") && !on(2, "tenants"), "{dumped}");

    // Two filters of a type under one name are refused by name.
    let twice = resources::listener_with_filters(
        "edge",
        "127.0.0.1:0".parse().unwrap(),
        "r",
        vec![named("users", "a"), named("users", "b")],
    );
    let error = XdsListener::decode(&pack(&twice)).unwrap_err().to_string();
    assert!(error.contains("a second `ext_authz` filter"), "{error}");
}

/// Envoy Gateway's access-log filters: a CEL expression, flags, and the combinations.
#[test]
fn access_log_filters_map_to_the_loggers_filters() {
    use envoy_types::pb::envoy::config::accesslog::v3::{
        AccessLog, AccessLogFilter, AndFilter, ComparisonFilter, ExtensionFilter,
        NotHealthCheckFilter, ResponseFlagFilter, StatusCodeFilter, access_log, access_log_filter,
        extension_filter,
    };
    use envoy_types::pb::envoy::config::core::v3::RuntimeUInt32;
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
    use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;
    let cel = |expression: &str| AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::ExtensionFilter(
            ExtensionFilter {
                name: "envoy.access_loggers.extension_filters.cel".into(),
                config_type: Some(extension_filter::ConfigType::TypedConfig(pack(
                    &ExpressionFilter {
                        expression: expression.into(),
                        ..Default::default()
                    },
                ))),
            },
        )),
    };
    let logger = |filter: AccessLogFilter| AccessLog {
        name: "envoy.access_loggers.file".into(),
        filter: Some(filter),
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&FileAccessLog {
            path: "/dev/stdout".into(),
            ..Default::default()
        }))),
    };
    let both = AccessLogFilter {
        filter_specifier: Some(access_log_filter::FilterSpecifier::AndFilter(AndFilter {
            filters: vec![
                cel("request.url_path.contains('v1beta3')"),
                AccessLogFilter {
                    filter_specifier: Some(access_log_filter::FilterSpecifier::StatusCodeFilter(
                        StatusCodeFilter {
                            comparison: Some(ComparisonFilter {
                                op: 1, // GE
                                value: Some(RuntimeUInt32 {
                                    default_value: 400,
                                    runtime_key: "access_log.min_status".into(),
                                }),
                            }),
                        },
                    )),
                },
                AccessLogFilter {
                    filter_specifier: Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(
                        ResponseFlagFilter {
                            flags: vec!["UF".into(), "UH".into()],
                        },
                    )),
                },
            ],
        })),
    };
    let logs = crate::access_log::xds::connection_manager_logs(vec![logger(both)], "hcm").unwrap();
    let crate::access_log::xds::XdsAccessLog::Settled(raw) = &logs[0] else {
        panic!("a file logger");
    };
    let checked =
        crate::access_log::filter::log_filter(raw.filter.clone().unwrap(), "filter").unwrap();
    let dumped = serde_json::to_value(&checked).unwrap();
    assert_eq!(
        dumped,
        serde_json::json!({"and": [
            {"expression": "request.url_path.contains('v1beta3')"},
            {"status_code": {"ge": 400}},
            {"response_flags": ["UF", "UH"]},
        ]})
    );

    // A filter Legate cannot evaluate is refused by name, never dropped.
    for (filter, named) in [
        (
            cel("connection.mtls"),
            "the CEL expression `connection.mtls`",
        ),
        (
            AccessLogFilter {
                filter_specifier: Some(access_log_filter::FilterSpecifier::NotHealthCheckFilter(
                    NotHealthCheckFilter {},
                )),
            },
            "not_health_check_filter",
        ),
    ] {
        let error = crate::access_log::xds::connection_manager_logs(vec![logger(filter)], "hcm")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains(named), "{error}");
    }
}

/// Envoy Gateway's `accesslog-formatters`: a JSON line with `%REQ_WITHOUT_QUERY(...)%` and the
/// formatter that brings it; another formatter is refused by name.
#[test]
fn the_req_without_query_formatter_is_taken() {
    use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
    use envoy_types::pb::envoy::config::core::v3::{
        SubstitutionFormatString, TypedExtensionConfig, substitution_format_string,
    };
    use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
        FileAccessLog, file_access_log,
    };
    use envoy_types::pb::google::protobuf::{Struct, Value, value};
    let logger = |formatter: (&str, &str)| AccessLog {
        name: "envoy.access_loggers.file".into(),
        filter: None,
        config_type: Some(access_log::ConfigType::TypedConfig(pack(&FileAccessLog {
            path: "/dev/stdout".into(),
            access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(
                SubstitutionFormatString {
                    format: Some(substitution_format_string::Format::JsonFormat(Struct {
                        fields: [(
                            "path_without_query".to_owned(),
                            Value {
                                kind: Some(value::Kind::StringValue(
                                    "%REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH)%".into(),
                                )),
                            },
                        )]
                        .into(),
                    })),
                    formatters: vec![TypedExtensionConfig {
                        name: formatter.0.into(),
                        typed_config: Some(Any {
                            type_url: formatter.1.into(),
                            value: Vec::new(),
                        }),
                    }],
                    ..Default::default()
                },
            )),
        }))),
    };
    let logs = crate::access_log::xds::connection_manager_logs(
        vec![logger((
            "envoy.formatter.req_without_query",
            "type.googleapis.com/envoy.extensions.formatter.req_without_query.v3.ReqWithoutQuery",
        ))],
        "hcm",
    )
    .unwrap();
    let crate::access_log::xds::XdsAccessLog::Settled(raw) = &logs[0] else {
        panic!("a file logger");
    };
    let json = raw.json_format.as_ref().unwrap();
    assert_eq!(
        json.get("path_without_query").and_then(|v| v.as_str()),
        Some("%REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH)%")
    );
    let format =
        crate::LogFormat::parse("%REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH)%").unwrap();
    assert_eq!(
        serde_json::to_value(&format).unwrap(),
        "%REQ_WITHOUT_QUERY(x-envoy-original-path?:path)%"
    );
    let error = crate::access_log::xds::connection_manager_logs(
        vec![logger((
            "envoy.formatter.metadata",
            "type.googleapis.com/envoy.extensions.formatter.metadata.v3.Metadata",
        ))],
        "hcm",
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(
        error.contains("formatters (`envoy.formatter.metadata`: req_without_query only)"),
        "{error}"
    );
    // A JSON format's other settings are checked as a text format's.
    let mut omitting = logger((
        "envoy.formatter.req_without_query",
        "type.googleapis.com/envoy.extensions.formatter.req_without_query.v3.ReqWithoutQuery",
    ));
    if let Some(access_log::ConfigType::TypedConfig(any)) = &mut omitting.config_type {
        let mut file = FileAccessLog::decode(any.value.as_slice()).unwrap();
        if let Some(file_access_log::AccessLogFormat::LogFormat(format)) =
            &mut file.access_log_format
        {
            format.omit_empty_values = true;
        }
        *any = pack(&file);
    }
    let error = crate::access_log::xds::connection_manager_logs(vec![omitting], "hcm")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(error.contains("omit_empty_values"), "{error}");
}

/// What control planes send that Envoy takes: names with `:` and `|`, "no limit" breakers,
/// no retries, `0s` for "no timeout", ext_authz settings on routes of a listener without
/// the filter.
#[test]
fn what_envoy_accepts_from_control_planes_is_accepted() {
    use envoy_types::pb::envoy::config::cluster::v3::CircuitBreakers;
    use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::Thresholds;
    use envoy_types::pb::envoy::config::core::v3::HttpProtocolOptions;
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;

    let mut l = listener("0.0.0.0_8080", "8080");
    let chain = &mut l.filter_chains[0].filters[0];
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.config_type else {
        panic!("a typed HCM");
    };
    let mut hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    let zero = Some(PbDuration {
        seconds: 0,
        nanos: 0,
    });
    hcm.request_headers_timeout = zero;
    hcm.stream_idle_timeout = zero;
    hcm.normalize_path = Some(envoy_types::pb::google::protobuf::BoolValue { value: false });
    hcm.path_with_escaped_slashes_action = 2; // REJECT_REQUEST
    hcm.common_http_protocol_options = Some(HttpProtocolOptions {
        idle_timeout: zero,
        max_connection_duration: zero,
        ..Default::default()
    });
    hcm.http2_protocol_options = Some(
        envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions {
            connection_keepalive: Some(
                envoy_types::pb::envoy::config::core::v3::KeepaliveSettings {
                    interval: Some(PbDuration {
                        seconds: 30,
                        nanos: 0,
                    }),
                    timeout: Some(PbDuration {
                        seconds: 5,
                        nanos: 0,
                    }),
                    interval_jitter: Some(envoy_types::pb::envoy::r#type::v3::Percent {
                        value: 15.0,
                    }),
                    ..Default::default()
                },
            ),
            ..Default::default()
        },
    );
    chain.config_type = Some(filter::ConfigType::TypedConfig(pack(&hcm)));

    let service = "outbound|80||web.default.svc.cluster.local";
    let mut r = resources::route_config(
        "8080",
        vec![resources::without_ext_authz(resources::forward(
            "/", service,
        ))],
    );
    r.virtual_hosts[0].name = "web.default.svc.cluster.local:80".into();
    let Some(route::Action::Route(action)) = &mut r.virtual_hosts[0].routes[0].action else {
        panic!("a forwarding route");
    };
    // Istio's retry policy on every route.
    use envoy_types::pb::envoy::config::route::v3::retry_policy::{
        RetryHostPredicate, retry_host_predicate,
    };
    action.retry_policy = Some(envoy_types::pb::envoy::config::route::v3::RetryPolicy {
        retry_on: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
            .into(),
        num_retries: Some(UInt32Value { value: 2 }),
        retriable_status_codes: vec![503],
        per_try_timeout: zero,
        retry_host_predicate: vec![RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: Some(retry_host_predicate::ConfigType::TypedConfig(
                envoy_types::pb::google::protobuf::Any {
                    type_url: "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate".into(),
                    value: Vec::new(),
                },
            )),
        }],
        host_selection_retry_max_attempts: 5,
        // With locality failover, Istio adds its previous_priorities (update_frequency 2).
        retry_priority: Some(envoy_types::pb::envoy::config::route::v3::retry_policy::RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(
                envoy_types::pb::envoy::config::route::v3::retry_policy::retry_priority::ConfigType::TypedConfig(
                    envoy_types::pb::google::protobuf::Any {
                        type_url: "type.googleapis.com/envoy.extensions.retry.priority.previous_priorities.v3.PreviousPrioritiesConfig".into(),
                        value: vec![8, 2],
                    },
                ),
            ),
        }),
        ..Default::default()
    });

    let mut c = eds_cluster(service);
    let unlimited = Some(UInt32Value { value: u32::MAX });
    c.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![Thresholds {
            max_connections: unlimited,
            max_pending_requests: unlimited,
            max_requests: unlimited,
            max_retries: Some(UInt32Value { value: 0 }),
            max_connection_pools: Some(UInt32Value { value: 64 }),
            ..Default::default()
        }],
        ..Default::default()
    });

    let mut resources = Resources::default();
    resources.listeners.insert(
        "0.0.0.0_8080".into(),
        held(XdsListener::decode(&pack(&l)).unwrap()),
    );
    resources
        .routes
        .insert("8080".into(), held(XdsRoutes::decode(&pack(&r)).unwrap()));
    resources
        .clusters
        .insert(service.into(), held(XdsCluster::decode(&pack(&c)).unwrap()));
    resources
        .endpoints
        .insert(service.into(), held_endpoints(service, 8001));
    let Sections {
        listeners,
        clusters,
        warming,
        ..
    } = resources.sections().unwrap();
    assert_eq!(warming, Warming::default());
    let retry = listeners[0].virtual_hosts[0].route(0).retry_policy.as_ref();
    assert_eq!(retry.map(|r| r.per_try_timeout), Some(None));
    assert_eq!(retry.and_then(|r| r.previous_priorities), Some(2));
    let origin = crate::Config::from_yaml(
        "node: { id: n }\ndynamic_resources: { ads: { address: \"127.0.0.1:1\" } }\n",
    )
    .unwrap()
    .origin;
    let config = compose(&origin, listeners, clusters).unwrap();
    let http = &config.listeners[0].http;
    assert_eq!(http.idle_timeout, Duration::from_secs(24 * 3600));
    assert_eq!(http.max_connection_duration, None, "0s: no limit");
    assert_eq!(
        http.http2_keepalive,
        Some(crate::Keepalive {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
        })
    );
    // Envoy's defaults: the server header overwritten (with this proxy's name), and a
    // client's request id not trusted on an edge listener.
    assert_eq!(
        http.server_header,
        crate::ServerHeader::Overwrite("legate".into())
    );
    assert!(http.request_id.generate && !http.request_id.preserve_external);
    assert_eq!(http.stream_idle_timeout, Duration::from_secs(24 * 3600));
    assert_eq!(
        http.request_headers_timeout,
        crate::DEFAULT_REQUEST_HEADERS_TIMEOUT
    );
    assert_eq!(
        http.path_normalization,
        crate::PathNormalization {
            normalize: false,
            merge_slashes: true,
            escaped_slashes: crate::EscapedSlashes::Reject,
        }
    );
    let crate::RouteAction::Forward(forward) = &config.listeners[0].route_config.routes[0].action
    else {
        panic!("a forwarding route");
    };
    let retry = forward.retry_policy.as_ref().expect("a retry policy");
    assert!(retry.retry_on.grpc_unavailable && retry.retry_on.grpc_cancelled);
    assert!(retry.previous_hosts);
    assert_eq!(retry.host_selection_attempts, 6);
    assert_eq!(retry.num_retries, 2);
    assert_eq!(
        retry.back_off.base_interval,
        std::time::Duration::from_millis(25)
    );
    let breakers = &config.clusters[0].circuit_breakers;
    assert_eq!(breakers.max_requests.resolve(2), u32::MAX);
    assert_eq!(breakers.max_retries.resolve(2), 0);
    assert_eq!(breakers.max_connection_pools, Some(64));
}

#[test]
fn the_proxy_protocol_filter_and_forwarded_for_trust_translate() {
    use envoy_types::pb::envoy::config::listener::v3::{ListenerFilter, filter, listener_filter};
    use envoy_types::pb::envoy::extensions::filters::listener::proxy_protocol::v3::{
        ProxyProtocol, proxy_protocol,
    };
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use envoy_types::pb::google::protobuf::BoolValue;

    let proxy_protocol = |config: &ProxyProtocol| ListenerFilter {
        name: "envoy.filters.listener.proxy_protocol".into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack(config))),
        ..Default::default()
    };
    let section = |l: &Listener| {
        XdsListener::decode(&pack(l))
            .unwrap()
            .section(
                &|_: &str| None,
                &BTreeMap::<&str, bool>::new(),
                &std::collections::BTreeMap::new(),
                None,
            )
            .unwrap()
    };

    // Without the filter nor the HCM fields: Envoy's defaults.
    let raw = section(&listener("edge", "routes"));
    assert!(raw.proxy_protocol.is_none());
    assert_eq!(raw.http.use_remote_address, Some(false));
    assert_eq!(raw.http.xff_num_trusted_hops, Some(0));
    assert_eq!(raw.http.forward_client_cert.as_deref(), Some("sanitize"));

    let mut l = listener("edge", "routes");
    l.listener_filters = vec![proxy_protocol(&ProxyProtocol {
        allow_requests_without_proxy_protocol: true,
        disallowed_versions: vec![0],
        stat_prefix: "nlb".into(),
        ..Default::default()
    })];
    let Some(filter::ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type
    else {
        panic!("an HCM");
    };
    let mut hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    hcm.use_remote_address = Some(BoolValue { value: true });
    hcm.xff_num_trusted_hops = 2;
    hcm.forward_client_cert_details = 2; // APPEND_FORWARD
    hcm.set_current_client_cert_details = Some(
        envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::SetCurrentClientCertDetails {
            subject: Some(BoolValue { value: true }),
            dns: true,
            ..Default::default()
        },
    );
    l.filter_chains[0].filters[0].config_type = Some(filter::ConfigType::TypedConfig(pack(&hcm)));
    let raw = section(&l);
    assert_eq!(
        raw.http.forward_client_cert.as_deref(),
        Some("append_forward")
    );
    let details = raw.http.set_current_client_cert_details.unwrap();
    assert!(details.subject && details.dns && !details.cert && !details.uri && !details.chain);
    let pp = raw.proxy_protocol.unwrap();
    assert_eq!(pp.versions, Some(vec!["v2".to_string()]));
    assert_eq!(pp.required, Some(false));
    assert_eq!(raw.http.use_remote_address, Some(true));
    assert_eq!(raw.http.xff_num_trusted_hops, Some(2));

    // TLVs kept as metadata are never read: refused by name.
    l.listener_filters = vec![proxy_protocol(&ProxyProtocol {
        rules: vec![proxy_protocol::Rule {
            tlv_type: 0xEA,
            ..Default::default()
        }],
        ..Default::default()
    })];
    let error = XdsListener::decode(&pack(&l)).unwrap_err().to_string();
    assert!(
        error.contains("listener_filters[0]") && error.contains("rules"),
        "{error}"
    );
}

#[test]
#[allow(deprecated)] // control planes send `total_weight` and `prefix_match` still
fn route_features_beyond_one_cluster_are_refused_by_name_where_they_cannot_hold() {
    use envoy_types::pb::envoy::config::route::v3::{WeightedCluster, weighted_cluster};
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

    let with = |change: &dyn Fn(&mut Route)| {
        let mut config = routes("r", "web");
        change(&mut config.virtual_hosts[0].routes[0]);
        XdsRoutes::decode(&pack(&config)).map(|c| {
            let ready: BTreeMap<&str, bool> = [("web", true), ("v2", true)].into_iter().collect();
            c.section(&ready, &[], &[], None)
        })
    };
    fn action(r: &mut Route) -> &mut RouteAction {
        match &mut r.action {
            Some(route::Action::Route(action)) => action,
            _ => panic!("a forwarding route"),
        }
    }
    let weights = |clusters: &[(&str, u32)], total: Option<u32>| {
        route_action::ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: clusters
                .iter()
                .map(|(name, weight)| weighted_cluster::ClusterWeight {
                    name: (*name).into(),
                    weight: Some(UInt32Value { value: *weight }),
                    ..Default::default()
                })
                .collect(),
            total_weight: total.map(|value| UInt32Value { value }),
            ..Default::default()
        })
    };

    // A split: weight 0 left out; a cluster not there left out too.
    let hosts = with(&|r| {
        action(r).cluster_specifier = Some(weights(
            &[("web", 2), ("v2", 1), ("v3", 0), ("gone", 1)],
            Some(4),
        ))
    })
    .unwrap();
    let split = hosts[0].routes[0].weighted_clusters.as_ref().unwrap();
    let names: Vec<(&str, u32)> = split
        .iter()
        .map(|c| (c.cluster.as_str(), c.weight))
        .collect();
    assert_eq!(names, [("web", 2), ("v2", 1)]);

    let refused = |change: &dyn Fn(&mut Route), needle: &str| {
        let error = with(change).unwrap_err().to_string();
        assert!(error.contains(needle), "{needle}: {error}");
    };
    refused(
        &|r| action(r).cluster_specifier = Some(weights(&[("web", 1)], Some(3))),
        "total_weight",
    );
    refused(
        &|r| action(r).cluster_specifier = Some(weights(&[("web", 0)], None)),
        "above 0",
    );
    // A cluster named by a request header: kept whatever clusters are there (each request
    // looks its own up), for the route, a side of its split and a mirror.
    let hosts = with(&|r| {
        let a = action(r);
        a.cluster_specifier = Some(route_action::ClusterSpecifier::ClusterHeader(
            "x-cluster".into(),
        ));
        a.request_mirror_policies = vec![route_action::RequestMirrorPolicy {
            cluster_header: "x-mirror".into(),
            ..Default::default()
        }];
    })
    .unwrap();
    let route = &hosts[0].routes[0];
    assert_eq!(route.cluster_header.as_deref(), Some("x-cluster"));
    assert!(route.direct_response.is_none());
    assert_eq!(
        route.request_mirror_policies[0].cluster_header.as_deref(),
        Some("x-mirror")
    );
    let hosts = with(&|r| {
        let mut split = weights(&[("web", 1), ("", 1)], None);
        if let route_action::ClusterSpecifier::WeightedClusters(w) = &mut split {
            w.clusters[1].cluster_header = "x-side".into();
        }
        action(r).cluster_specifier = Some(split);
    })
    .unwrap();
    let split = hosts[0].routes[0].weighted_clusters.as_ref().unwrap();
    assert_eq!(split.len(), 2);
    assert_eq!(split[1].cluster_header.as_deref(), Some("x-side"));
    refused(
        &|r| {
            r.r#match.as_mut().unwrap().headers = vec![HeaderMatcher {
                name: "x-a".into(),
                invert_match: true,
                header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::PrefixMatch(
                    "b".into(),
                )),
                ..Default::default()
            }]
        },
        "invert_match",
    );
    refused(
        &|r| {
            r.r#match.as_mut().unwrap().headers = vec![HeaderMatcher {
                name: "x-a".into(),
                header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
                    StringMatcher {
                        ignore_case: true,
                        match_pattern: Some(string_matcher::MatchPattern::Exact("b".into())),
                    },
                )),
                ..Default::default()
            }]
        },
        "ignore_case",
    );
}

/// docs/xds.md against the code, field by field, for the messages whose table names their
/// own fields (Listener, HttpConnectionManager, Cluster): each field of the message is set
/// on a resource that is otherwise accepted, and the translation must refuse it by name
/// exactly when the docs do not list it as honoured or accepted.
mod docs {
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;

    use super::*;

    /// The fields the rows of some sections of docs/xds.md list as honoured or accepted, as
    /// written (`field`, `match.prefix`, `virtual_hosts[].name`), except rows that refuse.
    fn documented(sections: &[&str]) -> Vec<String> {
        let doc = include_str!("../../../../docs/xds.md");
        let mut fields = Vec::new();
        for section in sections {
            let start = doc
                .find(&format!("\n### {section}\n"))
                .unwrap_or_else(|| panic!("docs/xds.md has no section `### {section}`"));
            let body = &doc[start + section.len() + 6..];
            let body = &body[..body.find("\n#").unwrap_or(body.len())];
            for row in body.lines().filter(|l| l.starts_with("| `")) {
                let mut cells = row.split('|').skip(1);
                let (Some(names), Some(honoured)) = (cells.next(), cells.next()) else {
                    continue;
                };
                let honoured = honoured.trim();
                if honoured.starts_with("**not yet**") || honoured == "refused" {
                    continue;
                }
                fields.extend(names.split('`').skip(1).step_by(2).map(str::to_owned));
            }
        }
        fields
    }

    /// The first-level names of the documented fields under `prefix` (`""`: the bare ones).
    fn level(documented: &[String], prefix: &str) -> BTreeSet<String> {
        documented
            .iter()
            .filter_map(|field| field.strip_prefix(prefix))
            .map(|rest| {
                rest.split(['.', '[', ' '])
                    .next()
                    .unwrap_or(rest)
                    .to_owned()
            })
            .collect()
    }

    /// Every name in the documented fields' paths, at any level.
    fn any_level(documented: &[String]) -> BTreeSet<String> {
        documented
            .iter()
            .flat_map(|field| field.split(['.', '[', ']', ' ']))
            .filter(|name| !name.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// `base` with field `number` set to a value of its own type (an empty message, a short
    /// string, or 1), found by trying each encoding until one decodes and sets the field.
    fn with_field<M: Message + Default>(base: &M, number: u32, table: &[(u32, &str)]) -> Option<M> {
        let name = table.iter().find(|(n, _)| *n == number)?.1;
        let key = |wire: u32| u64::from(number << 3 | wire);
        let mut encodings: Vec<Vec<u8>> = Vec::new();
        for (wire, value) in [
            (2, vec![0u8]),
            (2, vec![1u8, b'x']),
            (0, vec![1u8]),
            (1, 1u64.to_le_bytes().to_vec()),
            (5, 1u32.to_le_bytes().to_vec()),
        ] {
            let mut bytes = base.encode_to_vec();
            prost::encoding::encode_varint(key(wire), &mut bytes);
            bytes.extend_from_slice(&value);
            encodings.push(bytes);
        }
        encodings.into_iter().find_map(|bytes| {
            let message = M::decode(bytes.as_slice()).ok()?;
            fields::set_fields(&message, table)
                .iter()
                .any(|f| f == name)
                .then_some(message)
        })
    }

    /// The name docs/xds.md would give the field: its own, or for a member of a `oneof` (named
    /// by the oneof in the table, where it appears once per member) the member's, as `Debug`
    /// shows it.
    fn doc_name<M: std::fmt::Debug>(
        message: &M,
        table: &[(u32, &str)],
        table_name: &str,
    ) -> String {
        let oneof = table.iter().filter(|(_, n)| *n == table_name).count() > 1;
        let shown = format!("{message:?}");
        let marker = format!("{table_name}: Some(");
        let Some(at) = shown.find(&marker).filter(|_| oneof) else {
            return table_name.to_owned();
        };
        let variant: String = shown[at + marker.len()..]
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect();
        let mut snake = String::new();
        for (i, c) in variant.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                snake.push('_');
            }
            snake.push(c.to_ascii_lowercase());
        }
        snake
    }

    /// Whether `error` refuses the field by name.
    fn refuses(error: &ResourceError, name: &str) -> bool {
        match error {
            // `name`, or `name (what of it)`, or something in it (`at` ends with the name).
            ResourceError::Unsupported { at, fields } => {
                at.ends_with(&format!(".{name}"))
                    || fields
                        .iter()
                        .any(|f| f == name || f.starts_with(&format!("{name} (")))
            }
            ResourceError::Invalid { message, .. } => {
                message.contains(name)
                    && (message.contains("not supported") || message.contains("refused"))
            }
            ResourceError::Decode { .. } => false,
        }
    }

    /// Whether `error` refuses the field by its bare name (no reason, no key given).
    fn plainly_refuses(error: &ResourceError, table_name: &str, name: &str) -> bool {
        let keyed = documented_keys()
            .iter()
            .any(|k| k == name || k == table_name);
        matches!(error, ResourceError::Unsupported { fields, .. }
            if !keyed && fields.iter().any(|f| f == table_name || f == name))
    }

    /// Map fields docs/xds.md lists with the one key honoured (`field["key"]`): other keys are
    /// refused by the field's name.
    fn documented_keys() -> Vec<String> {
        include_str!("../../../../docs/xds.md")
            .split('`')
            .skip(1)
            .step_by(2)
            .filter_map(|token| token.split_once("[\"").map(|(field, _)| field.to_owned()))
            .collect()
    }

    /// Every field of `table` checked on `base`: (field, documented, refused) where the two
    /// disagree.
    fn disagreements<M: Message + Default + std::fmt::Debug>(
        section: &str,
        documented: &BTreeSet<String>,
        strict: bool,
        base: &M,
        table: &[(u32, &str)],
        translate: impl Fn(&M) -> Result<(), ResourceError>,
    ) -> Vec<String> {
        translate(base).unwrap_or_else(|e| panic!("the base {section} is refused: {e}"));
        let mut wrong = Vec::new();
        let mut named = BTreeSet::new();
        for &(number, table_name) in table {
            let Some(message) = with_field(base, number, table) else {
                wrong.push(format!(
                    "{section}: field {number} ({table_name}) could not be set"
                ));
                continue;
            };
            let name = doc_name(&message, table, table_name);
            named.insert(name.clone());
            let refused = match translate(&message) {
                Ok(()) => false,
                Err(error) => refuses(&error, table_name) || refuses(&error, &name),
            };
            let listed = documented.contains(&name) || documented.contains(table_name);
            // A listed field may refuse the sample value with a reason (`codec_type (AUTO
            // only)`), or a map's key it does not take; refused by its bare name, it is not
            // honoured at all.
            let refused = refused
                && (!listed
                    || translate(&message).is_err_and(|e| plainly_refuses(&e, table_name, &name)));
            if listed == refused {
                wrong.push(format!(
                    "{section}.{name}: {} in docs/xds.md, {} by the code",
                    if listed { "honoured" } else { "not listed" },
                    if refused { "refused" } else { "accepted" },
                ));
            }
        }
        for name in documented.difference(&named).filter(|_| strict) {
            if !table.iter().any(|(_, n)| n == name) {
                wrong.push(format!(
                    "{section}.{name}: in docs/xds.md, not a field of the message"
                ));
            }
        }
        wrong
    }

    fn hcm_of(listener: &Listener) -> HttpConnectionManager {
        let Some(filter::ConfigType::TypedConfig(any)) =
            &listener.filter_chains[0].filters[0].config_type
        else {
            panic!("the test listener has its connection manager inline");
        };
        HttpConnectionManager::decode(any.value.as_slice()).expect("a connection manager")
    }

    #[test]
    fn the_field_tables_of_docs_xds_md_are_what_the_code_does() {
        let strict = |section: &str| level(&documented(&[section]), "");
        let base = listener("web", "routes");
        let mut wrong = disagreements(
            "Listener",
            &strict("Listener"),
            true,
            &base,
            fields::LISTENER,
            |l| XdsListener::decode(&pack(l)).map(drop),
        );
        let hcm = hcm_of(&base);
        wrong.extend(disagreements(
            "HttpConnectionManager",
            &strict("HttpConnectionManager"),
            true,
            &hcm,
            fields::HTTP_CONNECTION_MANAGER,
            |hcm| {
                let mut l = base.clone();
                l.filter_chains[0].filters[0].config_type =
                    Some(filter::ConfigType::TypedConfig(pack(hcm)));
                XdsListener::decode(&pack(&l)).map(drop)
            },
        ));
        wrong.extend(disagreements(
            "Cluster",
            &strict("Cluster"),
            true,
            &eds_cluster("web"),
            fields::CLUSTER,
            |c| XdsCluster::decode(&pack(c)).map(drop),
        ));

        // Routes: one section for the route configuration, its virtual hosts and routes, with
        // their fields written from the configuration down (`virtual_hosts[].name`,
        // `match.prefix`, `route.cluster`); per-route filter settings are in the filter's.
        let routing = documented(&[
            "RouteConfiguration, VirtualHost, Route",
            "ext_authz (HTTP filter)",
        ]);
        let config = routes("r", "web");
        let translate = |c: &RouteConfiguration| XdsRoutes::decode(&pack(c)).map(drop);
        wrong.extend(disagreements(
            "RouteConfiguration",
            &level(&routing, ""),
            false,
            &config,
            fields::ROUTE_CONFIGURATION,
            translate,
        ));
        let host = config.virtual_hosts[0].clone();
        wrong.extend(disagreements(
            "VirtualHost",
            &level(&routing, "virtual_hosts[]."),
            false,
            &host,
            fields::VIRTUAL_HOST,
            |h| {
                let mut c = config.clone();
                c.virtual_hosts[0] = h.clone();
                translate(&c)
            },
        ));
        let route = host.routes[0].clone();
        let in_config = |r: &Route| {
            let mut c = config.clone();
            c.virtual_hosts[0].routes[0] = r.clone();
            translate(&c)
        };
        wrong.extend(disagreements(
            "Route",
            &level(&routing, ""),
            false,
            &route,
            fields::ROUTE,
            in_config,
        ));
        let Some(matcher) = route.r#match.clone() else {
            panic!("the test route has a match");
        };
        wrong.extend(disagreements(
            "RouteMatch",
            &level(&routing, "match."),
            false,
            &matcher,
            fields::ROUTE_MATCH,
            |m| {
                let mut r = route.clone();
                r.r#match = Some(m.clone());
                in_config(&r)
            },
        ));
        let Some(route::Action::Route(action)) = route.action.clone() else {
            panic!("the test route forwards");
        };
        wrong.extend(disagreements(
            "RouteAction",
            &level(&routing, "route."),
            false,
            &action,
            fields::ROUTE_ACTION,
            |a| {
                let mut r = route.clone();
                r.action = Some(route::Action::Route(a.clone()));
                in_config(&r)
            },
        ));

        // Endpoints: the section writes paths from the assignment down, and names the
        // fields of the levels below by their own names.
        let endpoints = any_level(&documented(&["ClusterLoadAssignment"]));
        let assignment = assignment("web", vec![lb_endpoint(9000, HealthStatus::Healthy, None)]);
        let translate = |a: &ClusterLoadAssignment| XdsEndpoints::decode(&pack(a)).map(drop);
        wrong.extend(disagreements(
            "ClusterLoadAssignment",
            &endpoints,
            false,
            &assignment,
            fields::CLUSTER_LOAD_ASSIGNMENT,
            translate,
        ));
        let locality = assignment.endpoints[0].clone();
        let with_locality = |l: &LocalityLbEndpoints| {
            let mut a = assignment.clone();
            a.endpoints[0] = l.clone();
            translate(&a)
        };
        wrong.extend(disagreements(
            "LocalityLbEndpoints",
            &endpoints,
            false,
            &locality,
            fields::LOCALITY_LB_ENDPOINTS,
            with_locality,
        ));
        let host = locality.lb_endpoints[0].clone();
        wrong.extend(disagreements(
            "LbEndpoint",
            &endpoints,
            false,
            &host,
            fields::LB_ENDPOINT,
            |h| {
                let mut l = locality.clone();
                l.lb_endpoints[0] = h.clone();
                with_locality(&l)
            },
        ));
        assert!(
            wrong.is_empty(),
            "docs/xds.md and the code disagree:\n{}",
            wrong.join("\n")
        );
    }
}

/// Contour's chain: an RBAC filter without rules and a local rate limit with only its stats
/// prefix (no share enabled) enforce nothing, and are taken; an RBAC principal on metadata is
/// refused by name. Direct
/// responses are held to `max_direct_response_body_size_bytes` (4096 by default).
#[test]
fn filters_that_enforce_nothing_are_taken_and_direct_bodies_are_bounded() {
    use envoy_types::pb::envoy::config::rbac::v3::Rbac as Rules;
    use envoy_types::pb::envoy::extensions::filters::http::local_ratelimit::v3::LocalRateLimit;
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpFilter, http_filter,
    };
    let filter = |name: &str, any: Any| HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any)),
        ..Default::default()
    };
    let chain = |rbac: Rbac| {
        resources::listener_with_filters(
            "contour",
            "127.0.0.1:0".parse().unwrap(),
            "ingress_http",
            vec![
                filter("envoy.filters.http.rbac", pack(&rbac)),
                filter(
                    "envoy.filters.http.local_ratelimit",
                    pack(&LocalRateLimit {
                        stat_prefix: "http".into(),
                        ..Default::default()
                    }),
                ),
            ],
        )
    };
    assert!(XdsListener::decode(&pack(&chain(Rbac::default()))).is_ok());
    // Rules are taken (filters/rbac); what they ask that is not here is refused by name.
    #[allow(deprecated)]
    let claims = envoy_types::pb::envoy::config::rbac::v3::Principal {
        identifier: Some(
            envoy_types::pb::envoy::config::rbac::v3::principal::Identifier::Metadata(
                Default::default(),
            ),
        ),
    };
    let with_claims = Rbac {
        rules: Some(Rules {
            policies: [(
                "p".to_string(),
                envoy_types::pb::envoy::config::rbac::v3::Policy {
                    permissions: vec![envoy_types::pb::envoy::config::rbac::v3::Permission {
                        rule: Some(
                            envoy_types::pb::envoy::config::rbac::v3::permission::Rule::Any(true),
                        ),
                    }],
                    principals: vec![claims],
                    ..Default::default()
                },
            )]
            .into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let refused = XdsListener::decode(&pack(&chain(with_claims)))
        .unwrap_err()
        .to_string();
    assert!(refused.contains("metadata"), "{refused}");

    let mut big = resources::route_config("r", vec![resources::direct("/", 200)]);
    let Some(route::Action::DirectResponse(direct)) = &mut big.virtual_hosts[0].routes[0].action
    else {
        panic!("a direct response");
    };
    direct.body = Some(envoy_types::pb::envoy::config::core::v3::DataSource {
        specifier: Some(
            envoy_types::pb::envoy::config::core::v3::data_source::Specifier::InlineString(
                "x".repeat(5000),
            ),
        ),
        ..Default::default()
    });
    let refused = XdsRoutes::decode(&pack(&big)).unwrap_err().to_string();
    assert!(
        refused.contains("max_direct_response_body_size_bytes"),
        "{refused}"
    );
    big.max_direct_response_body_size_bytes = Some(UInt32Value { value: 1 << 20 });
    assert!(XdsRoutes::decode(&pack(&big)).is_ok());
}

#[test]
fn cors_policies_with_values_envoy_would_not_read_are_refused() {
    use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
    let with_policy = |policy: CorsPolicy| {
        let mut config = resources::route_config("r", vec![resources::forward("/", "backend")]);
        config.virtual_hosts[0].routes[0]
            .typed_per_filter_config
            .insert("envoy.filters.http.cors".into(), pack(&policy));
        XdsRoutes::decode(&pack(&config)).map(|_| ())
    };
    assert!(
        with_policy(CorsPolicy {
            max_age: "600".into(),
            allow_methods: "GET,POST".into(),
            ..Default::default()
        })
        .is_ok()
    );
    let refused = with_policy(CorsPolicy {
        max_age: "ten minutes".into(),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("typed_per_filter_config.envoy.filters.http.cors.max_age"),
        "{refused}"
    );
}

#[test]
fn istios_uuid_request_ids_are_taken_and_other_extensions_refused() {
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, RequestIdExtension,
    };
    use envoy_types::pb::envoy::extensions::request_id::uuid::v3::UuidRequestIdConfig;

    let with_extension = |typed_config: Any| {
        let mut l = listener("istio", "8080");
        let chain = &mut l.filter_chains[0].filters[0];
        let Some(filter::ConfigType::TypedConfig(any)) = &chain.config_type else {
            panic!("a typed HCM");
        };
        let mut hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
        hcm.request_id_extension = Some(RequestIdExtension {
            typed_config: Some(typed_config),
        });
        chain.config_type = Some(filter::ConfigType::TypedConfig(pack(&hcm)));
        XdsListener::decode(&pack(&l)).map(|_| ())
    };
    assert!(with_extension(pack(&UuidRequestIdConfig::default())).is_ok());
    let refused = with_extension(Any {
        type_url: "type.googleapis.com/example.RequestId".into(),
        value: Vec::new(),
    })
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("request_id_extension") && refused.contains("example.RequestId"),
        "{refused}"
    );
}

#[test]
fn routes_whose_path_can_never_match_are_left_out() {
    let mut config = resources::route_config(
        "r",
        vec![
            resources::forward("/", "backend"),
            resources::forward("/", "backend"),
        ],
    );
    // As Envoy Gateway writes a path without its `/`: taken, and never matched.
    config.virtual_hosts[0].routes[0].r#match = Some(RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Path("foo/bar".into())),
        ..Default::default()
    });
    let routes = XdsRoutes::decode(&pack(&config)).unwrap();
    let ready = BTreeMap::from([("backend", true)]);
    let hosts = routes.section(&ready, &[], &[], None);
    assert_eq!(hosts[0].routes.len(), 1);
    assert_eq!(hosts[0].routes[0].matcher.prefix.as_deref(), Some("/"));
}

#[test]
fn http1_trailers_turned_on_are_what_legate_does() {
    use envoy_types::pb::envoy::config::core::v3::Http1ProtocolOptions;
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;

    let mut l = listener("trailers", "8080");
    let chain = &mut l.filter_chains[0].filters[0];
    let Some(filter::ConfigType::TypedConfig(any)) = &chain.config_type else {
        panic!("a typed HCM");
    };
    let mut hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    hcm.http_protocol_options = Some(Http1ProtocolOptions {
        enable_trailers: true,
        ..Default::default()
    });
    chain.config_type = Some(filter::ConfigType::TypedConfig(pack(&hcm)));
    assert!(XdsListener::decode(&pack(&l)).is_ok());
}

/// One collector per process: a listener naming another than the one in force is refused
/// by name; the file's own `tracing` counts as the one in force.
#[test]
fn listeners_naming_another_collector_are_refused() {
    let file = "dynamic_resources: { ads: { address: '127.0.0.1:1' } }\nnode: { id: n }\n";
    let config = crate::Config::from_yaml(file).unwrap();
    let r = XdsRoutes::decode(&pack(&routes("r", "web"))).unwrap();
    let with_collector = |name: &str, endpoint: &str| {
        let mut raw = XdsListener::decode(&pack(&listener(name, "r")))
            .unwrap()
            .section(
                &|_: &str| Some(&r),
                &BTreeMap::<&str, bool>::new(),
                &Default::default(),
                None,
            )
            .unwrap();
        raw.tracing = Some(crate::RawListenerTracing::default());
        raw.tracing_provider = Some(crate::RawTracing {
            otlp: crate::RawOtlp {
                endpoint: endpoint.into(),
                protocol: None,
                authority: None,
                headers: Default::default(),
                timeout: None,
                tls: None,
            },
            service_name: None,
            resource_attributes: Default::default(),
            random_sampling: None,
            force_trace_header: None,
            max_queued_spans: None,
            max_export_batch: None,
        });
        raw
    };
    let same = compose(
        &config.origin,
        vec![
            with_collector("a", "http://127.0.0.1:4317"),
            with_collector("b", "http://127.0.0.1:4317"),
        ],
        vec![],
    )
    .unwrap();
    assert_eq!(
        same.tracing.unwrap().endpoint.to_string(),
        "http://127.0.0.1:4317/"
    );
    let error = compose(
        &config.origin,
        vec![
            with_collector("a", "http://127.0.0.1:4317"),
            with_collector("b", "http://127.0.0.2:4317"),
        ],
        vec![],
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.starts_with("listener `b`.tracing: its tracing provider is not the process's"),
        "{error}"
    );
}

/// A direct response's `body_format` (Envoy Gateway's inline responses): plain text is the
/// body; one with command operators, or JSON, is refused by name.
#[test]
fn a_plain_body_format_is_the_direct_responses_body() {
    use envoy_types::pb::envoy::config::core::v3::{
        DataSource, SubstitutionFormatString, data_source, substitution_format_string,
    };
    let with_format = |text: &[u8]| {
        let mut config = resources::route_config("r", vec![resources::direct("/", 502)]);
        let Some(route::Action::DirectResponse(direct)) =
            &mut config.virtual_hosts[0].routes[0].action
        else {
            panic!("a direct response");
        };
        direct.body_format = Some(SubstitutionFormatString {
            format: Some(substitution_format_string::Format::TextFormatSource(
                DataSource {
                    specifier: Some(data_source::Specifier::InlineBytes(text.to_vec())),
                    ..Default::default()
                },
            )),
            ..Default::default()
        });
        XdsRoutes::decode(&pack(&config))
    };
    let body_of = |text: &[u8]| {
        let routes = with_format(text).unwrap();
        let hosts = routes.section(&BTreeMap::<&str, bool>::new(), &[], &[], None);
        let direct = hosts[0].routes[0].direct_response.clone().unwrap();
        (direct.status, direct.body)
    };
    assert_eq!(
        body_of(b"{\"error\": \"Internal Server Error\"}"),
        (
            502,
            bytes::Bytes::from_static(b"{\"error\": \"Internal Server Error\"}")
        )
    );
    // Not text (an image): the bytes as given.
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    assert_eq!(body_of(png), (502, bytes::Bytes::from_static(png)));
    let refused = with_format(b"%REQ(:path)%").unwrap_err().to_string();
    assert!(
        refused.contains("body_format") && refused.contains("command operators"),
        "{refused}"
    );
}

/// Virtual clusters (request classes for statistics only) are taken, changing no route.
#[test]
fn virtual_clusters_are_taken() {
    use envoy_types::pb::envoy::config::route::v3::VirtualCluster;
    let mut config = resources::route_config("r", vec![resources::forward("/", "backend")]);
    config.virtual_hosts[0].virtual_clusters = vec![VirtualCluster {
        name: "*".into(),
        ..Default::default()
    }];
    let with = XdsRoutes::decode(&pack(&config)).unwrap();
    config.virtual_hosts[0].virtual_clusters.clear();
    let without = XdsRoutes::decode(&pack(&config)).unwrap();
    let section = |r: &XdsRoutes| {
        format!(
            "{:?}",
            r.section(&BTreeMap::<&str, bool>::new(), &[], &[], None)
        )
    };
    assert_eq!(section(&with), section(&without));
}

/// A `load_balancing_policy` of one typed extension, as Envoy Gateway writes it.
fn with_policy(c: &mut Cluster, type_name: &str, value: Vec<u8>) {
    use envoy_types::pb::envoy::config::cluster::v3::{LoadBalancingPolicy, load_balancing_policy};
    use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
    c.load_balancing_policy = Some(LoadBalancingPolicy {
        policies: vec![load_balancing_policy::Policy {
            typed_extension_config: Some(TypedExtensionConfig {
                name: "policy".into(),
                typed_config: Some(Any {
                    type_url: format!(
                        "type.googleapis.com/envoy.extensions.load_balancing_policies.{type_name}"
                    ),
                    value,
                }),
            }),
        }],
    });
}

#[test]
fn load_balancing_policy_extensions_are_honoured_or_refused_by_name() {
    use envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::{
        LocalityLbConfig, SlowStartConfig, locality_lb_config,
    };
    use envoy_types::pb::envoy::extensions::load_balancing_policies::least_request::v3::LeastRequest;
    use envoy_types::pb::envoy::r#type::v3::Percent;
    let weighted = LocalityLbConfig {
        locality_config_specifier: Some(
            locality_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                Default::default(),
            ),
        ),
    };
    let mut c = eds_cluster("web");
    c.lb_policy = cluster::LbPolicy::Random as i32;
    c.ignore_health_on_host_removal = true;
    c.common_lb_config = Some(cluster::CommonLbConfig {
        healthy_panic_threshold: Some(Percent { value: 66.0 }),
        ..Default::default()
    });
    let lr = LeastRequest {
        choice_count: Some(UInt32Value { value: 3 }),
        locality_lb_config: Some(weighted),
        ..Default::default()
    };
    with_policy(&mut c, "least_request.v3.LeastRequest", lr.encode_to_vec());
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    // The extension wins over the enum, as in Envoy.
    assert_eq!(raw.lb_policy.as_deref(), Some("least_request"));
    assert_eq!(raw.least_request.unwrap().choice_count, Some(3));
    assert_eq!(raw.locality_weighted, Some(true));
    assert_eq!(raw.healthy_panic_threshold, Some(66.0));

    let refused = |c: &Cluster| XdsCluster::decode(&pack(c)).unwrap_err().to_string();
    // Slow start as Envoy Gateway writes it: a window, Envoy's other defaults.
    let slow = LeastRequest {
        slow_start_config: Some(SlowStartConfig {
            slow_start_window: Some(PbDuration {
                seconds: 5,
                nanos: 0,
            }),
            aggression: Some(envoy_types::pb::envoy::config::core::v3::RuntimeDouble {
                default_value: 2.0,
                runtime_key: String::new(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    with_policy(
        &mut c,
        "least_request.v3.LeastRequest",
        slow.encode_to_vec(),
    );
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let ramp = raw.slow_start.unwrap();
    assert_eq!(ramp.window, Duration::from_secs(5));
    assert_eq!(ramp.aggression, Some(2.0));
    assert_eq!(ramp.min_weight_percent, None);
    // Zone-aware routing as Envoy Gateway writes it (`force_local_zone` without a size: 1).
    use locality_lb_config::zone_aware_lb_config::ForceLocalZone;
    let zone = LeastRequest {
        locality_lb_config: Some(LocalityLbConfig {
            locality_config_specifier: Some(
                locality_lb_config::LocalityConfigSpecifier::ZoneAwareLbConfig(
                    locality_lb_config::ZoneAwareLbConfig {
                        routing_enabled: Some(Percent { value: 90.0 }),
                        min_cluster_size: Some(envoy_types::pb::google::protobuf::UInt64Value {
                            value: 1,
                        }),
                        force_local_zone: Some(ForceLocalZone { min_size: None }),
                        ..Default::default()
                    },
                ),
            ),
        }),
        ..Default::default()
    };
    with_policy(
        &mut c,
        "least_request.v3.LeastRequest",
        zone.encode_to_vec(),
    );
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let zone = raw.zone_aware.unwrap();
    assert_eq!(zone.routing_enabled, Some(90.0));
    assert_eq!(zone.min_cluster_size, Some(1));
    assert_eq!(zone.force_local_zone_min_size, Some(1));
    assert_eq!(zone.locality_basis.as_deref(), Some("healthy_hosts_num"));
    assert_eq!(raw.locality_weighted, Some(false));
    with_policy(
        &mut c,
        "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin",
        Vec::new(),
    );
    assert!(
        refused(&c).contains("client_side_weighted_round_robin"),
        "{}",
        refused(&c)
    );
}

#[test]
fn the_dns_cluster_extension_and_logical_dns_are_taken_with_their_own_settings() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::CustomClusterType;
    use envoy_types::pb::envoy::extensions::clusters::common::dns::v3::DnsLookupFamily;
    use envoy_types::pb::envoy::extensions::clusters::dns::v3::DnsCluster;
    let dns = DnsCluster {
        dns_refresh_rate: Some(PbDuration {
            seconds: 30,
            nanos: 0,
        }),
        respect_dns_ttl: true,
        dns_lookup_family: DnsLookupFamily::All as i32,
        ..Default::default()
    };
    let mut c = Cluster {
        name: "collector".into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::ClusterType(
            CustomClusterType {
                name: "envoy.cluster.dns".into(),
                typed_config: Some(pack(&dns)),
            },
        )),
        load_assignment: Some(assignment(
            "collector",
            vec![lb_endpoint(4317, HealthStatus::Healthy, None)],
        )),
        ..Default::default()
    };
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.dns_refresh_rate, Some(Duration::from_secs(30)));
    assert_eq!(raw.respect_dns_ttl, Some(true));
    assert_eq!(raw.dns_lookup_family.as_deref(), Some("all"));
    assert_eq!(raw.endpoints.len(), 1);

    let logical = DnsCluster {
        all_addresses_in_single_endpoint: true,
        ..Default::default()
    };
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::ClusterType(
        CustomClusterType {
            name: "envoy.cluster.dns".into(),
            typed_config: Some(pack(&logical)),
        },
    ));
    // LOGICAL_DNS: one endpoint, a name (an address is refused).
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("a single lb_endpoint, a name"), "{error}");
    let mut named = lb_endpoint(4317, HealthStatus::Healthy, None);
    if let Some(lb_endpoint::HostIdentifier::Endpoint(endpoint)) = &mut named.host_identifier {
        endpoint.address = Some(envoy_types::pb::envoy::config::core::v3::Address {
            address: Some(
                envoy_types::pb::envoy::config::core::v3::address::Address::SocketAddress(
                    envoy_types::pb::envoy::config::core::v3::SocketAddress {
                        address: "collector.internal".into(),
                        port_specifier: Some(
                            envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(4317),
                        ),
                        ..Default::default()
                    },
                ),
            ),
        });
    }
    c.load_assignment = Some(assignment("collector", vec![named.clone()]));
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.logical_dns, Some(true));
    // The enum's LOGICAL_DNS is the same, and two endpoints are refused as Envoy does.
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
        cluster::DiscoveryType::LogicalDns as i32,
    ));
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.logical_dns, Some(true));
    c.load_assignment = Some(assignment("collector", vec![named.clone(), named]));
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("a single lb_endpoint"), "{error}");
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::ClusterType(
        CustomClusterType {
            name: "envoy.clusters.dynamic_forward_proxy".into(),
            typed_config: None,
        },
    ));
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(
        error.contains("envoy.clusters.dynamic_forward_proxy"),
        "{error}"
    );
}

#[test]
fn upstream_http2_settings_are_taken_and_the_others_refused_by_name() {
    use envoy_types::pb::envoy::config::core::v3::Http2ProtocolOptions;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions as Upstream;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    };
    let with = |h2: Http2ProtocolOptions| {
        let mut c = eds_cluster("web");
        let options = Upstream {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(h2)),
                },
            )),
            ..Default::default()
        };
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            pack(&options),
        );
        XdsCluster::decode(&pack(&c))
    };
    // Envoy Gateway's HTTP/2 backends.
    let raw = with(Http2ProtocolOptions {
        initial_stream_window_size: Some(UInt32Value { value: 65536 }),
        initial_connection_window_size: Some(UInt32Value { value: 1_048_576 }),
        ..Default::default()
    })
    .unwrap()
    .section(None, &Default::default())
    .expect("no secrets named");
    assert_eq!(raw.protocol.as_deref(), Some("http2"));
    assert_eq!(raw.initial_stream_window_size, Some(65536));
    assert_eq!(raw.initial_connection_window_size, Some(1_048_576));
    // Envoy Gateway's backend traffic settings: streams per connection, PINGs.
    use envoy_types::pb::envoy::config::core::v3::KeepaliveSettings;
    use envoy_types::pb::envoy::r#type::v3::Percent;
    use envoy_types::pb::google::protobuf::BoolValue;
    let keepalive = KeepaliveSettings {
        interval: Some(PbDuration {
            seconds: 60,
            nanos: 0,
        }),
        timeout: Some(PbDuration {
            seconds: 10,
            nanos: 0,
        }),
        interval_jitter: Some(Percent { value: 20.0 }),
        connection_idle_interval: Some(PbDuration {
            seconds: 30,
            nanos: 0,
        }),
    };
    let raw = with(Http2ProtocolOptions {
        max_concurrent_streams: Some(UInt32Value { value: 200 }),
        connection_keepalive: Some(keepalive),
        override_stream_error_on_invalid_http_message: Some(BoolValue { value: true }),
        ..Default::default()
    })
    .unwrap()
    .section(None, &Default::default())
    .expect("no secrets named");
    assert_eq!(raw.max_concurrent_streams, Some(200));
    let ping = raw.http2_keepalive.expect("the keep-alive is read");
    assert_eq!(ping.interval, Some(Duration::from_secs(60)));
    assert_eq!(ping.timeout, Some(Duration::from_secs(10)));
    assert_eq!(ping.interval_jitter, Some(20.0));
    assert_eq!(ping.connection_idle_interval, Some(Duration::from_secs(30)));
    // A keep-alive without its timeout is refused by name.
    let error = with(Http2ProtocolOptions {
        connection_keepalive: Some(KeepaliveSettings {
            timeout: None,
            ..keepalive
        }),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(error.contains("connection_keepalive.timeout"), "{error}");
    assert_eq!(raw.stream_error_on_invalid_http_message, Some(true));
    // `false`, Envoy's default, closes the connection on a malformed message: the file's
    // default too.
    let raw = with(Http2ProtocolOptions {
        override_stream_error_on_invalid_http_message: Some(BoolValue { value: false }),
        ..Default::default()
    })
    .unwrap()
    .section(None, &Default::default())
    .expect("no secrets named");
    assert_eq!(raw.stream_error_on_invalid_http_message, None);
    let error = with(Http2ProtocolOptions {
        hpack_table_size: Some(UInt32Value { value: 100 }),
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(error.contains("hpack_table_size"), "{error}");

    // Envoy Gateway's TLS backends: `auto_config`, HTTP/2 or HTTP/1.1 by ALPN.
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::AutoHttpConfig;
    let mut c = eds_cluster("web");
    let options = Upstream {
        upstream_protocol_options: Some(UpstreamProtocolOptions::AutoConfig(AutoHttpConfig {
            http_protocol_options: Some(Default::default()),
            http2_protocol_options: Some(Http2ProtocolOptions {
                initial_stream_window_size: Some(UInt32Value { value: 65536 }),
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..Default::default()
    };
    c.typed_extension_protocol_options.insert(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
        pack(&options),
    );
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.protocol.as_deref(), Some("auto"));
    assert_eq!(raw.initial_stream_window_size, Some(65536));

    // Envoy Gateway's backends that follow the client's protocol.
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::UseDownstreamHttpConfig;
    let mut c = eds_cluster("web");
    let options = Upstream {
        upstream_protocol_options: Some(UpstreamProtocolOptions::UseDownstreamProtocolConfig(
            UseDownstreamHttpConfig {
                http_protocol_options: Some(Default::default()),
                http2_protocol_options: Some(Http2ProtocolOptions {
                    initial_connection_window_size: Some(UInt32Value { value: 1_048_576 }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    c.typed_extension_protocol_options.insert(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
        pack(&options),
    );
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.protocol.as_deref(), Some("downstream"));
    assert_eq!(raw.initial_connection_window_size, Some(1_048_576));
}

/// Envoy Gateway's clusters for authorization services carry a cluster-level `hash_policy`:
/// kept where the balancer hashes, inert (as in Envoy) where it does not. The other
/// cluster-level policies are refused by their names.
#[test]
fn cluster_level_http_policies_are_taken_or_refused_by_their_names() {
    use envoy_types::pb::envoy::config::route::v3::RetryPolicy;
    use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions as Upstream;
    let with = |lb: cluster::LbPolicy, options: Upstream| {
        let mut c = eds_cluster("web");
        c.lb_policy = lb as i32;
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            pack(&options),
        );
        XdsCluster::decode(&pack(&c)).map(|c| c.section(None, &Default::default()))
    };
    let source_ip = Upstream {
        hash_policy: vec![HashPolicy {
            policy_specifier: Some(hash_policy::PolicySpecifier::ConnectionProperties(
                hash_policy::ConnectionProperties { source_ip: true },
            )),
            terminal: false,
        }],
        ..Default::default()
    };
    let raw = with(cluster::LbPolicy::RingHash, source_ip.clone())
        .unwrap()
        .unwrap();
    assert_eq!(raw.hash_policy.len(), 1);
    assert_eq!(raw.hash_policy[0].source_ip, Some(true));
    let raw = with(cluster::LbPolicy::LeastRequest, source_ip)
        .unwrap()
        .unwrap();
    assert!(raw.hash_policy.is_empty(), "no hashing balancer reads it");
    // Not read there, not checked there (Envoy takes a filter_state rule it never reads).
    let filter_state = Upstream {
        hash_policy: vec![HashPolicy {
            policy_specifier: Some(hash_policy::PolicySpecifier::FilterState(
                hash_policy::FilterState { key: "k".into() },
            )),
            terminal: false,
        }],
        ..Default::default()
    };
    assert!(with(cluster::LbPolicy::LeastRequest, filter_state.clone()).is_ok());
    let error = with(cluster::LbPolicy::RingHash, filter_state)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("filter_state"), "{error}");

    let retries = Upstream {
        retry_policy: Some(RetryPolicy::default()),
        ..Default::default()
    };
    let error = with(cluster::LbPolicy::RoundRobin, retries)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("typed_extension_protocol_options: not supported: retry_policy"),
        "{error}"
    );
}

#[test]
fn upstream_connection_times_and_keepalive_are_taken_as_envoy_gateway_writes_them() {
    use envoy_types::pb::envoy::config::cluster::v3::UpstreamConnectionOptions;
    use envoy_types::pb::envoy::config::core::v3::{HttpProtocolOptions, TcpKeepalive};
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions as Upstream;
    let seconds = |s| PbDuration {
        seconds: s,
        nanos: 0,
    };
    let mut c = eds_cluster("web");
    let options = Upstream {
        common_http_protocol_options: Some(HttpProtocolOptions {
            idle_timeout: Some(seconds(16)),
            max_connection_duration: Some(seconds(17)),
            ..Default::default()
        }),
        ..Default::default()
    };
    c.typed_extension_protocol_options.insert(
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
        pack(&options),
    );
    c.upstream_connection_options = Some(UpstreamConnectionOptions {
        tcp_keepalive: Some(TcpKeepalive {
            keepalive_probes: Some(UInt32Value { value: 3 }),
            keepalive_time: Some(UInt32Value { value: 1200 }),
            keepalive_interval: Some(UInt32Value { value: 60 }),
        }),
        ..Default::default()
    });
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.idle_timeout, Some(Duration::from_secs(16)));
    assert_eq!(raw.max_connection_duration, Some(Duration::from_secs(17)));
    let keepalive = raw.tcp_keepalive.unwrap();
    assert_eq!(keepalive.probes, Some(3));
    assert_eq!(keepalive.time, Some(Duration::from_secs(1200)));
    assert_eq!(keepalive.interval, Some(Duration::from_secs(60)));

    c.upstream_connection_options = Some(UpstreamConnectionOptions {
        happy_eyeballs_config: Some(Default::default()),
        ..Default::default()
    });
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("happy_eyeballs_config"), "{error}");
}

#[test]
fn upstream_http1_settings_of_the_server_side_or_done_anyway_are_taken() {
    use envoy_types::pb::envoy::config::core::v3::Http1ProtocolOptions;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions as Upstream;
    use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
    };
    let with = |h1: Http1ProtocolOptions| {
        let mut c = eds_cluster("web");
        let options = Upstream {
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(h1)),
                },
            )),
            ..Default::default()
        };
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".into(),
            pack(&options),
        );
        XdsCluster::decode(&pack(&c))
    };
    // Envoy Gateway's `http1-trailers` and `http10` backends.
    let raw = with(Http1ProtocolOptions {
        enable_trailers: true,
        accept_http_10: true,
        default_host_for_http_10: "foo.com".into(),
        ..Default::default()
    })
    .unwrap()
    .section(None, &Default::default())
    .expect("no secrets named");
    assert_eq!(raw.protocol.as_deref(), Some("http1"));
    let error = with(Http1ProtocolOptions {
        allow_chunked_length: true,
        ..Default::default()
    })
    .unwrap_err()
    .to_string();
    assert!(error.contains("http_protocol_options"), "{error}");
}

#[test]
fn track_cluster_stats_keeps_per_endpoint_stats_and_refuses_the_size_histograms() {
    use envoy_types::pb::envoy::config::cluster::v3::TrackClusterStats;
    let mut c = eds_cluster("web");
    c.track_cluster_stats = Some(TrackClusterStats {
        per_endpoint_stats: true,
        ..Default::default()
    });
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.per_endpoint_stats, Some(true));
    c.track_cluster_stats = Some(TrackClusterStats {
        request_response_sizes: true,
        ..Default::default()
    });
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("request_response_sizes"), "{error}");
}

#[test]
fn health_checks_as_envoy_gateway_writes_them() {
    use envoy_types::pb::envoy::config::core::v3::{HealthCheck, health_check};
    use envoy_types::pb::envoy::r#type::v3::Int64Range;
    let payload = |hex: &str| health_check::Payload {
        payload: Some(health_check::payload::Payload::Text(hex.into())),
    };
    let check = |checker| HealthCheck {
        timeout: Some(PbDuration {
            seconds: 1,
            nanos: 0,
        }),
        interval: Some(PbDuration {
            seconds: 3,
            nanos: 0,
        }),
        unhealthy_threshold: Some(UInt32Value { value: 3 }),
        health_checker: Some(checker),
        ..Default::default()
    };
    let mut c = eds_cluster("web");
    c.health_checks = vec![check(health_check::HealthChecker::HttpHealthCheck(
        health_check::HttpHealthCheck {
            path: "/healthz".into(),
            host: "*".into(),
            method: envoy_types::pb::envoy::config::core::v3::RequestMethod::Post as i32,
            send: Some(payload("70696e67")),
            receive: vec![health_check::Payload {
                payload: Some(health_check::payload::Payload::Binary(b"pong".to_vec())),
            }],
            expected_statuses: vec![Int64Range {
                start: 200,
                end: 202,
            }],
            retriable_statuses: vec![Int64Range {
                start: 503,
                end: 504,
            }],
            ..Default::default()
        },
    ))];
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let config = crate::cluster::check::health_check(raw.health_check.unwrap(), "h").unwrap();
    assert_eq!(config.method, Some(http::Method::POST));
    assert_eq!(config.send.as_deref(), Some(&b"ping"[..]));
    assert_eq!(config.receive, vec![b"pong".to_vec()]);
    assert_eq!(config.expected_statuses, vec![(200, 202)]);
    assert_eq!(config.retriable_statuses, vec![(503, 504)]);
    assert_eq!(config.host.as_deref(), Some("*"));

    // Without expected statuses, Envoy's default: 200 alone.
    c.health_checks = vec![check(health_check::HealthChecker::HttpHealthCheck(
        health_check::HttpHealthCheck {
            path: "/".into(),
            ..Default::default()
        },
    ))];
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let config = crate::cluster::check::health_check(raw.health_check.unwrap(), "h").unwrap();
    assert_eq!(config.expected_statuses, vec![(200, 201)]);

    c.health_checks = vec![check(health_check::HealthChecker::TcpHealthCheck(
        health_check::TcpHealthCheck {
            send: Some(payload("70696e67")),
            receive: vec![payload("706f6e67")],
            ..Default::default()
        },
    ))];
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let config = crate::cluster::check::health_check(raw.health_check.unwrap(), "h").unwrap();
    assert!(config.tcp && config.path.is_empty());
    assert_eq!(config.receive, vec![b"pong".to_vec()]);

    // Envoy Gateway's gRPC checks of an ext_proc service, logged to a file sink.
    use envoy_types::pb::envoy::extensions::health_check::event_sinks::file::v3::HealthCheckEventFileSink;
    let mut grpc = check(health_check::HealthChecker::GrpcHealthCheck(
        health_check::GrpcHealthCheck {
            service_name: "envoy.service.ext_proc.v3.ExternalProcessor".into(),
            ..Default::default()
        },
    ));
    grpc.always_log_health_check_failures = true;
    grpc.event_logger = vec![
        envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig {
            name: "envoy.health_check.event_sinks.file".into(),
            typed_config: Some(pack(&HealthCheckEventFileSink {
                event_log_path: "/dev/stdout".into(),
            })),
        },
    ];
    grpc.unhealthy_interval = Some(PbDuration {
        seconds: 7,
        nanos: 0,
    });
    c.health_checks = vec![grpc];
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let config = crate::cluster::check::health_check(raw.health_check.unwrap(), "h").unwrap();
    assert_eq!(
        config.grpc.unwrap().service_name,
        "envoy.service.ext_proc.v3.ExternalProcessor"
    );
    assert_eq!(config.event_log_path.as_deref(), Some("/dev/stdout"));
    assert!(config.always_log_health_check_failures);
    assert_eq!(config.unhealthy_interval, Duration::from_secs(7));
    assert_eq!(config.unhealthy_edge_interval, Duration::from_secs(7));
    // Envoy's default pace until the cluster has had traffic: 60 s, passing hosts too.
    assert_eq!(config.no_traffic_interval, Duration::from_secs(60));
    assert_eq!(config.no_traffic_healthy_interval, Duration::from_secs(60));
    let mut given = c.health_checks[0].clone();
    given.no_traffic_interval = Some(PbDuration {
        seconds: 3,
        nanos: 0,
    });
    given.no_traffic_healthy_interval = Some(PbDuration {
        seconds: 9,
        nanos: 0,
    });
    c.health_checks = vec![given];
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let config = crate::cluster::check::health_check(raw.health_check.unwrap(), "h").unwrap();
    assert_eq!(config.no_traffic_interval, Duration::from_secs(3));
    assert_eq!(config.no_traffic_healthy_interval, Duration::from_secs(9));

    let mut custom = check(health_check::HealthChecker::CustomHealthCheck(
        Default::default(),
    ));
    custom.no_traffic_interval = None;
    c.health_checks = vec![custom];
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("health_checker"), "{error}");
}

#[test]
fn the_extension_form_refuses_common_locality_settings_as_envoy_does() {
    use envoy_types::pb::envoy::extensions::load_balancing_policies::round_robin::v3::RoundRobin;
    let mut c = eds_cluster("web");
    with_policy(
        &mut c,
        "round_robin.v3.RoundRobin",
        RoundRobin::default().encode_to_vec(),
    );
    c.common_lb_config = Some(cluster::CommonLbConfig {
        locality_config_specifier: Some(
            cluster::common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                Default::default(),
            ),
        ),
        ..Default::default()
    });
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("common_lb_config"), "{error}");
    // The panic threshold, rounded to a whole percent as Envoy reads it.
    c.common_lb_config = Some(cluster::CommonLbConfig {
        healthy_panic_threshold: Some(envoy_types::pb::envoy::r#type::v3::Percent { value: 0.4 }),
        ..Default::default()
    });
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.healthy_panic_threshold, Some(0.0));
}

#[test]
fn endpoint_hostnames_and_check_targets_and_auto_host_rewrite_are_taken() {
    use envoy_types::pb::envoy::config::endpoint::v3::endpoint::HealthCheckConfig;
    let mut host = lb_endpoint(9000, HealthStatus::Healthy, None);
    let Some(lb_endpoint::HostIdentifier::Endpoint(endpoint)) = &mut host.host_identifier else {
        panic!("an endpoint");
    };
    endpoint.hostname = "backend.example.com".into();
    endpoint.health_check_config = Some(HealthCheckConfig {
        hostname: "ready.example.com".into(),
        port_value: 9100,
        ..Default::default()
    });
    let endpoints = XdsEndpoints::decode(&pack(&assignment("web", vec![host.clone()]))).unwrap();
    let raw = endpoints.raw();
    let [RawEndpoint::Weighted(raw)] = raw.as_slice() else {
        panic!("one endpoint");
    };
    assert_eq!(raw.hostname.as_deref(), Some("backend.example.com"));
    let check = raw.health_check.clone().unwrap();
    assert_eq!(check.hostname.as_deref(), Some("ready.example.com"));
    assert_eq!(check.port, Some(9100));
    // Another address to check is refused by name.
    let Some(lb_endpoint::HostIdentifier::Endpoint(endpoint)) = &mut host.host_identifier else {
        panic!("an endpoint");
    };
    endpoint.health_check_config = Some(HealthCheckConfig {
        disable_active_health_check: true,
        ..Default::default()
    });
    let error = XdsEndpoints::decode(&pack(&assignment("web", vec![host])))
        .unwrap_err()
        .to_string();
    assert!(error.contains("disable_active_health_check"), "{error}");

    let mut auto = routes("r", "web");
    let Some(route::Action::Route(action)) = &mut auto.virtual_hosts[0].routes[0].action else {
        panic!("a forwarding route");
    };
    action.host_rewrite_specifier = Some(route_action::HostRewriteSpecifier::AutoHostRewrite(
        envoy_types::pb::google::protobuf::BoolValue { value: true },
    ));
    let auto = XdsRoutes::decode(&pack(&auto)).unwrap();
    let ready: BTreeMap<&str, bool> = [("web", true)].into_iter().collect();
    assert_eq!(
        auto.section(&ready, &[], &[], None)[0].routes[0].auto_host_rewrite,
        Some(true)
    );
}

#[test]
fn per_host_thresholds_limit_connections_per_host() {
    use envoy_types::pb::envoy::config::cluster::v3::{CircuitBreakers, circuit_breakers};
    let mut c = eds_cluster("web");
    c.circuit_breakers = Some(CircuitBreakers {
        per_host_thresholds: vec![circuit_breakers::Thresholds {
            max_connections: Some(UInt32Value { value: 1 }),
            ..Default::default()
        }],
        ..Default::default()
    });
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(
        raw.circuit_breakers.unwrap().max_connections_per_host,
        Some(1)
    );
    c.circuit_breakers = Some(CircuitBreakers {
        per_host_thresholds: vec![circuit_breakers::Thresholds {
            max_requests: Some(UInt32Value { value: 1 }),
            ..Default::default()
        }],
        ..Default::default()
    });
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("per_host_thresholds[0]"), "{error}");
}

/// SDS: a listener and a cluster naming secrets warm until the secrets arrive, then serve
/// with their PEM; a listener's several certificates are picked by the names of their leaves.
#[test]
fn listeners_and_clusters_wait_for_their_secrets_and_take_their_pem() {
    use envoy_types::pb::envoy::config::core::v3::{
        AggregatedConfigSource, ConfigSource, TransportSocket, config_source, data_source,
        transport_socket,
    };
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig,
        Secret, TlsCertificate, UpstreamTlsContext, common_tls_context, downstream_tls_context,
        secret,
    };
    use envoy_types::pb::google::protobuf::BoolValue;
    let sds = |name: &str| SdsSecretConfig {
        name: name.into(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                AggregatedConfigSource {},
            )),
            ..Default::default()
        }),
    };
    let socket = |any: Any| TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any)),
    };
    let mut l = listener("edge", "r");
    l.filter_chains[0].transport_socket = Some(socket(pack(&DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![sds("api"), sds("www"), sds("api-ec")],
            validation_context_type: Some(
                common_tls_context::ValidationContextType::ValidationContextSdsSecretConfig(sds(
                    "ca",
                )),
            ),
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue { value: true }),
        session_ticket_keys_type: Some(
            downstream_tls_context::SessionTicketKeysType::DisableStatelessSessionResumption(true),
        ),
        disable_stateful_session_resumption: true,
        ..Default::default()
    })));
    let mut c = eds_cluster("web");
    c.transport_socket = Some(socket(pack(&UpstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: vec![sds("client")],
            validation_context_type: Some(
                common_tls_context::ValidationContextType::CombinedValidationContext(
                    common_tls_context::CombinedCertificateValidationContext {
                        default_validation_context: Some(Default::default()),
                        validation_context_sds_secret_config: Some(sds("ca")),
                        ..Default::default()
                    },
                ),
            ),
            ..Default::default()
        }),
        sni: "web.internal".into(),
        ..Default::default()
    })));
    let mut resources = Resources::default();
    resources
        .listeners
        .insert("edge".into(), held(XdsListener::decode(&pack(&l)).unwrap()));
    resources.routes.insert("r".into(), held_routes("r", "web"));
    resources
        .clusters
        .insert("web".into(), held(XdsCluster::decode(&pack(&c)).unwrap()));
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8001));
    assert_eq!(
        resources.subscriptions().secrets.iter().collect::<Vec<_>>(),
        ["api", "api-ec", "ca", "client", "www"]
    );
    let Sections {
        listeners,
        clusters,
        warming,
        ..
    } = resources.sections().unwrap();
    assert!(listeners.is_empty() && clusters.is_empty());
    assert_eq!(
        (warming.listeners, warming.clusters),
        (vec!["edge".to_owned()], vec!["web".to_owned()])
    );

    let inline = |text: String| {
        Some(envoy_types::pb::envoy::config::core::v3::DataSource {
            specifier: Some(data_source::Specifier::InlineString(text)),
            ..Default::default()
        })
    };
    let mut pem = BTreeMap::new();
    for (name, hosts) in [
        ("api", vec!["api.example.com"]),
        (
            "www",
            vec!["www.example.com", "*.www.example.com", "api.example.com"],
        ),
        ("api-ec", vec!["api.example.com"]),
        ("client", vec!["proxy"]),
    ] {
        let pair = rcgen::generate_simple_self_signed(
            hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        pem.insert(name, pair.cert.pem());
        let secret = Secret {
            name: name.into(),
            r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: inline(pair.cert.pem()),
                private_key: inline(pair.signing_key.serialize_pem()),
                ..Default::default()
            })),
        };
        resources.secrets.insert(
            name.into(),
            held(XdsSecret::decode(&pack(&secret)).unwrap()),
        );
    }
    let ca = Secret {
        name: "ca".into(),
        r#type: Some(secret::Type::ValidationContext(
            CertificateValidationContext {
                trusted_ca: inline(pem["client"].clone()),
                ..Default::default()
            },
        )),
    };
    resources
        .secrets
        .insert("ca".into(), held(XdsSecret::decode(&pack(&ca)).unwrap()));
    let Sections {
        listeners,
        clusters,
        warming,
        ..
    } = resources.sections().unwrap();
    assert_eq!(warming, Warming::default());
    let config = compose(
        &crate::Config::from_yaml(
            "node: { id: n }\ndynamic_resources: { ads: { address: \"127.0.0.1:1\" } }\n",
        )
        .unwrap()
        .origin,
        listeners,
        clusters,
    )
    .unwrap();
    let tls = config.listeners[0].tls.as_ref().unwrap();
    let names: Vec<Vec<String>> = (tls.certificates.iter())
        .map(|c| {
            c.server_names
                .iter()
                .map(|n| {
                    serde_json::to_value(n)
                        .unwrap()
                        .as_str()
                        .unwrap()
                        .to_owned()
                })
                .collect()
        })
        .collect();
    // A name two certificates have is the first's; one left with no name is not served.
    assert_eq!(
        names,
        [
            vec!["api.example.com"],
            vec!["www.example.com", "*.www.example.com"]
        ]
    );
    assert_eq!(tls.default_certificate(), 0, "the first, as Envoy's");
    assert!(
        matches!(&tls.certificates[1].cert_chain, crate::tls::PemSource::Inline(p) if **p == *pem["www"])
    );
    assert!(!tls.session_tickets && tls.session_cache_size == 0);
    assert!(tls.client_certificate.as_ref().unwrap().required);
    let upstream = config.clusters[0].tls.as_ref().unwrap();
    assert!(upstream.ca.is_some() && upstream.client_certificate.is_some());
    assert_eq!(upstream.server_name.as_deref(), Some("web.internal"));
}

/// A cluster updated to name a secret that has not arrived keeps serving as it was, and its
/// secret is asked for.
#[test]
fn a_cluster_waiting_for_a_new_secret_keeps_its_previous_version() {
    use envoy_types::pb::envoy::config::core::v3::{
        AggregatedConfigSource, ConfigSource, TransportSocket, config_source, transport_socket,
    };
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CommonTlsContext, SdsSecretConfig, UpstreamTlsContext, common_tls_context,
    };
    let mut resources = Resources::default();
    resources.clusters.insert(
        "web".into(),
        held(XdsCluster::decode(&pack(&eds_cluster("web"))).unwrap()),
    );
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8001));
    let first = resources.sections().unwrap();
    assert_eq!(first.clusters.len(), 1);
    assert!(first.clusters[0].tls.is_none());

    let mut c = eds_cluster("web");
    c.transport_socket = Some(TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(
            &UpstreamTlsContext {
                common_tls_context: Some(CommonTlsContext {
                    validation_context_type: Some(
                        common_tls_context::ValidationContextType::ValidationContextSdsSecretConfig(
                            SdsSecretConfig {
                                name: "ca".into(),
                                sds_config: Some(ConfigSource {
                                    config_source_specifier: Some(
                                        config_source::ConfigSourceSpecifier::Ads(
                                            AggregatedConfigSource {},
                                        ),
                                    ),
                                    ..Default::default()
                                }),
                            },
                        ),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ))),
    });
    let mut updated = XdsCluster::decode(&pack(&c)).unwrap();
    updated.name = "web".into();
    resources
        .clusters
        .insert("web".into(), Held::new(updated, "2".into(), b"v2"));
    let Sections {
        clusters, warming, ..
    } = resources.sections().unwrap();
    assert_eq!(warming.clusters, ["web"]);
    assert_eq!(clusters.len(), 1, "the previous version serves");
    assert!(clusters[0].tls.is_none());
    assert!(resources.subscriptions().secrets.contains("ca"));
    assert!(resources.subscriptions().endpoints.contains("web"));
}

/// The socket options control planes set for TCP keep-alive (Envoy Gateway's) become the
/// listener's `tcp_keepalive`; another option is refused by name.
#[test]
fn keepalive_socket_options_become_the_listeners_tcp_keepalive() {
    use envoy_types::pb::envoy::config::core::v3::{SocketOption, socket_option};
    let option = |level: i64, name: i64, value: i64| SocketOption {
        level,
        name,
        value: Some(socket_option::Value::IntValue(value)),
        ..Default::default()
    };
    let r = XdsRoutes::decode(&pack(&routes("r", "web"))).unwrap();
    let section = |options: Vec<SocketOption>| {
        let mut l = listener("edge", "r");
        l.socket_options = options;
        XdsListener::decode(&pack(&l)).map(|l| {
            l.section(
                &|_: &str| Some(&r),
                &BTreeMap::<&str, bool>::new(),
                &Default::default(),
                None,
            )
            .unwrap()
            .tcp_keepalive
        })
    };
    let keepalive = section(vec![option(1, 9, 1), option(6, 6, 7), option(6, 4, 50)])
        .unwrap()
        .unwrap();
    assert_eq!(
        (keepalive.probes, keepalive.time, keepalive.interval),
        (Some(7), Some(Duration::from_secs(50)), None)
    );
    assert!(section(vec![option(1, 9, 1)]).unwrap().is_some());
    assert!(
        section(vec![option(6, 4, 50)]).unwrap().is_none(),
        "not turned on"
    );
    let error = section(vec![option(1, 7, 65536)]).unwrap_err().to_string();
    assert!(error.contains("socket option level 1 name 7"), "{error}");
}

/// `connection_balance_config.exact_balance` is the file's `exact` balancing; a listener
/// without SO_REUSEPORT is refused by name.
#[test]
fn exact_balance_is_the_files_exact_and_reuse_port_is_not_turned_off() {
    use envoy_types::pb::envoy::config::listener::v3::listener::{
        ConnectionBalanceConfig, connection_balance_config,
    };
    use envoy_types::pb::google::protobuf::BoolValue;
    let r = XdsRoutes::decode(&pack(&routes("r", "web"))).unwrap();
    let mut l = listener("edge", "r");
    l.connection_balance_config = Some(ConnectionBalanceConfig {
        balance_type: Some(connection_balance_config::BalanceType::ExactBalance(
            Default::default(),
        )),
    });
    l.enable_reuse_port = Some(BoolValue { value: true });
    let raw = XdsListener::decode(&pack(&l))
        .unwrap()
        .section(
            &|_: &str| Some(&r),
            &BTreeMap::<&str, bool>::new(),
            &Default::default(),
            None,
        )
        .unwrap();
    assert_eq!(raw.connection_balance.as_deref(), Some("exact"));
    l.enable_reuse_port = Some(BoolValue { value: false });
    let error = XdsListener::decode(&pack(&l)).unwrap_err().to_string();
    assert!(error.contains("enable_reuse_port"), "{error}");
}

/// Several filter chains picked by port and source, each with its own RDS routes: the listener waits for
/// all of them, and becomes `chains` without a default chain.
#[test]
fn filter_chains_become_chains_each_with_its_routes() {
    use envoy_types::pb::envoy::config::listener::v3::FilterChainMatch;
    let mut l = listener("edge", "r-a");
    let mut b = l.filter_chains[0].clone();
    let hcm_with = |chain: &mut envoy_types::pb::envoy::config::listener::v3::FilterChain,
                    rds: &str| {
        let mut any = match &chain.filters[0].config_type {
            Some(
                envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any),
            ) => any.clone(),
            _ => panic!("an HCM"),
        };
        let text = String::from_utf8_lossy(&any.value).replace("r-a", rds);
        any.value = text.into_bytes();
        chain.filters[0].config_type = Some(
            envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any),
        );
    };
    hcm_with(&mut b, "r-b");
    l.filter_chains[0].filter_chain_match = Some(FilterChainMatch {
        destination_port: Some(UInt32Value { value: 8443 }),
        ..Default::default()
    });
    b.filter_chain_match = Some(FilterChainMatch {
        source_prefix_ranges: vec![envoy_types::pb::envoy::config::core::v3::CidrRange {
            address_prefix: "10.0.0.0".into(),
            prefix_len: Some(UInt32Value { value: 8 }),
        }],
        transport_protocol: "raw_buffer".into(),
        ..Default::default()
    });
    b.name = "b".into();
    l.filter_chains.push(b);
    let mut resources = Resources::default();
    resources
        .listeners
        .insert("edge".into(), held(XdsListener::decode(&pack(&l)).unwrap()));
    assert_eq!(*resources.subscriptions().routes, names(["r-a", "r-b"]));
    resources
        .routes
        .insert("r-a".into(), held_routes("r-a", "web"));
    assert_eq!(
        resources.sections().unwrap().warming.listeners,
        ["edge"],
        "r-b missing"
    );
    resources
        .routes
        .insert("r-b".into(), held_routes("r-b", "web"));
    let Sections { listeners, .. } = resources.sections().unwrap();
    let raw = &listeners[0];
    assert_eq!(raw.default_chain, Some(false));
    assert_eq!(raw.chains.len(), 2);
    assert_eq!(raw.chains[1].name, "b");
    assert_eq!(
        raw.chains[1].matcher.transport_protocol.as_deref(),
        Some("raw_buffer")
    );
    let origin = crate::Config::from_yaml(
        "node: { id: n }\ndynamic_resources: { ads: { address: \"127.0.0.1:1\" } }\nclusters:\n  - { name: web, endpoints: [127.0.0.1:9] }\n",
    )
    .unwrap()
    .origin;
    let config = compose(&origin, listeners, vec![]).unwrap();
    let edge = &config.listeners[0];
    assert!(!edge.default_chain);
    assert_eq!(edge.filter_chains[0].matcher.destination_port, Some(8443));
    assert_eq!(
        edge.filter_chains[1].matcher.source_prefix_ranges[0].to_string(),
        "10.0.0.0/8"
    );
    assert_eq!(edge.filter_chains[1].settings.name, "edge");

    // Two chains one connection could fit equally: refused when the listener comes.
    let mut twice = listener("edge", "r-a");
    let again = twice.filter_chains[0].clone();
    twice.filter_chains.push(again);
    let error = XdsListener::decode(&pack(&twice)).unwrap_err().to_string();
    assert!(
        error.contains("filter_chains[1].filter_chain_match"),
        "{error}"
    );

    // A source type other than ANY is refused by name.
    let mut local = listener("edge", "r-a");
    local.filter_chains[0].filter_chain_match = Some(FilterChainMatch {
        source_type: 1,
        ..Default::default()
    });
    let error = XdsListener::decode(&pack(&local)).unwrap_err().to_string();
    assert!(error.contains("source_type"), "{error}");

    // With the HTTP inspector, a chain picks plain text by its HTTP version.
    let mut inspected = listener("edge", "r-a");
    inspected.listener_filters.push(
        envoy_types::pb::envoy::config::listener::v3::ListenerFilter {
            name: "envoy.filters.listener.http_inspector".into(),
            ..Default::default()
        },
    );
    inspected.filter_chains[0].filter_chain_match = Some(FilterChainMatch {
        transport_protocol: "raw_buffer".into(),
        application_protocols: vec!["h2c".into()],
        ..Default::default()
    });
    let mut resources = Resources::default();
    resources.listeners.insert(
        "edge".into(),
        held(XdsListener::decode(&pack(&inspected)).unwrap()),
    );
    resources
        .routes
        .insert("r-a".into(), held_routes("r-a", "web"));
    let Sections { listeners, .. } = resources.sections().unwrap();
    let config = compose(&origin, listeners, vec![]).unwrap();
    assert!(config.listeners[0].http_inspector);
    assert_eq!(
        config.listeners[0].filter_chains[0]
            .matcher
            .application_protocols,
        ["h2c"]
    );
}

#[test]
fn closing_connections_on_a_host_failure_is_taken() {
    let mut c = eds_cluster("web");
    c.close_connections_on_host_health_failure = true;
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.close_connections_on_host_health_failure, Some(true));
}

#[test]
fn preconnect_policy_is_taken_within_its_bounds() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::PreconnectPolicy;
    use envoy_types::pb::google::protobuf::DoubleValue;
    let policy = |per_upstream: f64, predictive: f64| PreconnectPolicy {
        per_upstream_preconnect_ratio: Some(DoubleValue {
            value: per_upstream,
        }),
        predictive_preconnect_ratio: Some(DoubleValue { value: predictive }),
        preconnect_enabled_metadata: None,
    };
    // Envoy Gateway's `backend-preconnect` scenario.
    let mut c = eds_cluster("web");
    c.lb_policy = envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy::RoundRobin as i32;
    c.preconnect_policy = Some(policy(1.05, 2.05));
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let taken = raw.preconnect.unwrap();
    assert_eq!(taken.per_upstream_ratio, Some(1.05));
    assert_eq!(taken.predictive_ratio, Some(2.05));
    // Out of the proto's bounds: refused, naming the field.
    c.preconnect_policy = Some(policy(3.5, 1.0));
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("per_upstream_preconnect_ratio"), "{error}");
    c.preconnect_policy = Some(PreconnectPolicy {
        preconnect_enabled_metadata: Some(Default::default()),
        ..policy(1.5, 1.0)
    });
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("preconnect_enabled_metadata"), "{error}");
    // As in Envoy, the predictive ratio does nothing where the balancer cannot tell its
    // next picks (this cluster's least request).
    let mut c = eds_cluster("web");
    c.preconnect_policy = Some(policy(1.5, 2.0));
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    let taken = raw.preconnect.unwrap();
    assert_eq!(taken.per_upstream_ratio, Some(1.5));
    assert_eq!(taken.predictive_ratio, None);
}

#[test]
fn wrr_locality_is_its_child_policy_weighted_by_locality() {
    use envoy_types::pb::envoy::config::cluster::v3::LoadBalancingPolicy;
    use envoy_types::pb::envoy::extensions::load_balancing_policies::least_request::v3::LeastRequest;
    use envoy_types::pb::envoy::extensions::load_balancing_policies::wrr_locality::v3::WrrLocality;
    let child = |type_name: &str, value: Vec<u8>| -> LoadBalancingPolicy {
        let mut c = eds_cluster("inner");
        with_policy(&mut c, type_name, value);
        c.load_balancing_policy.unwrap()
    };
    let mut c = eds_cluster("web");
    let wrr = WrrLocality {
        endpoint_picking_policy: Some(child(
            "least_request.v3.LeastRequest",
            LeastRequest::default().encode_to_vec(),
        )),
    };
    with_policy(&mut c, "wrr_locality.v3.WrrLocality", wrr.encode_to_vec());
    let raw = XdsCluster::decode(&pack(&c))
        .unwrap()
        .section(None, &Default::default())
        .expect("no secrets named");
    assert_eq!(raw.lb_policy.as_deref(), Some("least_request"));
    assert_eq!(raw.locality_weighted, Some(true));
    // Envoy Gateway's child, weights from the hosts' load reports, is refused by its name.
    let wrr = WrrLocality {
        endpoint_picking_policy: Some(child(
            "client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin",
            Vec::new(),
        )),
    };
    with_policy(&mut c, "wrr_locality.v3.WrrLocality", wrr.encode_to_vec());
    let error = XdsCluster::decode(&pack(&c)).unwrap_err().to_string();
    assert!(error.contains("endpoint_picking_policy"), "{error}");
    assert!(
        error.contains("client_side_weighted_round_robin"),
        "{error}"
    );
}

/// Istio's chain repeats `envoy.filters.http.rbac` (an audit, a deny, an allow filter): each
/// is kept in order; a route's settings for that name, which Envoy would give to each, are
/// refused.
#[test]
fn istios_repeated_rbac_filters_are_each_kept() {
    use envoy_types::pb::envoy::config::rbac::v3::{
        Permission, Policy, Principal, Rbac as Rules, permission, principal,
    };
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::{Rbac, RbacPerRoute};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpFilter, http_filter,
    };
    let rbac = |action: i32| HttpFilter {
        name: "envoy.filters.http.rbac".into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(pack(&Rbac {
            rules: Some(Rules {
                action,
                policies: [(
                    format!("policy-{action}"),
                    Policy {
                        permissions: vec![Permission {
                            rule: Some(permission::Rule::DestinationPort(9)),
                        }],
                        principals: vec![Principal {
                            identifier: Some(principal::Identifier::Any(true)),
                        }],
                        ..Default::default()
                    },
                )]
                .into(),
                ..Default::default()
            }),
            ..Default::default()
        }))),
        ..Default::default()
    };
    let l = resources::listener_with_filters(
        "istio",
        "127.0.0.1:0".parse().unwrap(),
        "r",
        vec![rbac(2), rbac(1), rbac(0)],
    );
    let compose_with = |routes: RouteConfiguration| {
        let mut resources = Resources::default();
        resources.listeners.insert(
            "istio".into(),
            held(XdsListener::decode(&pack(&l)).unwrap()),
        );
        resources
            .routes
            .insert("r".into(), held(XdsRoutes::decode(&pack(&routes)).unwrap()));
        resources.clusters.insert(
            "web".into(),
            held(XdsCluster::decode(&pack(&eds_cluster("web"))).unwrap()),
        );
        resources
            .endpoints
            .insert("web".into(), held_endpoints("web", 8001));
        compose_ads(&mut resources)
    };
    let plain = resources::route_config("r", vec![resources::forward("/", "web")]);
    let config = compose_with(plain).unwrap();
    let names: Vec<&str> = (config.listeners[0].http_filters.iter())
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["rbac", "rbac/#2", "rbac/#3"]);
    let action = |i: usize| match &config.listeners[0].http_filters[i].config {
        crate::HttpFilterConfig::Rbac(r) => r.rules.as_ref().unwrap().matchers[0].action,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        [action(0), action(1), action(2)],
        [
            crate::RbacAction::Log,
            crate::RbacAction::Deny,
            crate::RbacAction::Allow
        ]
    );
    let mut per_route = resources::forward("/", "web");
    per_route.typed_per_filter_config.insert(
        "envoy.filters.http.rbac".into(),
        pack(&RbacPerRoute { rbac: None }),
    );
    let refused = compose_with(resources::route_config("r", vec![per_route]))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        refused.contains("several filters named `rbac`"),
        "{refused}"
    );
}

/// Envoy Gateway's QUIC listener (`http3.listeners.yaml`): a UDP address with `quic_options`,
/// chains by SNI with QUIC transport sockets and HTTP/3 connection managers, beside the TCP
/// listener on the same port.
#[test]
fn a_quic_listener_serves_http3_alone_with_its_chains() {
    use envoy_types::pb::envoy::config::core::v3::transport_socket;
    use envoy_types::pb::envoy::config::listener::v3::filter;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use envoy_types::pb::envoy::extensions::transport_sockets::quic::v3::QuicDownstreamTransport;

    let dir = std::env::temp_dir().join(format!("legate-xds-quic-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pair = rcgen::generate_simple_self_signed(vec!["a.example.com".to_owned()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let chain = |names: &'static [&'static str], routes: &'static str| resources::QuicChain {
        server_names: names,
        cert_file: &cert,
        key_file: &key,
        routes,
    };
    let addr = "127.0.0.1:10443".parse().unwrap();
    let quic = resources::quic_listener(
        "edge-quic",
        addr,
        &[
            chain(&["*.example.com"], "r1"),
            chain(&["foo.example.com"], "r1"),
        ],
    );
    let mut resources = Resources::default();
    resources.clusters.insert(
        "web".into(),
        held(XdsCluster::decode(&pack(&eds_cluster("web"))).unwrap()),
    );
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 8001));
    resources
        .routes
        .insert("r1".into(), held_routes("r1", "web"));
    let tcp = resources::listener("edge", addr, "r1");
    resources.listeners.insert(
        "edge".into(),
        held(XdsListener::decode(&pack(&tcp)).unwrap()),
    );
    let mut composed = |quic: &Listener| {
        resources.listeners.insert(
            "edge-quic".into(),
            held(XdsListener::decode(&pack(quic)).unwrap()),
        );
        compose_ads(&mut resources).unwrap()
    };
    // 0-RTT, on in Envoy unless set, is off here unless set.
    let early_on = |l: &mut Listener, i: usize| {
        let socket = l.filter_chains[i].transport_socket.as_mut().unwrap();
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("a typed transport socket");
        };
        let mut transport = QuicDownstreamTransport::decode(any.value.as_slice()).unwrap();
        transport.enable_early_data =
            Some(envoy_types::pb::google::protobuf::BoolValue { value: true });
        socket.config_type = Some(transport_socket::ConfigType::TypedConfig(pack(&transport)));
    };
    let config = composed(&quic);
    let of = |config: &crate::Config| {
        let quic = (config.listeners.iter())
            .find(|l| l.name == "edge-quic")
            .unwrap();
        quic.http3.as_ref().unwrap().early_data
    };
    assert!(!of(&config));
    let mut early = quic.clone();
    early_on(&mut early, 0);
    early_on(&mut early, 1);
    assert!(of(&composed(&early)));
    // The chains share one TLS server: they must agree.
    let mut differing = quic.clone();
    early_on(&mut differing, 1);
    let error = XdsListener::decode(&pack(&differing))
        .unwrap_err()
        .to_string();
    assert!(error.contains("enable_early_data"), "{error}");
    let quic = (config.listeners.iter())
        .find(|l| l.name == "edge-quic")
        .unwrap();
    let http3 = quic.http3.as_ref().unwrap();
    assert!(http3.quic_only && !quic.serves_tcp());
    // Envoy's QUIC defaults, not the connection manager's HTTP/2 options.
    assert_eq!(http3.max_concurrent_streams, Some(100));
    assert_eq!(http3.idle_timeout, Some(Duration::from_secs(300)));
    assert_eq!(http3.alt_svc_max_age, None);
    assert_eq!(quic.filter_chains.len(), 2);
    assert_eq!(
        quic.filter_chains[0].matcher.server_names,
        ["*.example.com"]
    );
    let tls = quic.filter_chains[1].settings.tls.as_ref().unwrap();
    assert_eq!(tls.handshake_timeout, Duration::from_secs(20));
    assert!(quic.filter_chains[1].settings.http3.is_some());
    let tcp = (config.listeners.iter())
        .find(|l| l.name == "edge")
        .unwrap();
    assert!(tcp.serves_tcp() && !tcp.clashes_with(quic));

    let translate = |l: &Listener| XdsListener::decode(&pack(l)).map(drop);
    let hcm_of = |l: &Listener| {
        let Some(filter::ConfigType::TypedConfig(any)) = &l.filter_chains[0].filters[0].config_type
        else {
            panic!("an inline connection manager");
        };
        HttpConnectionManager::decode(any.value.as_slice()).unwrap()
    };
    let with_hcm = |hcm: &HttpConnectionManager| {
        let mut l = resources::quic_listener("q", addr, &[chain(&["a.example.com"], "r1")]);
        l.filter_chains[0].filters[0].config_type =
            Some(filter::ConfigType::TypedConfig(pack(hcm)));
        l
    };
    let base = resources::quic_listener("q", addr, &[chain(&["a.example.com"], "r1")]);
    assert!(translate(&base).is_ok());
    // What changes behaviour and is not done here is refused by name.
    let mut auto = hcm_of(&base);
    auto.codec_type = 0;
    let error = translate(&with_hcm(&auto)).unwrap_err().to_string();
    assert!(error.contains("codec_type"), "{error}");
    let mut qpack_off = hcm_of(&base);
    qpack_off
        .http3_protocol_options
        .as_mut()
        .unwrap()
        .disable_qpack = true;
    let error = translate(&with_hcm(&qpack_off)).unwrap_err().to_string();
    assert!(error.contains("disable_qpack"), "{error}");
    let mut proxying = base.clone();
    proxying.udp_listener_config.as_mut().unwrap().quic_options = None;
    let error = translate(&proxying).unwrap_err().to_string();
    assert!(error.contains("quic_options"), "{error}");
    let mut migration = base.clone();
    (migration
        .udp_listener_config
        .as_mut()
        .unwrap()
        .quic_options
        .as_mut()
        .unwrap())
    .send_disable_active_migration =
        Some(envoy_types::pb::google::protobuf::BoolValue { value: true });
    let error = translate(&migration).unwrap_err().to_string();
    assert!(error.contains("send_disable_active_migration"), "{error}");
    // A QUIC transport on a TCP listener, and a TLS one on a QUIC listener.
    let mut tcp_with_quic = resources::listener("t", addr, "r1");
    tcp_with_quic.filter_chains[0].transport_socket =
        base.filter_chains[0].transport_socket.clone();
    let error = translate(&tcp_with_quic).unwrap_err().to_string();
    assert!(error.contains("quic"), "{error}");
    let mut bare = base.clone();
    bare.filter_chains[0].transport_socket = None;
    let error = translate(&bare).unwrap_err().to_string();
    assert!(error.contains("transport_socket"), "{error}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A change checks again only the clusters it touches: the others' checked configs are the
/// very ones in force, shared, whatever else changed.
#[test]
fn a_change_checks_again_only_the_clusters_it_touches() {
    let mut resources = Resources::default();
    hold_eds_clusters(
        &mut resources,
        &[("web", 8001), ("api", 8002), ("db", 8003)],
    );
    hold_edge_to(&mut resources, "web");
    let by_name = |sections: &Sections| -> BTreeMap<String, Arc<crate::ClusterConfig>> {
        (sections.clusters.iter())
            .map(|c| (c.name.clone(), Arc::clone(c)))
            .collect()
    };
    let first = by_name(&resources.sections().unwrap());
    assert_eq!(first.len(), 3);

    // A route change: every cluster is the one checked before.
    resources
        .routes
        .insert("r1".into(), held_routes("r1", "api"));
    let routed = resources.sections().unwrap();
    assert_eq!(
        routed.listeners[0].virtual_hosts[0]
            .route(0)
            .cluster
            .as_deref(),
        Some("api")
    );
    let second = by_name(&routed);
    assert!(first.iter().all(|(name, c)| Arc::ptr_eq(c, &second[name])));

    // New endpoints for one: that one alone is checked again, with them.
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 9001));
    let third = by_name(&resources.sections().unwrap());
    assert!(!Arc::ptr_eq(&second["web"], &third["web"]));
    assert_eq!(
        third["web"].endpoints[0].address.to_string(),
        "127.0.0.1:9001"
    );
    assert!(Arc::ptr_eq(&second["api"], &third["api"]));
    assert!(Arc::ptr_eq(&second["db"], &third["db"]));

    // A cluster removed is forgotten; one that comes back is checked afresh.
    resources.clusters.remove("db");
    let fourth = by_name(&resources.sections().unwrap());
    assert!(!fourth.contains_key("db"));
    resources.clusters.insert(
        "db".into(),
        held(XdsCluster::decode(&pack(&eds_cluster("db"))).unwrap()),
    );
    let fifth = by_name(&resources.sections().unwrap());
    assert!(!Arc::ptr_eq(&third["db"], &fifth["db"]));
    assert_eq!(
        fifth["db"].endpoints[0].address.to_string(),
        "127.0.0.1:8003"
    );
}

/// The listener `edge`, whose routes `r1` send everything to `cluster`.
fn hold_edge_to(resources: &mut Resources, cluster: &str) {
    resources
        .listeners
        .insert("edge".into(), held_listener("edge", "r1"));
    resources
        .routes
        .insert("r1".into(), held_routes("r1", cluster));
}

fn shared<K, V>(a: &SharedMap<K, V>, b: &SharedMap<K, V>) -> bool {
    std::ptr::eq(&**a, &**b)
}

#[test]
fn a_change_copies_only_the_maps_it_touches() {
    let mut resources = Resources::default();
    hold_eds_clusters(&mut resources, &[("web", 8001), ("api", 8002)]);
    hold_edge_to(&mut resources, "web");
    resources.sections().unwrap();
    resources.retain_wanted();

    // A route change: the next generation shares every cluster map with the one before.
    let before = resources.clone();
    resources
        .routes
        .insert("r1".into(), held_routes("r1", "api"));
    resources.sections().unwrap();
    resources.retain_wanted();
    assert!(shared(&before.clusters, &resources.clusters));
    assert!(shared(&before.endpoints, &resources.endpoints));
    assert!(shared(
        &before.serving_clusters,
        &resources.serving_clusters
    ));
    assert!(shared(&before.checked, &resources.checked));
    assert!(shared(&before.listeners, &resources.listeners));
    assert!(shared(&before.serving, &resources.serving));
    assert!(!shared(&before.routes, &resources.routes));
    // The generation before is as it was.
    let routes_of = |r: &Resources| format!("{:?}", r.routes["r1"].value);
    assert!(routes_of(&before).contains(r#"cluster: Some("web")"#));
    assert!(routes_of(&resources).contains(r#"cluster: Some("api")"#));

    // New endpoints for one cluster: the checked clusters are copied, that one replaced.
    let before = resources.clone();
    resources
        .endpoints
        .insert("web".into(), held_endpoints("web", 9001));
    resources.sections().unwrap();
    assert!(!shared(&before.checked, &resources.checked));
    assert!(shared(&before.clusters, &resources.clusters));
    let config = |r: &Resources, name: &str| Arc::clone(&r.checked[name].config);
    assert!(Arc::ptr_eq(
        &config(&before, "api"),
        &config(&resources, "api")
    ));
    assert!(!Arc::ptr_eq(
        &config(&before, "web"),
        &config(&resources, "web")
    ));
    assert_eq!(
        config(&before, "web").endpoints[0].address.to_string(),
        "127.0.0.1:8001"
    );
}

/// A set of owned names, as subscriptions hold them.
fn names<const N: usize>(list: [&str; N]) -> BTreeSet<String> {
    list.into_iter().map(str::to_owned).collect()
}

/// Routes `/a`, `/b` and `/c` to clusters `a`, `b` and `c`, as held after `before` (kept
/// routes shared, as an update from the server keeps them); `b_to`: where `/b` goes.
fn held_table(b_to: &str, before: Option<&Held<XdsRoutes>>) -> Held<XdsRoutes> {
    held_table_with(b_to, None, before)
}

/// [`held_table`], its virtual host retrying this many times when its routes say nothing.
fn held_table_with(
    b_to: &str,
    host_retries: Option<u32>,
    before: Option<&Held<XdsRoutes>>,
) -> Held<XdsRoutes> {
    let mut table = resources::route_config(
        "r",
        vec![
            resources::forward("/a", "a"),
            resources::forward("/b", b_to),
            resources::forward("/c", "c"),
        ],
    );
    table.virtual_hosts[0].retry_policy =
        host_retries.map(|n| envoy_types::pb::envoy::config::route::v3::RetryPolicy {
            retry_on: "5xx".into(),
            num_retries: Some(UInt32Value { value: n }),
            ..Default::default()
        });
    let encoded = pack(&table);
    let decoded = XdsRoutes::decode_after(&encoded, |_| before.map(|b| &*b.value)).unwrap();
    Held::new(decoded, "1".into(), &encoded.value)
}

/// The cluster each route of listener `edge` forwards to, by name; `direct` for a route
/// answering itself.
fn forwarded_to(config: &crate::Config) -> Vec<String> {
    let edge = config.listeners.iter().find(|l| l.name == "edge").unwrap();
    (edge.route_config.routes.iter())
        .map(|r| match &r.action {
            crate::RouteAction::Forward(f) => match f.cluster {
                crate::ClusterTarget::Index(i) => config.clusters[i].name.clone(),
                _ => "by header".into(),
            },
            crate::RouteAction::DirectResponse { status, .. } => {
                format!("direct {}", status.as_u16())
            }
            crate::RouteAction::Redirect(_) => "redirect".into(),
        })
        .collect()
}

/// Clusters `a`, `b` and `c`, listener `edge` and its table [`held_table`]`("b")`.
fn edge_with_table() -> Resources {
    let mut resources = Resources::default();
    hold_eds_clusters(&mut resources, &[("a", 8001), ("b", 8002), ("c", 8003)]);
    resources
        .listeners
        .insert("edge".into(), held_listener("edge", "r"));
    resources.routes.insert("r".into(), held_table("b", None));
    resources
}

fn edge_routes(config: &crate::Config) -> Vec<Arc<crate::RouteConfig>> {
    let edge = config.listeners.iter().find(|l| l.name == "edge").unwrap();
    edge.route_config.routes.to_vec()
}

#[test]
fn a_route_changed_in_its_table_is_checked_alone_and_the_others_are_kept_checked() {
    let mut resources = edge_with_table();
    let first = compose_ads(&mut resources).unwrap();
    assert_eq!(forwarded_to(&first), ["a", "b", "c"]);

    // `/b` now goes to `c`: that route is checked again, `/a` and `/c` are the same ones.
    let before = resources.routes.get("r").cloned();
    resources
        .routes
        .insert("r".into(), held_table("c", before.as_ref()));
    let second = compose_ads(&mut resources).unwrap();
    assert_eq!(forwarded_to(&second), ["a", "c", "c"]);
    let (old, new) = (edge_routes(&first), edge_routes(&second));
    assert!(Arc::ptr_eq(&old[0], &new[0]) && Arc::ptr_eq(&old[2], &new[2]));
    assert!(!Arc::ptr_eq(&old[1], &new[1]));
    // The tables differ by that route alone, and the comparison says so.
    assert_ne!(
        first.listeners[0].route_config,
        second.listeners[0].route_config
    );

    // The same inputs again: every route kept.
    let again = compose_ads(&mut resources).unwrap();
    assert!(
        (edge_routes(&second).iter().zip(edge_routes(&again).iter()))
            .all(|(a, b)| Arc::ptr_eq(a, b))
    );
    assert_eq!(
        second.listeners[0].route_config,
        again.listeners[0].route_config
    );
}

#[test]
fn kept_routes_are_checked_again_when_their_clusters_change() {
    let mut resources = edge_with_table();
    let first = compose_ads(&mut resources).unwrap();

    // Cluster `b` gone: its route answers 503, as a route to a cluster not there does.
    resources.clusters.remove("b");
    let second = compose_ads(&mut resources).unwrap();
    assert_eq!(forwarded_to(&second), ["a", "direct 503", "c"]);
    assert!(!Arc::ptr_eq(
        &edge_routes(&first)[1],
        &edge_routes(&second)[1]
    ));

    // The config file's clusters come first: one more there moves the others' places, and
    // the routes checked before (by the same sections) are checked again.
    let origin = |clusters: &str| {
        crate::Config::from_yaml(&format!(
            "node: {{ id: n }}\ndynamic_resources: {{ ads: {{ address: \"127.0.0.1:1\" }} }}\n{clusters}"
        ))
        .unwrap()
        .origin
    };
    let bare = origin("");
    let with_file_cluster = origin("clusters:\n  - name: file\n    endpoints: [127.0.0.1:9]\n");
    for origin in [&bare, &with_file_cluster, &bare] {
        let Sections {
            listeners,
            clusters,
            ..
        } = resources.sections().unwrap();
        let config = compose(origin, listeners, clusters).unwrap();
        assert_eq!(forwarded_to(&config), ["a", "direct 503", "c"]);
    }
}

#[test]
fn routes_stay_checked_through_endpoint_changes_and_not_through_a_change_to_their_host() {
    let mut resources = edge_with_table();
    let first = compose_ads(&mut resources).unwrap();

    // New endpoints: what the routes are checked against is the same, and so are they.
    resources
        .endpoints
        .insert("a".into(), held_endpoints("a", 9001));
    let moved = compose_ads(&mut resources).unwrap();
    assert!(
        (edge_routes(&first).iter().zip(edge_routes(&moved).iter()))
            .all(|(a, b)| Arc::ptr_eq(a, b))
    );

    // The host retries now: the same route bytes in it are routes with its retry policy.
    let before = resources.routes.get("r").cloned();
    resources
        .routes
        .insert("r".into(), held_table_with("b", Some(3), before.as_ref()));
    let retried = compose_ads(&mut resources).unwrap();
    for route in edge_routes(&retried) {
        let crate::RouteAction::Forward(forward) = &route.action else {
            panic!("a forwarding route");
        };
        assert_eq!(
            forward.retry_policy.as_ref().map(|r| r.num_retries),
            Some(3)
        );
    }
    assert_eq!(forwarded_to(&retried), ["a", "b", "c"]);
}

#[test]
fn the_memo_shares_routes_it_leaves_as_they_are_and_forgets_listeners_gone() {
    let mut resources = edge_with_table();
    compose_ads(&mut resources).unwrap();
    let memo = |r: &Resources| format!("{:?}", r.route_memo.lock().unwrap());
    // Routes the section leaves as they are are held as the table's own, not copied.
    assert_eq!(memo(&resources), "RouteMemo(1 chains, 3 routes, 0 copied)");
    // One to a cluster gone answers 503: a route of its own.
    resources.clusters.remove("b");
    resources.sections().unwrap();
    assert_eq!(memo(&resources), "RouteMemo(1 chains, 3 routes, 1 copied)");
    resources.listeners.remove("edge");
    resources.sections().unwrap();
    assert_eq!(memo(&resources), "RouteMemo(0 chains, 0 routes, 0 copied)");
}
