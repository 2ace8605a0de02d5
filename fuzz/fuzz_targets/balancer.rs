//! The balancer under arbitrary updates and picks (balancer::fuzzing::operations).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| balancer::fuzzing::operations(data));
