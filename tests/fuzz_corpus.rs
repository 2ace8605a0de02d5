//! Every input of the fuzz corpus (fuzz/corpus/TARGET) and every input a fuzzer once failed
//! on (fuzz/regressions/TARGET) goes through its target's checks: what the fuzzers found stays
//! found, without nightly or libFuzzer.

#![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

use std::path::Path;

/// Runs `check` on every input of the target's corpus and regressions; returns how many.
fn replay(target: &str, check: fn(&[u8])) -> usize {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut inputs = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let data = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            check(&data);
            inputs += 1;
        }
    }
    assert!(
        inputs > 0,
        "no corpus for {target} under {}",
        fuzz.display()
    );
    inputs
}

#[test]
fn jwt() {
    replay("jwt", jwt::fuzzing::token);
}

#[test]
fn config() {
    replay("config", |data| {
        if let Ok(text) = std::str::from_utf8(data) {
            proxy_core::fuzzing::config(text);
        }
    });
}

#[test]
fn path_router() {
    replay("path_router", proxy_core::fuzzing::path);
}

#[test]
fn h1_head() {
    // The regressions hold an input that once failed (a host with a percent escape).
    assert!(replay("h1_head", proxy_core::fuzzing::h1_head) > 1);
}

#[test]
fn h1_request() {
    replay("h1_request", h1::fuzzing::request_head);
}

#[test]
fn h1_response() {
    replay("h1_response", h1::fuzzing::response_head);
}

#[test]
fn h1_chunked() {
    replay("h1_chunked", h1::fuzzing::chunked_body);
}

#[test]
fn ext_authz_answer() {
    replay("ext_authz_answer", authz_client::fuzzing::answer);
}

#[test]
fn ext_authz_check() {
    replay("ext_authz_check", authz_client::fuzzing::check_request);
}

#[test]
fn balancer() {
    replay("balancer", balancer::fuzzing::operations);
}

#[test]
fn proxy_protocol() {
    replay("proxy_protocol", proxy_core::fuzzing::proxy_protocol);
}

#[test]
fn xds() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static ACCEPTED: AtomicUsize = AtomicUsize::new(0);
    replay("xds", |data| {
        if proxy_core::fuzzing::xds(data) {
            ACCEPTED.fetch_add(1, Ordering::Relaxed);
        }
    });
    // The seeds reach the end of the path: a config is made and built.
    assert!(
        ACCEPTED.load(Ordering::Relaxed) > 0,
        "no input makes a config"
    );
}

/// The xDS seed for the RBAC filter (`fuzz/corpus/xds/seed-rbac`): Envoy Gateway's chain (an
/// RBAC filter without rules, a route's `RBACPerRoute` in the matcher form) and Istio's
/// policy form, built here so that it stays what the translation takes. It makes a config,
/// and the committed seed is these bytes (`LEGATE_WRITE_SEEDS=1` writes them).
#[test]
fn the_rbac_seed_is_current() {
    use envoy_types::pb::envoy::config::rbac::v3::{
        Permission, Policy, Principal, Rbac as Rules, permission, principal,
    };
    use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac;
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpFilter, http_filter,
    };
    use testbed::resources;
    use testbed::xds::any;

    let filter = |name: &str, rbac: Rbac| HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(&rbac))),
        ..Default::default()
    };
    let istio = Rbac {
        rules: Some(Rules {
            action: 1,
            policies: [(
                "ns[foo]-policy[deny-admin]-rule[0]".to_string(),
                Policy {
                    permissions: vec![Permission {
                        rule: Some(permission::Rule::DestinationPort(8443)),
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
        shadow_rules_stat_prefix: "istio_dry_run_allow_".into(),
        ..Default::default()
    };
    let listener = resources::listener_with_filters(
        "web",
        "127.0.0.1:0".parse().unwrap(),
        "web-routes",
        vec![
            filter("envoy.filters.http.rbac", Rbac::default()),
            filter("envoy.filters.http.rbac/istio", istio),
        ],
    );
    let per_route = resources::rbac_allowing_header("reads", ":method", "get", true);
    let mut guarded = resources::forward("/", "backend");
    guarded
        .typed_per_filter_config
        .insert("envoy.filters.http.rbac".into(), any(&per_route));
    let routes = resources::route_config("web-routes", vec![guarded]);
    let cluster = resources::eds_cluster(
        "backend",
        envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy::RoundRobin,
    );
    let hosts = ["127.0.0.1:9000".parse().unwrap()];
    let seed = proxy_core::fuzzing::xds_input(&[
        any(&listener),
        any(&routes),
        any(&cluster),
        any(&resources::assignment("backend", &hosts)),
    ]);
    assert!(proxy_core::fuzzing::xds(&seed), "the seed makes a config");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/xds/seed-rbac");
    if std::env::var_os("LEGATE_WRITE_SEEDS").is_some() {
        std::fs::write(&path, &seed).unwrap();
    }
    assert_eq!(
        std::fs::read(&path).ok(),
        Some(seed),
        "{} is stale: LEGATE_WRITE_SEEDS=1 writes it",
        path.display()
    );
}

#[test]
fn h3_stream() {
    // The proxy's tasks run on its workers, whose runtime takes a task's panic in its stride:
    // counted here, as the fuzzer (which aborts on one) would see it. No other test of this
    // file panics but by failing.
    static PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        previous(info)
    }));
    replay("h3_stream", proxy_core::fuzzing::h3_stream);
    assert_eq!(
        PANICS.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "an input made the proxy panic (see above)"
    );
}

#[test]
fn h2_frames() {
    replay("h2_frames", http2::fuzzing::frames);
}

#[test]
fn h2_hpack() {
    replay("h2_hpack", http2::fuzzing::hpack_blocks);
}

#[test]
fn h2_hpack_roundtrip() {
    replay("h2_hpack_roundtrip", http2::fuzzing::hpack_roundtrip);
}

/// One test for the ten targets that read one frame of each type.
#[test]
fn h2_frame_of_each_kind() {
    use http2::frame::kind;
    macro_rules! each {
        ($($target:literal => $kind:expr),* $(,)?) => {
            $(replay($target, |data| http2::fuzzing::frame_of_kind($kind, data));)*
        };
    }
    each!(
        "h2_data" => kind::DATA,
        "h2_headers" => kind::HEADERS,
        "h2_priority" => kind::PRIORITY,
        "h2_rst_stream" => kind::RST_STREAM,
        "h2_settings" => kind::SETTINGS,
        "h2_push_promise" => kind::PUSH_PROMISE,
        "h2_ping" => kind::PING,
        "h2_goaway" => kind::GOAWAY,
        "h2_window_update" => kind::WINDOW_UPDATE,
        "h2_continuation" => kind::CONTINUATION,
    );
}
