//! A connection's first bytes through the PROXY protocol reader, arriving whole and in pieces
//! (proxy_core::fuzzing::proxy_protocol).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| proxy_core::fuzzing::proxy_protocol(data));
