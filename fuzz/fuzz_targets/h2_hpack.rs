//! HPACK header blocks read by the http2 crate and by h2, dynamic table included: the same
//! fields, or both refuse (http2::fuzzing::hpack_blocks).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| http2::fuzzing::hpack_blocks(data));
