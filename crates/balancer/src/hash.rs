//! xxHash64: the hash Envoy uses for ring hash, maglev and request hash keys.
//!
//! [`hash_key`] lets callers hash a header, cookie or client address the same way on every
//! machine and in every release, so a key keeps mapping to the same host.

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

/// The stable 64-bit hash of `bytes` (xxHash64, seed 0, as Envoy's hash policies compute it)
/// to pass to [`LoadBalancer::pick`](crate::LoadBalancer::pick) for ring hash and maglev.
///
/// ```
/// let key = balancer::hash_key(b"session-4711");
/// assert_eq!(key, balancer::hash_key(b"session-4711"));
/// assert_eq!(balancer::hash_key(b""), 0xEF46_DB37_51D8_E999);
/// ```
#[inline]
pub fn hash_key(bytes: &[u8]) -> u64 {
    xxh64(bytes, 0)
}

/// The hash of several values, in order: each value's xxHash64 seeded with the hash of the
/// ones before (Envoy's hash of a header with several values, sorted by the caller).
///
/// ```
/// assert_eq!(balancer::hash_keys([&b"a"[..]]), balancer::hash_key(b"a"));
/// assert_ne!(balancer::hash_keys([&b"a"[..], b"b"]), balancer::hash_keys([&b"b"[..], b"a"]));
/// ```
pub fn hash_keys<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    values.into_iter().fold(0, |seed, value| xxh64(value, seed))
}

/// xxHash64 of `input` with `seed`.
pub(crate) fn xxh64(input: &[u8], seed: u64) -> u64 {
    let len = input.len();
    let mut rest = input;
    let mut h = if len >= 32 {
        let mut v = [
            seed.wrapping_add(P1).wrapping_add(P2),
            seed.wrapping_add(P2),
            seed,
            seed.wrapping_sub(P1),
        ];
        while rest.len() >= 32 {
            for (i, lane) in v.iter_mut().enumerate() {
                *lane = round(*lane, read_u64(&rest[i * 8..]));
            }
            rest = &rest[32..];
        }
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = merge_round(h, lane);
        }
        h
    } else {
        seed.wrapping_add(P5)
    };
    h = h.wrapping_add(len as u64);
    while rest.len() >= 8 {
        h ^= round(0, read_u64(rest));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
        rest = &rest[8..];
    }
    if rest.len() >= 4 {
        h ^= u64::from(read_u32(rest)).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = &rest[4..];
    }
    for &byte in rest {
        h ^= u64::from(byte).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

#[inline]
fn round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2))
        .rotate_left(31)
        .wrapping_mul(P1)
}

#[inline]
fn merge_round(acc: u64, lane: u64) -> u64 {
    (acc ^ round(0, lane)).wrapping_mul(P1).wrapping_add(P4)
}

#[inline]
fn read_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf.copy_from_slice(&bytes[..8]);
    u64::from_le_bytes(buf)
}

#[inline]
fn read_u32(bytes: &[u8]) -> u32 {
    let mut buf = [0u8; 4];
    buf.copy_from_slice(&bytes[..4]);
    u32::from_le_bytes(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn matches_published_test_vectors() {
        // From the xxHash reference implementation's sanity checks.
        assert_eq!(xxh64(b"", 0), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a", 0), 0xD24E_C4F1_A98C_6E5B);
        assert_eq!(xxh64(b"abc", 0), 0x44BC_2CF5_AD77_0999);
    }

    proptest! {
        #[test]
        fn agrees_with_the_twox_hash_crate(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            seed in any::<u64>(),
        ) {
            prop_assert_eq!(xxh64(&bytes, seed), twox_hash::XxHash64::oneshot(seed, &bytes));
        }
    }
}
