//! HTTP/2 frames (RFC 9113 section 6): read one at a time from the front of a buffer, with
//! each type's own rules on lengths, stream identifiers, padding and values checked, and
//! written from their parts.
//!
//! ```
//! use bytes::BytesMut;
//! use http2::frame::{self, Frame};
//!
//! let mut buf = BytesMut::new();
//! frame::encode_ping(false, *b"12345678", &mut buf);
//! frame::encode_window_update(3, 1024, &mut buf);
//! assert_eq!(frame::decode(&mut buf, 16_384)?, Some(Frame::Ping { ack: false, payload: *b"12345678" }));
//! assert_eq!(frame::decode(&mut buf, 16_384)?, Some(Frame::WindowUpdate { stream: 3, increment: 1024 }));
//! assert_eq!(frame::decode(&mut buf, 16_384)?, None);
//! # Ok::<(), http2::frame::FrameError>(())
//! ```

mod continuation;
mod encode;
mod reason;
mod settings;

use bytes::{Buf, Bytes, BytesMut};

pub use continuation::BlockAssembler;
pub use encode::{
    encode_data, encode_data_head, encode_goaway, encode_header_block, encode_header_block_with,
    encode_ping, encode_priority, encode_reset, encode_settings, encode_settings_ack,
    encode_window_update,
};
pub use reason::Reason;
pub use settings::{Setting, Settings};

/// The frame header's length (RFC 9113 section 4.1).
pub const HEADER_LEN: usize = 9;
/// The smallest `SETTINGS_MAX_FRAME_SIZE`, and the initial one.
pub const DEFAULT_MAX_FRAME_SIZE: u32 = 16_384;
/// The largest `SETTINGS_MAX_FRAME_SIZE` (2^24 - 1).
pub const MAX_MAX_FRAME_SIZE: u32 = (1 << 24) - 1;
/// The largest flow-control window (2^31 - 1).
pub const MAX_WINDOW: u32 = (1 << 31) - 1;

/// Frame types (RFC 9113 section 6).
pub mod kind {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const PRIORITY: u8 = 0x2;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PUSH_PROMISE: u8 = 0x5;
    pub const PING: u8 = 0x6;
    pub const GOAWAY: u8 = 0x7;
    pub const WINDOW_UPDATE: u8 = 0x8;
    pub const CONTINUATION: u8 = 0x9;
}

/// Frame flags.
pub mod flag {
    pub const END_STREAM: u8 = 0x1;
    pub const ACK: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PADDED: u8 = 0x8;
    pub const PRIORITY: u8 = 0x20;
}

/// A HEADERS or PRIORITY frame's priority fields (deprecated by RFC 9113 but still sent:
/// read and checked, then not acted on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Priority {
    pub depends_on: u32,
    pub exclusive: bool,
    /// The weight as sent (1-256 is this plus one).
    pub weight: u8,
}

impl Priority {
    /// A stream that depends on itself: a stream error (`PROTOCOL_ERROR`).
    pub fn is_on_itself(&self, stream: u32) -> bool {
        self.depends_on == stream
    }
}

/// One frame, its padding removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Data {
        stream: u32,
        end_stream: bool,
        data: Bytes,
        /// The whole payload's length, padding included: what flow control counts.
        flow_len: u32,
    },
    Headers {
        stream: u32,
        end_stream: bool,
        end_headers: bool,
        priority: Option<Priority>,
        /// The header block fragment (more follows in CONTINUATION frames unless
        /// `end_headers`).
        fragment: Bytes,
    },
    Priority {
        stream: u32,
        priority: Priority,
    },
    Reset {
        stream: u32,
        reason: Reason,
    },
    Settings(Settings),
    SettingsAck,
    PushPromise {
        stream: u32,
        promised: u32,
        end_headers: bool,
        fragment: Bytes,
    },
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        reason: Reason,
        debug: Bytes,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    Continuation {
        stream: u32,
        end_headers: bool,
        fragment: Bytes,
    },
    /// A type this side does not know: ignored (RFC 9113 section 4.1), after its length was
    /// checked.
    Unknown {
        kind: u8,
        stream: u32,
    },
}

/// A frame that breaks the rules: the connection ends with `reason`, or (when `stream` is
/// set) only that stream is reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} ({reason:?})")]
pub struct FrameError {
    pub reason: Reason,
    /// `Some`: a stream error on that stream; `None`: a connection error.
    pub stream: Option<u32>,
    pub what: &'static str,
}

impl FrameError {
    const fn connection(reason: Reason, what: &'static str) -> Self {
        FrameError {
            reason,
            stream: None,
            what,
        }
    }

    const fn stream(stream: u32, reason: Reason, what: &'static str) -> Self {
        FrameError {
            reason,
            stream: Some(stream),
            what,
        }
    }
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub len: u32,
    pub kind: u8,
    pub flags: u8,
    pub stream: u32,
}

impl FrameHeader {
    pub fn parse(bytes: &[u8; HEADER_LEN]) -> Self {
        FrameHeader {
            len: u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]),
            kind: bytes[3],
            flags: bytes[4],
            // The reserved bit is ignored on receipt.
            stream: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & MAX_WINDOW,
        }
    }
}

/// Takes the frame at the front of `buf` when it is all there (`Ok(None)` until then).
/// `max_frame_size` is this side's `SETTINGS_MAX_FRAME_SIZE`: a longer frame is a
/// connection error before its payload is waited for.
pub fn decode(buf: &mut BytesMut, max_frame_size: u32) -> Result<Option<Frame>, FrameError> {
    // The length is checked as soon as it is there, before the rest of the header.
    if let Some(len) = buf.first_chunk::<3>()
        && u32::from_be_bytes([0, len[0], len[1], len[2]]) > max_frame_size
    {
        return Err(FrameError::connection(
            Reason::FRAME_SIZE_ERROR,
            "a frame longer than SETTINGS_MAX_FRAME_SIZE",
        ));
    }
    let Some(head) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let head = FrameHeader::parse(head);
    let total = HEADER_LEN + head.len as usize;
    if buf.len() < total {
        // Room for the rest, so that the reads that bring it need not grow the buffer.
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    let payload = buf.split_to(head.len as usize).freeze();
    parse(head, payload).map(Some)
}

/// A frame from its header and whole payload.
pub fn parse(head: FrameHeader, mut payload: Bytes) -> Result<Frame, FrameError> {
    use Reason as R;
    let FrameHeader {
        kind,
        flags,
        stream,
        ..
    } = head;
    let len = payload.len();
    let on_stream = |what| {
        if stream == 0 {
            Err(FrameError::connection(R::PROTOCOL_ERROR, what))
        } else {
            Ok(())
        }
    };
    let on_connection = |what| {
        if stream != 0 {
            Err(FrameError::connection(R::PROTOCOL_ERROR, what))
        } else {
            Ok(())
        }
    };
    let frame =
        match kind {
            kind::DATA => {
                on_stream("DATA on stream 0")?;
                unpad(flags, &mut payload)?;
                Frame::Data {
                    stream,
                    end_stream: flags & flag::END_STREAM != 0,
                    data: payload,
                    flow_len: len as u32,
                }
            }
            kind::HEADERS => {
                on_stream("HEADERS on stream 0")?;
                unpad(flags, &mut payload)?;
                // A stream that depends on itself is a stream error (RFC 9113 section 5.3.1),
                // but the block must still be decoded to keep the HPACK tables in step: the
                // frame is read, and the connection resets the stream after decoding
                // ([`Priority::is_on_itself`]).
                let priority = if flags & flag::PRIORITY != 0 {
                    Some(priority_fields(&mut payload).ok_or(short_of_fields(
                        flags,
                        "HEADERS too short for its priority fields",
                    ))?)
                } else {
                    None
                };
                Frame::Headers {
                    stream,
                    end_stream: flags & flag::END_STREAM != 0,
                    end_headers: flags & flag::END_HEADERS != 0,
                    priority,
                    fragment: payload,
                }
            }
            kind::PRIORITY => {
                on_stream("PRIORITY on stream 0")?;
                let priority = priority_fields(&mut payload).filter(|_| len == 5).ok_or(
                    FrameError::stream(stream, R::FRAME_SIZE_ERROR, "PRIORITY not 5 bytes long"),
                )?;
                if priority.is_on_itself(stream) {
                    return Err(FrameError::stream(
                        stream,
                        R::PROTOCOL_ERROR,
                        "a stream that depends on itself",
                    ));
                }
                Frame::Priority { stream, priority }
            }
            kind::RST_STREAM => {
                on_stream("RST_STREAM on stream 0")?;
                let code = four_bytes(&payload).ok_or(FrameError::connection(
                    R::FRAME_SIZE_ERROR,
                    "RST_STREAM not 4 bytes long",
                ))?;
                Frame::Reset {
                    stream,
                    reason: Reason(code),
                }
            }
            kind::SETTINGS => {
                on_connection("SETTINGS on a stream")?;
                if flags & flag::ACK != 0 {
                    if len != 0 {
                        return Err(FrameError::connection(
                            R::FRAME_SIZE_ERROR,
                            "a SETTINGS acknowledgement with a payload",
                        ));
                    }
                    Frame::SettingsAck
                } else {
                    Frame::Settings(Settings::parse(&payload)?)
                }
            }
            kind::PUSH_PROMISE => {
                on_stream("PUSH_PROMISE on stream 0")?;
                unpad(flags, &mut payload)?;
                let promised = payload
                    .first_chunk::<4>()
                    .map(|word| u32::from_be_bytes(*word) & MAX_WINDOW)
                    .ok_or(short_of_fields(
                        flags,
                        "PUSH_PROMISE too short for its stream identifier",
                    ))?;
                payload.advance(4);
                Frame::PushPromise {
                    stream,
                    promised,
                    end_headers: flags & flag::END_HEADERS != 0,
                    fragment: payload,
                }
            }
            kind::PING => {
                on_connection("PING on a stream")?;
                let payload: [u8; 8] = payload[..].try_into().map_err(|_| {
                    FrameError::connection(R::FRAME_SIZE_ERROR, "PING not 8 bytes long")
                })?;
                Frame::Ping {
                    ack: flags & flag::ACK != 0,
                    payload,
                }
            }
            kind::GOAWAY => {
                on_connection("GOAWAY on a stream")?;
                if len < 8 {
                    return Err(FrameError::connection(
                        R::FRAME_SIZE_ERROR,
                        "GOAWAY shorter than 8 bytes",
                    ));
                }
                let last_stream = payload.get_u32() & MAX_WINDOW;
                let reason = Reason(payload.get_u32());
                Frame::GoAway {
                    last_stream,
                    reason,
                    debug: payload,
                }
            }
            kind::WINDOW_UPDATE => {
                let increment = four_bytes(&payload).ok_or(FrameError::connection(
                    R::FRAME_SIZE_ERROR,
                    "WINDOW_UPDATE not 4 bytes long",
                ))? & MAX_WINDOW;
                if increment == 0 {
                    let what = "a WINDOW_UPDATE of 0";
                    return Err(if stream == 0 {
                        FrameError::connection(R::PROTOCOL_ERROR, what)
                    } else {
                        FrameError::stream(stream, R::PROTOCOL_ERROR, what)
                    });
                }
                Frame::WindowUpdate { stream, increment }
            }
            kind::CONTINUATION => {
                on_stream("CONTINUATION on stream 0")?;
                Frame::Continuation {
                    stream,
                    end_headers: flags & flag::END_HEADERS != 0,
                    fragment: payload,
                }
            }
            kind => Frame::Unknown { kind, stream },
        };
    Ok(frame)
}

/// Removes the padding of a frame with the PADDED flag (RFC 9113 section 6.1).
fn unpad(flags: u8, payload: &mut Bytes) -> Result<(), FrameError> {
    if flags & flag::PADDED == 0 {
        return Ok(());
    }
    let Some(&pad) = payload.first() else {
        return Err(FrameError::connection(
            Reason::FRAME_SIZE_ERROR,
            "a padded frame without its pad length",
        ));
    };
    let pad = usize::from(pad);
    // The padding cannot take the whole payload (the pad length byte included).
    if pad >= payload.len() {
        return Err(FrameError::connection(
            Reason::PROTOCOL_ERROR,
            "padding as long as the payload",
        ));
    }
    payload.advance(1);
    payload.truncate(payload.len() - pad);
    Ok(())
}

/// A frame too short for its fixed fields: padding that took their room is a
/// `PROTOCOL_ERROR` (RFC 9113 sections 6.2 and 6.6), a short frame a `FRAME_SIZE_ERROR`.
fn short_of_fields(flags: u8, what: &'static str) -> FrameError {
    let reason = if flags & flag::PADDED != 0 {
        Reason::PROTOCOL_ERROR
    } else {
        Reason::FRAME_SIZE_ERROR
    };
    FrameError::connection(reason, what)
}

fn priority_fields(payload: &mut Bytes) -> Option<Priority> {
    if payload.len() < 5 {
        return None;
    }
    let word = payload.get_u32();
    let weight = payload.get_u8();
    Some(Priority {
        depends_on: word & MAX_WINDOW,
        exclusive: word & !MAX_WINDOW != 0,
        weight,
    })
}

/// The payload as one 32-bit word, when it is exactly 4 bytes.
fn four_bytes(payload: &[u8]) -> Option<u32> {
    <[u8; 4]>::try_from(payload).ok().map(u32::from_be_bytes)
}

#[cfg(test)]
mod tests;
