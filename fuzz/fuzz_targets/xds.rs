//! xDS resources as a management server would send them, from arbitrary bytes: each decoded
//! and translated, joined, validated and built as the proxy does. A refusal or a config that
//! serialises and routes, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = proxy_core::fuzzing::xds(data);
});
