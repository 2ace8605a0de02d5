//! HTTP/1.1 request heads through the proxy's head checks and the upstream rewrite
//! (proxy_core::fuzzing::h1_head).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| proxy_core::fuzzing::h1_head(data));
