//! One HTTP/2 PRIORITY frame (flags, stream identifier, payload from the input) read by the
//! http2 crate and by h2: the same frame, or both refuse (http2::fuzzing::frame_of_kind).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| http2::fuzzing::frame_of_kind(http2::frame::kind::PRIORITY, data));
