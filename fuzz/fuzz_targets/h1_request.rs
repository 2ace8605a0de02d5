//! HTTP/1.1 request heads: the codec against hyper's reading of the same bytes
//! (h1::fuzzing::request_head).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| h1::fuzzing::request_head(data));
