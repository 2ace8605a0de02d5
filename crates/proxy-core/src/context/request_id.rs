//! `x-request-id`: a random UUID for each request that comes without one, so the
//! authorization service, the upstream and the access log all name it the same way.

use http::header::{HeaderName, HeaderValue};

use crate::random::next_u64;

pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A random (version 4) UUID in its text form, for `x-request-id`.
#[allow(unsafe_code)]
pub(crate) fn new_request_id() -> HeaderValue {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // Where each byte's two digits go in `8-4-4-4-12`.
    const AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&next_u64().to_le_bytes());
    bytes[8..].copy_from_slice(&next_u64().to_le_bytes());
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let mut text = [b'-'; 36];
    for (b, at) in bytes.into_iter().zip(AT) {
        text[at] = HEX[usize::from(b >> 4)];
        text[at + 1] = HEX[usize::from(b & 0xf)];
    }
    // Into the thread's chunk of copies, shared with the heads: no allocation per id.
    let id = h1::copy_shared(&text);
    // SAFETY: hex digits and dashes only, all valid in a header value (checked in debug
    // builds by `http`, and by the tests below): a check of the 36 bytes per request saved.
    unsafe { HeaderValue::from_maybe_shared_unchecked(id) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_uuid_v4_and_distinct() {
        let a = new_request_id();
        let b = new_request_id();
        assert_ne!(a, b);
        let text = a.to_str().unwrap();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "4");
        assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"));
        assert_eq!(text.matches('-').count(), 4);
        for (i, c) in text.char_indices() {
            if matches!(i, 8 | 13 | 18 | 23) {
                assert_eq!(c, '-', "{text}");
            } else {
                assert!(matches!(c, '0'..='9' | 'a'..='f'), "{text}");
            }
        }
        assert_eq!(HeaderValue::from_bytes(a.as_bytes()).unwrap(), a);
    }

    #[test]
    fn ids_from_one_chunk_and_the_next_stay_whole_and_distinct() {
        let ids: Vec<HeaderValue> = (0..400).map(|_| new_request_id()).collect();
        let distinct: std::collections::HashSet<&[u8]> =
            ids.iter().map(|id| id.as_bytes()).collect();
        assert_eq!(distinct.len(), ids.len());
        for id in &ids {
            let text = id.to_str().unwrap();
            assert_eq!(text.len(), 36);
            assert_eq!(&text[14..15], "4");
        }
    }
}
