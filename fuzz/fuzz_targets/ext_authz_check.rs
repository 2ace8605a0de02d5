//! The CheckRequest written for a request, against the generated types' message
//! (authz_client::fuzzing::check_request).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| authz_client::fuzzing::check_request(data));
