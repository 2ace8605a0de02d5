//! A changed route table translated from the one held before: the same as translated
//! afresh, and only its changed routes translated again.

use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteConfiguration, VirtualHost, route_match,
};
use envoy_types::pb::google::protobuf::Any;
use proptest::prelude::*;
use testbed::resources::{direct, forward};

use super::*;

fn pack(config: &RouteConfiguration) -> Any {
    testbed::xds::any(config)
}

/// Routes translated in this thread so far.
fn translated() -> usize {
    TRANSLATED.with(std::cell::Cell::get)
}

/// What `config` translates to, after `before` (when given), written out to compare.
fn after(before: Option<&XdsRoutes>, config: &RouteConfiguration) -> String {
    format!("{:?}", XdsRoutes::decode_after(&pack(config), |_| before))
}

fn fresh(config: &RouteConfiguration) -> String {
    format!("{:?}", XdsRoutes::decode(&pack(config)))
}

/// What `any` translates to, after `before`, without what it was translated from.
fn split(before: Option<&XdsRoutes>, any: &Any) -> String {
    let result = XdsRoutes::decode_after(any, |_| before);
    format!("{:?}", result.map(XdsRoutes::without_encoding))
}

/// What `any` translates to when decoded whole by prost: what the split must agree with.
fn whole(any: &Any) -> String {
    let config = crate::envoy::decode(any, type_url::ROUTE, "a RouteConfiguration");
    format!("{:?}", config.and_then(|c| XdsRoutes::translate(c, None)))
}

/// The CORS filter's settings at a host or route.
fn cors(policy: CorsPolicy) -> std::collections::HashMap<String, Any> {
    [(
        "envoy.filters.http.cors".to_owned(),
        testbed::xds::any(&policy),
    )]
    .into()
}

fn host(name: &str, domain: &str, routes: Vec<Route>) -> VirtualHost {
    VirtualHost {
        name: name.into(),
        domains: vec![domain.into()],
        routes,
        ..Default::default()
    }
}

fn table(hosts: Vec<VirtualHost>) -> RouteConfiguration {
    RouteConfiguration {
        name: "routes".into(),
        virtual_hosts: hosts,
        ..Default::default()
    }
}

/// A route whose path lacks its `/`: taken, and left out (it can never match).
fn never_matching() -> Route {
    let mut route = forward("/", "web");
    route.r#match = Some(envoy_types::pb::envoy::config::route::v3::RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Path("no-slash".into())),
        ..Default::default()
    });
    route
}

#[test]
fn one_changed_route_of_many_is_the_one_translated_again() {
    let routes = |status| {
        let mut routes: Vec<Route> = (0..50)
            .map(|i| forward(&format!("/{i}"), &format!("c{i}")))
            .collect();
        routes.insert(10, never_matching());
        routes.push(direct("/", status));
        routes
    };
    let first = table(vec![host("all", "*", routes(200))]);
    let before = XdsRoutes::decode(&pack(&first)).expect("valid");
    let flipped = table(vec![host("all", "*", routes(404))]);
    let start = translated();
    assert_eq!(after(Some(&before), &flipped), fresh(&flipped));
    // The fresh translation above counts 52 of its own.
    assert_eq!(translated() - start, 1 + 52);

    // Moved, inserted and removed routes are found by their bytes.
    let mut moved = routes(200);
    moved.swap(0, 40);
    moved.insert(3, forward("/new", "web"));
    moved.remove(20);
    let moved = table(vec![host("all", "*", moved)]);
    let start = translated();
    let kept = after(Some(&before), &moved);
    assert_eq!(translated() - start, 1);
    assert_eq!(kept, fresh(&moved));
}

#[test]
fn a_host_whose_own_bytes_changed_translates_its_routes_again() {
    let routes = || vec![forward("/a", "web"), direct("/", 404)];
    let first = table(vec![
        host("one", "a.example", routes()),
        host("two", "*", routes()),
    ]);
    let before = XdsRoutes::decode(&pack(&first)).expect("valid");
    // Host `one` moves behind `two` (kept, found by its bytes); `two` takes another domain.
    let second = table(vec![
        host("two", "b.example", routes()),
        host("one", "a.example", routes()),
    ]);
    let start = translated();
    let kept = after(Some(&before), &second);
    assert_eq!(translated() - start, 2);
    assert_eq!(kept, fresh(&second));
}

#[test]
fn another_tables_routes_or_bytes_cut_short_are_not_taken_for_its_own() {
    let first = table(vec![host("all", "*", vec![forward("/", "web")])]);
    let before = XdsRoutes::decode(&pack(&first)).expect("valid");
    // Asked for by name: another name's table is not given.
    let mut other = first.clone();
    other.name = "other".into();
    let asked = std::cell::RefCell::new(Vec::new());
    let decoded = XdsRoutes::decode_after(&pack(&other), |name| {
        asked.borrow_mut().push(name.to_owned());
        None
    });
    assert_eq!(asked.into_inner(), ["other"]);
    assert_eq!(format!("{decoded:?}"), fresh(&other));
    // Malformed bytes are refused as when decoded whole.
    let mut cut = pack(&first);
    cut.value.truncate(cut.value.len() - 2);
    let whole = XdsRoutes::decode(&cut).expect_err("cut short");
    let error = XdsRoutes::decode_after(&cut, |_| Some(&before)).expect_err("cut short");
    assert_eq!(error.to_string(), whole.to_string());
    // Another type is refused as before.
    let mut retyped = pack(&first);
    retyped.type_url = crate::envoy::type_url::CLUSTER.into();
    assert!(XdsRoutes::decode_after(&retyped, |_| Some(&before)).is_err());
}

/// Routes to build tables from: plain, never matching, one with CORS settings its host's
/// fill in, and one refused (without an action), which the table's error names by its place.
fn pool() -> Vec<Route> {
    vec![
        forward("/a", "web"),
        forward("/b", "api"),
        direct("/", 404),
        Route {
            typed_per_filter_config: cors(CorsPolicy {
                max_age: "600".into(),
                ..Default::default()
            }),
            ..forward("/cors", "web")
        },
        never_matching(),
        Route {
            action: None,
            ..direct("/bad", 200)
        },
    ]
}

fn tables() -> impl Strategy<Value = RouteConfiguration> {
    let hosts = (
        0..3usize,
        0..2usize,
        0..3usize,
        prop::collection::vec(0..6usize, 0..6),
    );
    prop::collection::vec(hosts, 0..3).prop_map(|hosts| {
        let pool = pool();
        table(
            hosts
                .into_iter()
                .map(|(name, domain, methods, routes)| {
                    let mut host = host(
                        ["one", "two", "three"][name],
                        ["*", "a.example"][domain],
                        routes.into_iter().map(|r| pool[r].clone()).collect(),
                    );
                    // The host's CORS policy, which its routes' own settings start from.
                    if methods > 0 {
                        host.typed_per_filter_config = cors(CorsPolicy {
                            allow_methods: ["", "GET", "POST"][methods].into(),
                            ..Default::default()
                        });
                    }
                    host
                })
                .collect(),
        )
    })
}

/// `edits` made to `encoded`: a byte replaced, a byte put in, or the bytes cut short.
fn edited(mut encoded: Vec<u8>, edits: Vec<(usize, u8, u8)>) -> Vec<u8> {
    for (at, byte, how) in edits {
        let len = encoded.len();
        match how {
            0 if len > 0 => encoded[at % len] = byte,
            1 => encoded.insert(at % (len + 1), byte),
            _ if len > 0 => encoded.truncate(at % len),
            _ => {}
        }
    }
    encoded
}

proptest! {
    /// Whatever was held before, a table translates (or is refused) as it would afresh, and
    /// as prost's decode of the whole message does.
    #[test]
    fn a_table_after_another_is_the_table_afresh(first in tables(), second in tables()) {
        let before = XdsRoutes::decode(&pack(&first));
        prop_assert_eq!(after(before.as_ref().ok(), &second), fresh(&second));
        let any = pack(&second);
        prop_assert_eq!(split(before.as_ref().ok(), &any), whole(&any));
    }

    /// Bytes a table's encoding does not quite hold (a byte changed, added or cut) are taken
    /// or refused, with the same error, as prost's decode of the whole message has them.
    #[test]
    fn damaged_bytes_decode_as_a_whole_decode_does(
        first in tables(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), 0..3u8), 1..4),
    ) {
        let before = XdsRoutes::decode(&pack(&first)).ok();
        let mut any = pack(&first);
        any.value = edited(any.value, edits);
        let expected = whole(&any);
        prop_assert_eq!(split(None, &any), expected.clone());
        prop_assert_eq!(split(before.as_ref(), &any), expected);
    }
}

#[test]
fn the_pools_last_route_is_refused() {
    let bad = table(vec![host("one", "*", vec![pool()[5].clone()])]);
    let error = XdsRoutes::decode(&pack(&bad)).expect_err("no action");
    assert!(error.to_string().contains("routes[0]"), "{error}");
}
