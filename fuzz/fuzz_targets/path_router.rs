//! The path normaliser and the router: one spelling per path, valid targets, index = scan,
//! and the guards hold (proxy_core::fuzzing::path).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| proxy_core::fuzzing::path(data));
