//! Header names read from the wire, through a small per-thread cache. A name outside the
//! `http` crate's standard set (`x-request-id`, most `x-*` fields) is otherwise lowercased into
//! an allocation of its own each time it is read: several per request with a typical upstream.
//! A cached one is a reference count.

use std::cell::RefCell;

use http::HeaderName;
use http::header::InvalidHeaderName;

/// Two-way: names that share a slot (`user-agent` and `x-noop-request-bytes` do) are both
/// kept, rather than each evicting the other on every request.
const SLOTS: usize = 64;

thread_local! {
    static CACHE: RefCell<[Option<HeaderName>; SLOTS]> =
        const { RefCell::new([const { None }; SLOTS]) };
}

/// The header name `wire` spells, in any letter case; the same answer as
/// `HeaderName::from_bytes`.
pub(crate) fn header_name(wire: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    // The set's two ways, the most recently added first.
    let set = slot_of(wire) & !1;
    // A valid name differs from its lowercase form in the case of its letters only, so a
    // match ignoring case is the name `from_bytes` would make.
    let cached = CACHE.with(|cache| {
        let cache = cache.borrow();
        cache[set..set + 2]
            .iter()
            .flatten()
            .find(|name| {
                // Most peers send names in lower case already: one comparison of the bytes.
                let cached = name.as_str().as_bytes();
                cached == wire || cached.eq_ignore_ascii_case(wire)
            })
            .cloned()
    });
    if let Some(name) = cached {
        return Ok(name);
    }
    let name = HeaderName::from_bytes(wire)?;
    CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        cache[set + 1] = cache[set].take();
        cache[set] = Some(name.clone());
    });
    Ok(name)
}

/// The same slot whatever the letter case: the length and three bytes, case folded.
fn slot_of(wire: &[u8]) -> usize {
    let fold = |at: usize| usize::from(wire.get(at).map_or(0, |b| b | 0x20));
    let len = wire.len();
    (len.wrapping_mul(7)
        + fold(0)
        + fold(len / 2).wrapping_mul(3)
        + fold(len.wrapping_sub(1)).wrapping_mul(5))
        % SLOTS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_names_are_the_names_from_bytes_makes() {
        for wire in [
            &b"X-Request-Id"[..],
            b"x-request-id",
            b"X-REQUEST-ID",
            b"content-length",
            b"Content-Length",
            b"x-noop-served-by",
            b"x-noop-request-bytes",
        ] {
            // Twice: a miss then a hit.
            for _ in 0..2 {
                assert_eq!(
                    header_name(wire).unwrap(),
                    HeaderName::from_bytes(wire).unwrap()
                );
            }
        }
    }

    #[test]
    fn invalid_names_are_refused_even_when_a_valid_one_shares_their_slot() {
        header_name(b"x-a").unwrap();
        for wire in [&b"x a"[..], b"x:a", b"", b"x\x00a", b"x-\xc3\xa9"] {
            assert!(header_name(wire).is_err(), "{wire:?}");
        }
    }

    #[test]
    fn two_names_sharing_a_slot_are_both_kept() {
        assert_eq!(slot_of(b"x-noop-request-bytes"), slot_of(b"x-hhhh"));
        let first = header_name(b"x-noop-request-bytes").unwrap();
        header_name(b"x-hhhh").unwrap();
        // Kept: the name comes back as the same allocation, not made again.
        let again = header_name(b"x-noop-request-bytes").unwrap();
        assert_eq!(again.as_str().as_ptr(), first.as_str().as_ptr());
    }

    #[test]
    fn a_collision_replaces_the_slot_and_stays_correct() {
        // Names chosen to differ while the same length and ends could share a slot.
        let names: Vec<String> = (0..200).map(|i| format!("x-field-{i:03}")).collect();
        for _ in 0..2 {
            for name in &names {
                assert_eq!(header_name(name.as_bytes()).unwrap().as_str(), name);
            }
        }
    }
}
