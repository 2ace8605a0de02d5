//! Deterministic body bytes: the byte at absolute offset `i` is `(i % 251) as u8`.
//!
//! 251 is prime, so the pattern never lines up with power-of-two chunk or buffer sizes: a
//! proxy that drops, repeats or reorders a chunk changes the digest.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use sha2::{Digest, Sha256};

const PERIOD: usize = 251;

/// Largest chunk a [`PatternBody`] yields; also the size of the zero-copy window.
pub(crate) const MAX_CHUNK: usize = 64 * 1024;

/// One chunk's worth of pattern plus a period of slack, so any chunk starting at any offset
/// is a slice of this table: bodies up to 64 KiB per chunk cost no allocation or copying.
static TABLE: [u8; MAX_CHUNK + PERIOD] = table();

const fn table() -> [u8; MAX_CHUNK + PERIOD] {
    let mut t = [0u8; MAX_CHUNK + PERIOD];
    let mut i = 0;
    while i < t.len() {
        t[i] = (i % PERIOD) as u8;
        i += 1;
    }
    t
}

/// The slice of the pattern starting at absolute `offset`, for `len <= MAX_CHUNK`.
fn window(offset: u64, len: usize) -> &'static [u8] {
    debug_assert!(len <= MAX_CHUNK);
    let start = (offset % PERIOD as u64) as usize;
    &TABLE[start..start + len]
}

/// Deterministic body bytes: byte at absolute offset `i` is `(i % 251) as u8`.
///
/// Up to 64 KiB this borrows a static table (no allocation); longer runs are copied.
pub fn pattern_bytes(offset: u64, len: usize) -> Bytes {
    if len <= MAX_CHUNK {
        return Bytes::from_static(window(offset, len));
    }
    let mut out = Vec::with_capacity(len);
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(MAX_CHUNK);
        out.extend_from_slice(window(offset + done as u64, n));
        done += n;
    }
    Bytes::from(out)
}

/// Lowercase hex SHA-256 of `pattern_bytes(0, len)`, hashed chunk by chunk (constant memory).
pub fn pattern_sha256(len: u64) -> String {
    let mut hasher = Sha256::new();
    let mut offset = 0u64;
    while offset < len {
        let n = (len - offset).min(MAX_CHUNK as u64) as usize;
        hasher.update(window(offset, n));
        offset += n as u64;
    }
    hex(&hasher.finalize())
}

/// Lowercase hex, the format of every digest this crate prints.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// A response body of `len` pattern bytes, yielded in chunks of at most 64 KiB so that huge
/// bodies cost no memory.
#[derive(Debug)]
pub(crate) struct PatternBody {
    offset: u64,
    len: u64,
    /// Whether to report the exact length. hyper turns an exact size hint into a
    /// `content-length`, so chunked mode must hide it.
    exact: bool,
}

impl PatternBody {
    pub(crate) fn new(len: u64, exact: bool) -> Self {
        Self {
            offset: 0,
            len,
            exact,
        }
    }
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let left = this.len - this.offset;
        if left == 0 {
            return Poll::Ready(None);
        }
        let n = left.min(MAX_CHUNK as u64) as usize;
        let chunk = Bytes::from_static(window(this.offset, n));
        this.offset += n as u64;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.offset == self.len
    }

    fn size_hint(&self) -> SizeHint {
        if self.exact {
            SizeHint::with_exact(self.len - self.offset)
        } else {
            SizeHint::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[test]
    fn bytes_follow_the_formula() {
        for (offset, len) in [
            (0u64, 0usize),
            (0, 10),
            (250, 3),
            (1000, 70_000),
            (7, 200_000),
        ] {
            let b = pattern_bytes(offset, len);
            assert_eq!(b.len(), len);
            for (i, byte) in b.iter().enumerate() {
                assert_eq!(*byte, ((offset + i as u64) % 251) as u8);
            }
        }
    }

    #[test]
    fn streaming_digest_matches_one_shot() {
        for len in [0u64, 1, 251, 65_536, 65_537, 300_001] {
            let whole = pattern_bytes(0, len as usize);
            assert_eq!(pattern_sha256(len), hex(&Sha256::digest(&whole)));
        }
        // Known answer for the empty input guards the hex formatting.
        assert_eq!(
            pattern_sha256(0),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[tokio::test]
    async fn body_chunks_are_bounded_and_concatenate_to_the_pattern() {
        let len = 200_000u64;
        let mut body = PatternBody::new(len, true);
        assert_eq!(body.size_hint().exact(), Some(len));
        let mut got = Vec::new();
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            assert!(data.len() <= MAX_CHUNK);
            got.extend_from_slice(&data);
        }
        assert_eq!(got, pattern_bytes(0, len as usize));
        assert_eq!(PatternBody::new(5, false).size_hint().exact(), None);
    }
}
