//! HTTP/2 frames after the preface, read by the http2 crate and by h2: the same frames and
//! header fields, or both refuse (http2::fuzzing::frames).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| http2::fuzzing::frames(data));
