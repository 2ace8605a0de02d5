//! The config loader on arbitrary text: an error or a config that serialises and routes,
//! never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        proxy_core::fuzzing::config(text);
    }
});
