//! W3C trace context (`traceparent`): read from a request, written onto the requests the
//! proxy sends on. `tracestate` is opaque to a proxy and travels as it came.

use std::fmt;

/// A trace's 16-byte id.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// A span's 8-byte id.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

/// What a `traceparent` header says: the trace, the caller's span, and whether the caller
/// sampled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    pub parent_id: SpanId,
    pub sampled: bool,
}

/// The length of a version-00 `traceparent`: `00-` 32 hex `-` 16 hex `-` 2 hex.
pub const TRACEPARENT_LEN: usize = 55;

impl TraceParent {
    /// Parses a `traceparent` value as the W3C recommendation says: version `00` exactly as
    /// long as its format, a later version at least as long (its further fields ignored),
    /// lowercase hex only, and neither id all zeros. `None` for anything else: the request
    /// then starts a trace of its own.
    pub fn parse(value: &[u8]) -> Option<TraceParent> {
        if value.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        match version {
            0xff => return None,
            0 if value.len() != TRACEPARENT_LEN => return None,
            // A later version: only its first fields are ours to read.
            _ if value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-' => return None,
            _ => {}
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, byte) in trace_id.iter_mut().enumerate() {
            *byte = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        let mut parent_id = [0u8; 8];
        for (i, byte) in parent_id.iter_mut().enumerate() {
            *byte = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id: TraceId(trace_id),
            parent_id: SpanId(parent_id),
            sampled: flags & 1 == 1,
        })
    }
}

/// The `traceparent` value that names `span` as the caller: version 00, sampled or not.
pub fn traceparent(trace_id: TraceId, span: SpanId, sampled: bool) -> [u8; TRACEPARENT_LEN] {
    let mut out = [b'-'; TRACEPARENT_LEN];
    out[0] = b'0';
    out[1] = b'0';
    write_hex(&mut out[3..35], &trace_id.0);
    write_hex(&mut out[36..52], &span.0);
    out[53] = b'0';
    out[54] = if sampled { b'1' } else { b'0' };
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn write_hex(out: &mut [u8], bytes: &[u8]) {
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
}

/// Two lowercase hex digits (the recommendation forbids uppercase).
fn hex_byte(pair: &[u8]) -> Option<u8> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        }
    }
    Some((digit(pair[0])? << 4) | digit(pair[1])?)
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; 32];
        write_hex(&mut text, &self.0);
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = [0u8; 16];
        write_hex(&mut text, &self.0);
        f.write_str(std::str::from_utf8(&text).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_the_recommendations_example() {
        let parent = TraceParent::parse(EXAMPLE).unwrap();
        assert_eq!(
            parent.trace_id.to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.parent_id.to_string(), "00f067aa0ba902b7");
        assert!(parent.sampled);
    }

    #[test]
    fn writes_what_it_reads() {
        let parent = TraceParent::parse(EXAMPLE).unwrap();
        let written = traceparent(parent.trace_id, parent.parent_id, true);
        assert_eq!(&written[..], EXAMPLE);
        let unsampled = traceparent(parent.trace_id, SpanId([1; 8]), false);
        assert_eq!(
            &unsampled[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0101010101010101-00"
        );
        assert!(!TraceParent::parse(&unsampled).unwrap().sampled);
    }

    #[test]
    fn refuses_what_the_recommendation_refuses() {
        let cases: &[&[u8]] = &[
            b"",
            // uppercase hex
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // all-zero ids
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // version ff, and version 00 with more after it
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            // separators and lengths
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0z",
            // a later version whose next field does not start with a dash
            b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ];
        for case in cases {
            assert_eq!(
                TraceParent::parse(case),
                None,
                "{:?}",
                String::from_utf8_lossy(case)
            );
        }
    }

    #[test]
    fn a_later_version_is_read_for_its_known_fields() {
        let later = b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let parent = TraceParent::parse(later).unwrap();
        assert_eq!(parent.parent_id.to_string(), "00f067aa0ba902b7");
        assert!(parent.sampled);
    }

    #[test]
    fn any_bytes_parse_or_refuse_without_panicking() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        for len in 0..80 {
            for _ in 0..200 {
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        b"0123456789abcdef-fF"[(seed % 19) as usize]
                    })
                    .collect();
                let _ = TraceParent::parse(&bytes);
            }
        }
    }
}
