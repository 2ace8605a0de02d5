//! HTTP/3 request streams, written as they are to a proxy in this process, which must go on
//! serving (proxy_core::fuzzing::h3_stream).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| proxy_core::fuzzing::h3_stream(data));
