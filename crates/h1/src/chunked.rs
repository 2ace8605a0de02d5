//! The chunked transfer coding, decoded (RFC 9112 section 7.1). Strict where leniency has
//! let two parsers disagree about where a chunk ends: CRLF after every line and every chunk's
//! data (no bare LF), hexadecimal sizes of at most 16 digits, extensions and trailers bounded.

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue};

use crate::BodyError;

/// Chunk extensions a body may carry in total (they are read and discarded), as in hyper.
const MAX_EXTENSION_BYTES: usize = 16 * 1024;
/// Trailer fields a body may end with.
const MAX_TRAILER_FIELDS: usize = 64;

/// What a step of decoding found.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    Data(Bytes),
    /// The last chunk's trailer fields: the body is complete.
    Trailers(HeaderMap),
    /// The last chunk, without trailers: the body is complete.
    End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// In the size's hex digits (`digits` read so far).
    Size {
        digits: u8,
    },
    /// Whitespace after the size (tolerated, as RFC 9112 section 7.1.1 notes some senders do).
    AfterSize,
    Extension,
    /// The size line's LF, after its CR.
    SizeLf,
    Data,
    DataCr,
    DataLf,
    /// After the last chunk: trailer fields, or the final CRLF.
    Trailers,
    Done,
}

/// Decodes one chunked body from the front of a read buffer, leaving whatever follows it (the
/// next pipelined request) in the buffer.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    /// What is left of the current chunk's data, or the size being read.
    size: u64,
    extension_bytes: usize,
    max_trailers: usize,
}

impl ChunkedDecoder {
    /// `max_trailers`: the most bytes the trailer section may take.
    pub fn new(max_trailers: usize) -> Self {
        Self {
            state: State::Size { digits: 0 },
            size: 0,
            extension_bytes: 0,
            max_trailers,
        }
    }

    /// Whether the last chunk has been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes what `buf` holds: `Ok(None)` when it needs more bytes. Data comes out as it
    /// arrives, not a whole chunk at a time: small pieces are copied out (`take_front`), large
    /// ones share `buf`'s memory.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Chunk>, BodyError> {
        loop {
            match self.state {
                State::Data => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = buf
                        .len()
                        .min(usize::try_from(self.size).unwrap_or(usize::MAX));
                    self.size -= n as u64;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                    return Ok(Some(Chunk::Data(crate::shared_copy::take_front(buf, n))));
                }
                State::Trailers => return self.trailers(buf),
                State::Done => return Ok(Some(Chunk::End)),
                _ => {}
            }
            let Some(&byte) = buf.first() else {
                return Ok(None);
            };
            buf.advance(1);
            self.state = match (self.state, byte) {
                (State::Size { digits }, _) if byte.is_ascii_hexdigit() => {
                    if digits == 16 {
                        return Err(BodyError::ChunkSizeTooLarge);
                    }
                    let digit = (byte as char).to_digit(16).unwrap_or_default();
                    self.size = (self.size << 4) | u64::from(digit);
                    State::Size { digits: digits + 1 }
                }
                (State::Size { digits: 0 }, _) => return Err(BodyError::InvalidChunkSize),
                (State::Size { .. } | State::AfterSize, b' ' | b'\t') => State::AfterSize,
                (State::Size { .. } | State::AfterSize, b';') => State::Extension,
                (State::Size { .. } | State::AfterSize | State::Extension, b'\r') => State::SizeLf,
                (State::Size { .. } | State::AfterSize, _) => {
                    return Err(BodyError::InvalidChunkSize);
                }
                (State::Extension, _) => {
                    self.extension_bytes += 1;
                    if self.extension_bytes > MAX_EXTENSION_BYTES {
                        return Err(BodyError::ExtensionsTooLong);
                    }
                    if byte != b'\t' && (byte < b' ' || byte == 0x7f) {
                        return Err(BodyError::InvalidChunkSize);
                    }
                    State::Extension
                }
                (State::SizeLf, b'\n') if self.size == 0 => State::Trailers,
                (State::SizeLf, b'\n') => State::Data,
                (State::DataCr, b'\r') => State::DataLf,
                (State::DataLf, b'\n') => State::Size { digits: 0 },
                (State::SizeLf | State::DataCr | State::DataLf, _) => {
                    return Err(BodyError::MissingCrlf);
                }
                (State::Data | State::Trailers | State::Done, _) => unreachable_state(),
            };
        }
    }

    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Option<Chunk>, BodyError> {
        if buf.first() == Some(&b'\n') {
            return Err(BodyError::MissingCrlf);
        }
        if buf.len() < 2 {
            return Ok(None);
        }
        if buf.starts_with(b"\r\n") {
            buf.advance(2);
            self.state = State::Done;
            return Ok(Some(Chunk::End));
        }
        let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
        let (len, fields) = match httparse::parse_headers(buf, &mut fields) {
            Ok(httparse::Status::Complete(parsed)) => parsed,
            Ok(httparse::Status::Partial) if buf.len() > self.max_trailers => {
                return Err(BodyError::TrailersTooLarge);
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(BodyError::TrailersTooLarge),
            Err(_) => return Err(BodyError::InvalidTrailers),
        };
        if len > self.max_trailers {
            return Err(BodyError::TrailersTooLarge);
        }
        // httparse takes a bare LF as a line end; framing here takes CRLF only.
        if buf[..len]
            .iter()
            .enumerate()
            .any(|(i, &b)| b == b'\n' && (i == 0 || buf[i - 1] != b'\r'))
        {
            return Err(BodyError::MissingCrlf);
        }
        let mut trailers = HeaderMap::with_capacity(fields.len());
        for field in fields.iter() {
            let name = crate::names::header_name(field.name.as_bytes())
                .map_err(|_| BodyError::InvalidTrailers)?;
            let value =
                HeaderValue::from_bytes(field.value).map_err(|_| BodyError::InvalidTrailers)?;
            if !crate::response::is_framing(&name) {
                trailers.append(name, value);
            }
        }
        buf.advance(len);
        self.state = State::Done;
        // Nothing left of them (framing fields only): the body simply ends.
        if trailers.is_empty() {
            return Ok(Some(Chunk::End));
        }
        Ok(Some(Chunk::Trailers(trailers)))
    }
}

/// States handled before the byte match.
#[cold]
fn unreachable_state() -> ! {
    unreachable!("data, trailers and done are handled before reading a byte")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body, its trailers, and what followed it.
    type Decoded = (Vec<u8>, Option<HeaderMap>, Vec<u8>);

    fn decode_all(input: &[u8]) -> Result<Decoded, BodyError> {
        let mut decoder = ChunkedDecoder::new(1024);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        // A byte at a time: every state must survive a split anywhere.
        for (i, &b) in input.iter().enumerate() {
            buf.extend_from_slice(&[b]);
            while let Some(chunk) = decoder.decode(&mut buf)? {
                let rest = [&buf[..], &input[i + 1..]].concat();
                match chunk {
                    Chunk::Data(data) => body.extend_from_slice(&data),
                    Chunk::Trailers(t) => return Ok((body, Some(t), rest)),
                    Chunk::End => return Ok((body, None, rest)),
                }
            }
        }
        Err(BodyError::Incomplete)
    }

    #[test]
    fn chunks_extensions_and_what_follows() {
        let (body, trailers, rest) =
            decode_all(b"5;name=value\r\nhello\r\n1 ; x\r\n!\r\n0\r\n\r\nGET / HTTP/1.1").unwrap();
        assert_eq!(body, b"hello!");
        assert!(trailers.is_none());
        assert_eq!(rest, b"GET / HTTP/1.1");
    }

    #[test]
    fn trailers_without_framing_fields() {
        let (body, trailers, rest) =
            decode_all(b"3\r\nabc\r\n0\r\ngrpc-status: 0\r\ncontent-length: 5\r\n\r\n").unwrap();
        assert_eq!(body, b"abc");
        let trailers = trailers.unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert!(!trailers.contains_key("content-length"));
        assert!(rest.is_empty());
    }

    #[test]
    fn hex_sizes_both_cases() {
        let mut input = b"A\r\n".to_vec();
        input.extend_from_slice(&[b'x'; 10]);
        input.extend_from_slice(b"\r\n1f\r\n");
        input.extend_from_slice(&[b'y'; 31]);
        input.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(decode_all(&input).unwrap().0.len(), 41);
    }

    #[test]
    fn refusals() {
        for (input, error) in [
            (&b"\r\n"[..], BodyError::InvalidChunkSize),
            (b"x\r\n", BodyError::InvalidChunkSize),
            (b"-1\r\n", BodyError::InvalidChunkSize),
            (b"+1\r\n", BodyError::InvalidChunkSize),
            (b"0x1\r\n", BodyError::InvalidChunkSize),
            (b"1\nx\r\n0\r\n\r\n", BodyError::InvalidChunkSize),
            (b"1\r\r\nx\r\n0\r\n\r\n", BodyError::MissingCrlf),
            (b"1\r\nxy\r\n", BodyError::MissingCrlf),
            (b"1\r\nx\n0\r\n\r\n", BodyError::MissingCrlf),
            (b"10000000000000000\r\n", BodyError::ChunkSizeTooLarge),
            (b"1;a\0b\r\n", BodyError::InvalidChunkSize),
            (b"0\r\nbad header\r\n\r\n", BodyError::InvalidTrailers),
            (b"0\r\n\n", BodyError::MissingCrlf),
            (b"0\r\nx: y\n\r\n", BodyError::MissingCrlf),
        ] {
            assert_eq!(
                decode_all(input).unwrap_err(),
                error,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn sixteen_hex_digits_are_taken() {
        let mut decoder = ChunkedDecoder::new(1024);
        let mut buf = BytesMut::from(&b"ffffffffffffffff\r\nab"[..]);
        assert_eq!(
            decoder.decode(&mut buf).unwrap(),
            Some(Chunk::Data(Bytes::from_static(b"ab")))
        );
    }

    #[test]
    fn extensions_and_trailers_are_bounded() {
        let mut input = b"1;".to_vec();
        input.extend(std::iter::repeat_n(b'e', MAX_EXTENSION_BYTES + 1));
        assert_eq!(
            decode_all(&input).unwrap_err(),
            BodyError::ExtensionsTooLong
        );
        let mut input = b"0\r\nx: ".to_vec();
        input.extend(std::iter::repeat_n(b'v', 2048));
        assert_eq!(decode_all(&input).unwrap_err(), BodyError::TrailersTooLarge);
    }
}
