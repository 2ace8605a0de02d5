//! Tokens and key sets as the jwt_authn filter reads them (jwt::fuzzing::token): parsed,
//! checked and verified without a panic, and nothing made up verifies.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| jwt::fuzzing::token(data));
