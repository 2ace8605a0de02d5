//! Random numbers for ids and sampling: a fast generator per thread, seeded from the OS.
//! Request, trace and span ids need uniqueness, not secrecy.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};

thread_local! {
    static RNG: Cell<u64> = Cell::new(seed());
}

fn seed() -> u64 {
    // RandomState is seeded from the OS once per thread: good enough to keep workers and
    // restarts from producing the same id sequence.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0x9E37_79B9_7F4A_7C15);
    h.finish() | 1
}

/// 64 random bits from this thread's generator: unique, not secret.
pub(crate) fn next_u64() -> u64 {
    // xorshift64*: fast, per thread, and request ids need uniqueness, not secrecy.
    RNG.with(|state| {
        let mut x = state.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        state.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// Whether this request falls in `share` (drawn only for a share between none and all).
pub(crate) fn drawn(share: config::Share) -> bool {
    match share {
        config::Share::ALL => true,
        config::Share::NONE => false,
        share => share.holds(next_u64() % 1_000_000),
    }
}

/// Whether a draw falls in `percent` of 100 (drawn only between 0 and 100).
pub(crate) fn percent_drawn(percent: u32) -> bool {
    match percent {
        0 => false,
        100.. => true,
        p => next_u64() % 100 < u64::from(p),
    }
}
