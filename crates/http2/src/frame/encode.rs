//! Frames written. Header blocks are split into HEADERS and CONTINUATION frames of at
//! most the peer's maximum frame size; DATA is written as a header to gather with the
//! payload (the payload is not copied).

use bytes::{BufMut, Bytes, BytesMut};

use super::{HEADER_LEN, Priority, Reason, Settings, flag, kind};

fn head(len: usize, kind: u8, flags: u8, stream: u32, out: &mut BytesMut) {
    // A caller's bug, not the peer's: a frame this long would be written corrupt.
    assert!(len < 1 << 24, "a frame's length fits in 24 bits");
    out.reserve(HEADER_LEN + len);
    out.put_slice(&(len as u32).to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
}

/// A DATA frame's header, for a payload of `len` bytes written after it.
pub fn encode_data_head(stream: u32, len: usize, end_stream: bool, out: &mut BytesMut) {
    let flags = if end_stream { flag::END_STREAM } else { 0 };
    head(len, kind::DATA, flags, stream, out);
}

/// A whole DATA frame.
pub fn encode_data(stream: u32, data: &[u8], end_stream: bool, out: &mut BytesMut) {
    encode_data_head(stream, data.len(), end_stream, out);
    out.put_slice(data);
}

/// A header block as HEADERS (with `end_stream` when no body follows) and as many
/// CONTINUATION frames as `max_frame_size` needs. For a PUSH_PROMISE-free server and a
/// client alike: no padding, no priority.
pub fn encode_header_block(
    stream: u32,
    block: &Bytes,
    end_stream: bool,
    max_frame_size: usize,
    out: &mut BytesMut,
) {
    let mut chunks = block.chunks(max_frame_size.max(1));
    let first = chunks.next().unwrap_or_default();
    let mut rest = chunks.peekable();
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if rest.peek().is_none() {
        flags |= flag::END_HEADERS;
    }
    head(first.len(), kind::HEADERS, flags, stream, out);
    out.put_slice(first);
    while let Some(chunk) = rest.next() {
        let flags = if rest.peek().is_none() {
            flag::END_HEADERS
        } else {
            0
        };
        head(chunk.len(), kind::CONTINUATION, flags, stream, out);
        out.put_slice(chunk);
    }
}

/// As [`encode_header_block`], with the block encoded by `fill` straight after the frame's
/// head in `out`: no buffer of its own unless it needs more than one frame.
pub fn encode_header_block_with(
    stream: u32,
    end_stream: bool,
    max_frame_size: usize,
    out: &mut BytesMut,
    fill: impl FnOnce(&mut BytesMut),
) {
    let start = out.len();
    out.put_slice(&[0; HEADER_LEN]);
    fill(out);
    let len = out.len() - start - HEADER_LEN;
    if len > max_frame_size {
        let block = out.split_off(start + HEADER_LEN).freeze();
        out.truncate(start);
        encode_header_block(stream, &block, end_stream, max_frame_size, out);
        return;
    }
    let mut flags = flag::END_HEADERS;
    if end_stream {
        flags |= flag::END_STREAM;
    }
    let frame_head = &mut out[start..start + HEADER_LEN];
    frame_head[..3].copy_from_slice(&(len as u32).to_be_bytes()[1..]);
    frame_head[3] = kind::HEADERS;
    frame_head[4] = flags;
    frame_head[5..].copy_from_slice(&stream.to_be_bytes());
}

pub fn encode_priority(stream: u32, priority: Priority, out: &mut BytesMut) {
    head(5, kind::PRIORITY, 0, stream, out);
    let exclusive = if priority.exclusive { 1 << 31 } else { 0 };
    out.put_u32(priority.depends_on | exclusive);
    out.put_u8(priority.weight);
}

pub fn encode_reset(stream: u32, reason: Reason, out: &mut BytesMut) {
    head(4, kind::RST_STREAM, 0, stream, out);
    out.put_u32(reason.0);
}

pub fn encode_settings(settings: &Settings, out: &mut BytesMut) {
    head(settings.pairs().count() * 6, kind::SETTINGS, 0, 0, out);
    settings.encode_payload(out);
}

pub fn encode_settings_ack(out: &mut BytesMut) {
    head(0, kind::SETTINGS, flag::ACK, 0, out);
}

pub fn encode_ping(ack: bool, payload: [u8; 8], out: &mut BytesMut) {
    head(8, kind::PING, if ack { flag::ACK } else { 0 }, 0, out);
    out.put_slice(&payload);
}

pub fn encode_goaway(last_stream: u32, reason: Reason, debug: &[u8], out: &mut BytesMut) {
    head(8 + debug.len(), kind::GOAWAY, 0, 0, out);
    out.put_u32(last_stream);
    out.put_u32(reason.0);
    out.put_slice(debug);
}

pub fn encode_window_update(stream: u32, increment: u32, out: &mut BytesMut) {
    head(4, kind::WINDOW_UPDATE, 0, stream, out);
    out.put_u32(increment);
}
