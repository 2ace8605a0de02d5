//! The authorization service's answers mapped to decisions (authz_client::fuzzing::answer).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| authz_client::fuzzing::answer(data));
