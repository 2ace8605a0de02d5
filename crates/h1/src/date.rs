//! The `Date` field's value, formatted at most once a second per thread.

use std::cell::RefCell;
use std::time::{SystemTime, UNIX_EPOCH};

/// `Sun, 06 Nov 1994 08:49:37 GMT`: always 29 bytes.
const LEN: usize = 29;

thread_local! {
    static CACHED: RefCell<(u64, [u8; LEN])> = const { RefCell::new((u64::MAX, [0; LEN])) };
}

/// Calls `f` with the current date as an HTTP-date (formatted at most once a second per
/// thread), for a response that has no `Date`.
pub fn with<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.0 != secs {
            let text = httpdate::fmt_http_date(now);
            if text.len() == LEN {
                cached.1.copy_from_slice(text.as_bytes());
                cached.0 = secs;
            }
        }
        f(&cached.1)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_http_date() {
        let date = super::with(|d| String::from_utf8(d.to_vec()).unwrap());
        assert!(httpdate::parse_http_date(&date).is_ok(), "{date}");
    }
}
