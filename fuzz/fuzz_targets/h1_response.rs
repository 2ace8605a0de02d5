//! HTTP/1.1 response heads, as an upstream connection reads them: the codec against hyper's
//! client reading of the same bytes (h1::fuzzing::response_head).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| h1::fuzzing::response_head(data));
