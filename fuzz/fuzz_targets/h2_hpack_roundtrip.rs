//! Fields written by the http2 crate's HPACK encoder read back by its decoder and by h2's
//! (http2::fuzzing::hpack_roundtrip).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| http2::fuzzing::hpack_roundtrip(data));
