//! Every input of the fuzz corpus (fuzz/corpus/TARGET) and every input a fuzzer once failed
//! on (fuzz/regressions/TARGET) goes through its target's checks: what the fuzzers found stays
//! found, without nightly or libFuzzer.

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
