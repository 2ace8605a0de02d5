//! Chunked request bodies: the same reading however the bytes arrive, and a round trip
//! through the encoder (h1::fuzzing::chunked_body).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| h1::fuzzing::chunked_body(data));
