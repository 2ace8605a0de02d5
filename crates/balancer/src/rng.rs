//! A per-thread pseudo-random generator for the pick path: no locks, no allocation, no
//! shared cache line. Quality needs are modest (choosing among hosts), so this is wyrand
//! (Wang Yi's 64-bit generator, which passes BigCrush and PractRand), seeded per thread from
//! the standard library's randomly keyed hasher.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

thread_local! {
    static STATE: Cell<u64> = const { Cell::new(0) };
}

/// The next 64 random bits of this thread's stream.
#[inline]
pub(crate) fn next_u64() -> u64 {
    STATE.with(|state| {
        let mut s = state.get();
        if s == 0 {
            s = seed();
        }
        s = s.wrapping_add(0xa076_1d64_78bd_642f);
        state.set(s);
        let t = u128::from(s).wrapping_mul(u128::from(s ^ 0xe703_7ed1_a0b4_28db));
        ((t >> 64) as u64) ^ (t as u64)
    })
}

/// Seeds this thread's stream, so that a test of the picks' statistics sees one fixed
/// sequence (each test runs on a thread of its own) and cannot fail by chance.
#[cfg(test)]
pub(crate) fn seed_this_thread(seed: u64) {
    STATE.with(|state| state.set(seed | 1));
}

/// A uniform index in `0..n` (`n > 0`), by multiply-shift (Lemire) instead of a division.
#[inline]
pub(crate) fn below(n: usize) -> usize {
    scale(next_u64(), n)
}

/// Maps 64 uniform bits onto `0..n`.
#[inline]
pub(crate) fn scale(bits: u64, n: usize) -> usize {
    ((u128::from(bits) * n as u128) >> 64) as usize
}

/// Maps 32 uniform bits onto `0..n` (`n <= u32::MAX + 1`).
#[inline]
pub(crate) fn scale32(bits: u32, n: usize) -> usize {
    ((u64::from(bits) * n as u64) >> 32) as usize
}

/// A uniform float in `[0, 1)`.
#[inline]
pub(crate) fn unit_f64() -> f64 {
    (next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cold]
fn seed() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    let local = 0u8;
    hasher.write_usize(&local as *const u8 as usize);
    hasher.write_u64(std::process::id().into());
    hasher.finish() | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_covers_it() {
        let mut seen = [false; 7];
        for _ in 0..10_000 {
            let i = below(7);
            assert!(i < 7);
            seen[i] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn threads_get_different_streams() {
        let a: Vec<u64> = (0..4).map(|_| next_u64()).collect();
        let b = std::thread::spawn(|| (0..4).map(|_| next_u64()).collect::<Vec<u64>>())
            .join()
            .unwrap();
        assert_ne!(a, b);
    }
}
