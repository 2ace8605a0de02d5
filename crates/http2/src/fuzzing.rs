//! Entry points for the fuzz targets in fuzz/ and for tests/fuzz_corpus.rs, which replays
//! their corpus. Not an API.
//!
//! The differential checks read the same bytes with this crate and with the `h2` crate's
//! frame reader (the HTTP/2 implementation under hyper, and so under the proxy today), and
//! require the same frames and fields, or that both refuse. Up to the first refusal, that
//! is: after a stream error the two go on differently by design (see [`compare`]).

use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{BufMut, Bytes, BytesMut};
use futures_core::Stream;

use crate::frame::{self, BlockAssembler, Frame};
use crate::hpack::{DecodeError, Decoder, Encoder};

/// The header list size both readers allow.
const MAX_LIST: usize = 16 * 1024;
/// h2 ends the connection for a list over four times the limit.
const H2_ABUSE_LIST: usize = 4 * MAX_LIST;

/// What a reader made of one frame, in terms both readers share.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Data {
        stream: u32,
        end_stream: bool,
        data: Bytes,
    },
    Headers {
        stream: u32,
        end_stream: bool,
        fields: Fields,
    },
    PushPromise {
        stream: u32,
        promised: u32,
        fields: Fields,
    },
    /// A header list over [`MAX_LIST`]: the stream is refused.
    OverSize {
        stream: u32,
    },
    /// h2's frame as its `Debug` writes it (its fields are private).
    Priority(String),
    Reset {
        stream: u32,
        reason: u32,
    },
    Settings(frame::Settings),
    SettingsAck,
    Ping {
        ack: bool,
        payload: [u8; 8],
    },
    GoAway {
        last_stream: u32,
        reason: u32,
        debug: Bytes,
    },
    WindowUpdate {
        stream: u32,
        increment: u32,
    },
    /// The reader refused the input here, for a stream or for the connection.
    Refused,
    /// A block that came in several frames and that this crate refuses where h2 may not:
    /// h2 decodes fragment by fragment, and forgets what it found malformed in a fragment
    /// that ends inside a field (`HeaderBlock::load` returns before looking), takes a field
    /// with an empty name at a fragment's end for one cut short, and accepts a dynamic
    /// table size update at the start of any fragment (RFC 7541 section 4.2 allows one
    /// only at the start of a block). Where a message is malformed
    /// is the request layer's to judge; here it only ends the comparison.
    MalformedSplit,
    /// The input ended inside a header block. This crate decodes a block once it is whole,
    /// h2 fragment by fragment: it may have refused the part it read.
    BlockUnfinished,
}

/// Pseudo-header fields (sorted by name: h2 keeps them in a struct), then the others in
/// order.
type Fields = (Vec<(Bytes, Bytes)>, Vec<(Bytes, Bytes)>);

/// Arbitrary bytes as frames (after the connection preface): both readers agree.
pub fn frames(data: &[u8]) {
    compare(data);
}

/// One frame of the type `kind`: the input is its flags, stream identifier and payload.
/// A CONTINUATION comes after a HEADERS without END_HEADERS on the same stream (its
/// fragment the first of the payload's bytes, up to 8), or both would refuse it at once.
pub fn frame_of_kind(kind: u8, data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (stream, payload) = rest.split_at(rest.len().min(4));
    let mut id = [0u8; 4];
    id[..stream.len()].copy_from_slice(stream);
    let mut input = BytesMut::new();
    let mut payload = payload;
    if kind == frame::kind::CONTINUATION {
        let (first, rest) = payload.split_at(payload.len().min(8));
        input.put_slice(&(first.len() as u32).to_be_bytes()[1..]);
        input.put_u8(frame::kind::HEADERS);
        input.put_u8(0);
        input.put_slice(&id);
        input.put_slice(first);
        payload = rest;
    }
    input.put_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    input.put_u8(kind);
    input.put_u8(flags);
    input.put_slice(&id);
    input.put_slice(payload);
    compare(&input);
}

/// Arbitrary bytes as the header blocks of HEADERS frames on streams 1, 3, 5...: each
/// block is a length byte then that many bytes. Both HPACK decoders agree, table state
/// included.
pub fn hpack_blocks(data: &[u8]) {
    let mut input = BytesMut::new();
    let mut rest = data;
    let mut stream = 1;
    while let Some((&len, tail)) = rest.split_first() {
        let (block, tail) = tail.split_at(tail.len().min(usize::from(len)));
        let block = Bytes::copy_from_slice(block);
        frame::encode_header_block(stream, &block, true, 16_384, &mut input);
        rest = tail;
        stream += 2;
    }
    compare(&input);
}

/// Fields made of the input, written by this crate's encoder (with the peer's table size
/// changing between blocks), read back by this crate's decoder and by h2's: the same
/// fields come out of both.
pub fn hpack_roundtrip(data: &[u8]) {
    let mut encoder = Encoder::new(4096);
    let mut decoder = Decoder::new(4096);
    let mut wire = BytesMut::new();
    let mut sent = Vec::new();
    let mut stream = 1;
    for block in data.split(|&b| b == 0xff).take(32) {
        let fields = fields_of(block);
        if let Some(&first) = block.first()
            && first & 0xe0 == 0xe0
        {
            // This side announces a table of at most 4,096 bytes (h2's decoder stays at the
            // default) and the peer acknowledges it: our decoder takes the limit, and the
            // encoder must say so at the next block's start (or the decoder refuses it).
            let limit = usize::from(first & 0x1f) * 128;
            decoder.set_limit(limit);
            encoder.set_peer_limit(limit);
        }
        let mut encoded = BytesMut::new();
        encoder.encode(
            fields
                .iter()
                .map(|(n, v, sensitive)| (&n[..], &v[..], *sensitive)),
            &mut encoded,
        );
        let encoded = encoded.freeze();
        let mut back = Vec::new();
        let result = decoder.decode(&encoded, usize::MAX, |f| back.push((f.name, f.value)));
        assert_eq!(result, Ok(()), "our decoder reads our encoder's block");
        let expected: Vec<(Bytes, Bytes)> = fields
            .iter()
            .map(|(n, v, _)| (Bytes::copy_from_slice(n), Bytes::copy_from_slice(v)))
            .collect();
        assert_eq!(back, expected, "the fields come back as they were written");
        frame::encode_header_block(stream, &encoded, true, 16_384, &mut wire);
        sent.push(Event::Headers {
            stream,
            end_stream: true,
            fields: split(back),
        });
        stream += 2;
    }
    // h2 refuses none of these fields at this list size: a refusal is a bad block.
    let theirs = h2_events(&wire, usize::MAX / 8);
    assert_eq!(theirs, sent, "h2 reads our encoder's blocks as written");
}

/// Fields from bytes: a field per 3 bytes (name, value length, value seed), names from a
/// set that mixes static-table names, repeated names and credentials.
fn fields_of(block: &[u8]) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
    const NAMES: [&[u8]; 8] = [
        b"content-type",
        b"x-custom",
        b"authorization",
        b"cookie",
        b"date",
        b"accept-encoding",
        b"x-a-rather-long-header-name-for-the-table",
        b"server",
    ];
    block
        .chunks_exact(3)
        .map(|c| {
            let name = NAMES[usize::from(c[0] & 7)].to_vec();
            let len = usize::from(c[1]) * 4;
            let value = (0..len)
                .map(|i| b' ' + ((usize::from(c[2]) + i * 7) % 94) as u8)
                .collect::<Vec<u8>>();
            (name, value, c[0] & 0x80 != 0)
        })
        .collect()
}

/// Both readers over `input`; panics where they differ.
///
/// Where they may differ by design, both are taken to refuse: h2 refuses more than RFC
/// 9113 asks in places (a WINDOW_UPDATE of 0 on a stream ends its connection), and this
/// crate reads frames without judging the fields' meaning (the request layer does), so
/// fields h2 refuses at the frame layer count as refused here too ([`h2_would_refuse`]).
fn compare(input: &[u8]) {
    let ours = our_events(input);
    let theirs = h2_events(input, MAX_LIST);
    // A PUSH_PROMISE ends the comparison: h2 wants one byte of block at least, where RFC
    // 9113 does not, and the proxy refuses the frame whatever it holds (a server never
    // receives one; as a client it announces SETTINGS_ENABLE_PUSH = 0).
    let push = ours
        .iter()
        .position(|e| matches!(e, Event::PushPromise { .. }));
    if let Some(at) = push.filter(|&at| {
        !ours[..at].contains(&Event::Refused) && !ours[..at].contains(&Event::MalformedSplit)
    }) {
        match theirs.get(at) {
            Some(Event::Refused) => {}
            Some(promise @ Event::PushPromise { .. }) => {
                assert_eq!(promise, &ours[at], "the same PUSH_PROMISE");
            }
            _ => panic!(
                "a PUSH_PROMISE h2 neither read nor refused:\n ours: {ours:?}\n h2: {theirs:?}"
            ),
        }
        assert_eq!(ours[..at], theirs[..at], "the same frames before");
        return;
    }
    if let Some(at) = ours.iter().position(|e| *e == Event::MalformedSplit) {
        assert!(
            matches!(
                theirs.get(at),
                Some(Event::Headers { .. } | Event::PushPromise { .. } | Event::Refused)
            ),
            "malformed fields that h2 neither refused nor read:\n ours: {ours:?}\n h2: {theirs:?}"
        );
        assert_eq!(ours[..at], theirs[..at], "the same frames before");
        return;
    }
    if ours.last() == Some(&Event::BlockUnfinished) {
        let at = ours.len() - 1;
        assert!(
            matches!(theirs.get(at), None | Some(Event::Refused)),
            "h2 read more of an unfinished block:\n ours: {ours:?}\n h2: {theirs:?}"
        );
        assert_eq!(
            ours[..at],
            theirs[..at.min(theirs.len())],
            "the same frames before"
        );
        return;
    }
    let ours_end = ours.iter().position(|e| *e == Event::Refused);
    let theirs_end = theirs.iter().position(|e| *e == Event::Refused);
    match (ours_end, theirs_end) {
        (None, None) => assert_eq!(ours, theirs, "the same frames"),
        (Some(a), Some(b)) => {
            assert_eq!(
                a, b,
                "both refuse, at the same frame:\n ours: {ours:?}\n h2: {theirs:?}"
            );
            assert_eq!(ours[..a], theirs[..a], "the same frames before both refuse");
        }
        (a, b) => panic!(
            "one reader refused and the other did not:\n ours ({a:?}): {ours:?}\n h2 ({b:?}): {theirs:?}"
        ),
    }
}

fn our_events(input: &[u8]) -> Vec<Event> {
    let mut buf = BytesMut::from(input);
    let mut assembler = BlockAssembler::new(MAX_LIST, 16_384);
    let mut decoder = Decoder::new(4096);
    let mut events = Vec::new();
    // Frames of the header block being put together.
    let mut block_frames = 0;
    loop {
        let frame = match frame::decode(&mut buf, 16_384).map_err(|e| assembler.frame_error(e)) {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                if assembler.is_partial() {
                    events.push(Event::BlockUnfinished);
                }
                break;
            }
            Err(_) => {
                events.push(Event::Refused);
                break;
            }
        };
        block_frames += 1;
        let frame = match assembler.push(frame) {
            Ok(Some(frame)) => frame,
            Ok(None) => continue,
            Err(_) => {
                events.push(Event::Refused);
                break;
            }
        };
        let split_block = std::mem::take(&mut block_frames) > 1;
        let malformed = if split_block {
            Event::MalformedSplit
        } else {
            Event::Refused
        };
        let event = match frame {
            Frame::Data {
                stream,
                end_stream,
                data,
                ..
            } => Event::Data {
                stream,
                end_stream,
                data,
            },
            Frame::Headers {
                stream,
                end_stream,
                fragment,
                priority,
                ..
            } => match decode_block(&mut decoder, &fragment) {
                // The stream's reset, after its block was decoded (h2 resets it without
                // decoding the block, leaving its table behind).
                _ if priority.is_some_and(|p| p.is_on_itself(stream)) => Event::Refused,
                Block::Fields(fields) => Event::Headers {
                    stream,
                    end_stream,
                    fields,
                },
                Block::OverSize => Event::OverSize { stream },
                Block::Refused => Event::Refused,
                Block::Malformed => malformed.clone(),
            },
            Frame::PushPromise {
                stream,
                promised,
                fragment,
                ..
            } => match decode_block(&mut decoder, &fragment) {
                Block::Fields(fields) => Event::PushPromise {
                    stream,
                    promised,
                    fields,
                },
                Block::OverSize => Event::OverSize { stream },
                Block::Refused => Event::Refused,
                Block::Malformed => malformed.clone(),
            },
            Frame::Priority { stream, priority } => Event::Priority(format!(
                "Priority {{ stream_id: StreamId({stream}), dependency: StreamDependency {{ \
                 dependency_id: StreamId({}), weight: {}, is_exclusive: {} }} }}",
                priority.depends_on, priority.weight, priority.exclusive
            )),
            Frame::Reset { stream, reason } => Event::Reset {
                stream,
                reason: reason.0,
            },
            Frame::Settings(settings) => Event::Settings(settings),
            Frame::SettingsAck => Event::SettingsAck,
            Frame::Ping { ack, payload } => Event::Ping { ack, payload },
            Frame::GoAway {
                last_stream,
                reason,
                debug,
            } => Event::GoAway {
                last_stream,
                reason: reason.0,
                debug,
            },
            Frame::WindowUpdate { stream, increment } => Event::WindowUpdate { stream, increment },
            // Put together by the assembler; ignored.
            Frame::Continuation { .. } | Frame::Unknown { .. } => continue,
        };
        let refused = event == Event::Refused;
        events.push(event);
        if refused {
            break;
        }
    }
    events
}

enum Block {
    Fields(Fields),
    OverSize,
    Refused,
    Malformed,
}

fn decode_block(decoder: &mut Decoder, block: &Bytes) -> Block {
    let mut fields = Vec::new();
    // Read whole, to judge the size as h2 does: it counts a list as over its limit when
    // it reaches it, one byte sooner than RFC 9113 allows.
    if let Err(error) = decoder.decode(block, usize::MAX, |f| fields.push((f.name, f.value))) {
        // An empty name before the error: h2 stopped there (see `Event::MalformedSplit`)
        // and never saw it. A size update after a field: h2 takes one at the start of any
        // fragment.
        if error == DecodeError::SizeUpdateNotFirst
            || fields.iter().any(|(name, _)| name.is_empty())
        {
            return Block::Malformed;
        }
        return Block::Refused;
    }
    let size: usize = fields.iter().map(|(n, v)| n.len() + v.len() + 32).sum();
    match h2_would_refuse(&fields) {
        Some(H2Refusal::Malformed) => return Block::Malformed,
        Some(H2Refusal::Invalid) => return Block::Refused,
        None if size > H2_ABUSE_LIST => return Block::Refused,
        None => {}
    }
    if size >= MAX_LIST {
        return Block::OverSize;
    }
    Block::Fields(split(fields))
}

/// Pseudo-header fields sorted; the others grouped by name in the order names first
/// appear, as a `HeaderMap` iterates them.
fn split(fields: Vec<(Bytes, Bytes)>) -> Fields {
    let (mut pseudo, mut regular): (Vec<_>, Vec<_>) =
        fields.into_iter().partition(|(n, _)| n.starts_with(b":"));
    pseudo.sort();
    let names: Vec<Bytes> = regular.iter().map(|(n, _)| n.clone()).collect();
    regular.sort_by_key(|(n, _)| names.iter().position(|first| first == n));
    (pseudo, regular)
}

/// How h2's frame reader refuses fields of a block that decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum H2Refusal {
    /// Names and values that are not valid tokens and text, unknown pseudo-header fields:
    /// its HPACK decoder fails, and the connection ends.
    Invalid,
    /// Repeated pseudo-header fields or ones after a regular field, connection-specific
    /// fields: the message is malformed, its stream reset. And an empty name (see
    /// [`Event::MalformedSplit`]).
    Malformed,
}

fn h2_would_refuse(fields: &[(Bytes, Bytes)]) -> Option<H2Refusal> {
    let mut regular = false;
    let mut seen: Vec<&[u8]> = Vec::new();
    let mut malformed = false;
    for (name, value) in fields {
        if name.is_empty() {
            // h2's decoder takes an empty name for a field cut short (it wants more bytes),
            // which at a fragment's end it lets pass; in a whole block it refuses.
            return Some(H2Refusal::Malformed);
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            let valid = match pseudo {
                b"method" => http::Method::from_bytes(value).is_ok(),
                b"status" => http::StatusCode::from_bytes(value).is_ok(),
                b"authority" | b"scheme" | b"path" | b"protocol" => {
                    std::str::from_utf8(value).is_ok()
                }
                _ => false,
            };
            if !valid {
                return Some(H2Refusal::Invalid);
            }
            malformed |= regular || seen.contains(&pseudo);
            seen.push(pseudo);
            continue;
        }
        regular = true;
        if http::HeaderName::from_lowercase(name).is_err()
            || http::HeaderValue::from_bytes(value).is_err()
        {
            return Some(H2Refusal::Invalid);
        }
        let connection_specific = matches!(
            &name[..],
            b"connection" | b"transfer-encoding" | b"upgrade" | b"keep-alive" | b"proxy-connection"
        );
        malformed |= connection_specific || (&name[..] == b"te" && &value[..] != b"trailers");
    }
    malformed.then_some(H2Refusal::Malformed)
}

fn h2_events(input: &[u8], max_list: usize) -> Vec<Event> {
    let io = std::io::Cursor::new(input.to_vec());
    let mut codec: h2::Codec<_, Bytes> = h2::Codec::new(io);
    codec.set_max_recv_header_list_size(max_list);
    let mut cx = Context::from_waker(Waker::noop());
    let mut events = Vec::new();
    loop {
        let frame = match Pin::new(&mut codec).poll_next(&mut cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            // A frame cut short by the input's end: nothing more, as for ours.
            Poll::Ready(Some(Err(h2::proto::Error::Io(..)))) | Poll::Ready(None) => break,
            Poll::Ready(Some(Err(_))) => {
                events.push(Event::Refused);
                break;
            }
            Poll::Pending => break,
        };
        let event = match frame {
            h2::frame::Frame::Data(data) => Event::Data {
                stream: data.stream_id().into(),
                end_stream: data.is_end_stream(),
                data: data.into_payload(),
            },
            h2::frame::Frame::Headers(headers) => {
                let stream = headers.stream_id().into();
                if headers.is_over_size() {
                    Event::OverSize { stream }
                } else {
                    let end_stream = headers.is_end_stream();
                    let (pseudo, map) = headers.into_parts();
                    Event::Headers {
                        stream,
                        end_stream,
                        fields: h2_fields(pseudo, &map),
                    }
                }
            }
            h2::frame::Frame::PushPromise(promise) => {
                let stream = promise.stream_id().into();
                let promised = promise.promised_id().into();
                if promise.is_over_size() {
                    Event::OverSize { stream }
                } else {
                    let (pseudo, map) = promise.into_parts();
                    Event::PushPromise {
                        stream,
                        promised,
                        fields: h2_fields(pseudo, &map),
                    }
                }
            }
            h2::frame::Frame::Priority(priority) => Event::Priority(format!("{priority:?}")),
            // RFC 9113 section 6.4: RST_STREAM on stream 0 ends the connection (h2's
            // streams layer does so after its frame reader).
            h2::frame::Frame::Reset(reset) if u32::from(reset.stream_id()) == 0 => Event::Refused,
            h2::frame::Frame::Reset(reset) => Event::Reset {
                stream: reset.stream_id().into(),
                reason: reset.reason().into(),
            },
            h2::frame::Frame::Settings(settings) if settings.is_ack() => Event::SettingsAck,
            h2::frame::Frame::Settings(settings) => Event::Settings(frame::Settings {
                header_table_size: settings.header_table_size(),
                enable_push: settings.is_push_enabled(),
                max_concurrent_streams: settings.max_concurrent_streams(),
                initial_window_size: settings.initial_window_size(),
                max_frame_size: settings.max_frame_size(),
                max_header_list_size: settings.max_header_list_size(),
                enable_connect_protocol: settings.is_extended_connect_protocol_enabled(),
            }),
            h2::frame::Frame::Ping(ping) => Event::Ping {
                ack: ping.is_ack(),
                payload: *ping.payload(),
            },
            h2::frame::Frame::GoAway(goaway) => Event::GoAway {
                last_stream: goaway.last_stream_id().into(),
                reason: goaway.reason().into(),
                debug: goaway.debug_data().clone(),
            },
            h2::frame::Frame::WindowUpdate(update) => Event::WindowUpdate {
                stream: update.stream_id().into(),
                increment: update.size_increment(),
            },
        };
        let refused = event == Event::Refused;
        events.push(event);
        if refused {
            break;
        }
    }
    events
}

fn h2_fields(pseudo: h2::frame::Pseudo, map: &http::HeaderMap) -> Fields {
    let text = |s: &str| Bytes::copy_from_slice(s.as_bytes());
    let mut pseudos = Vec::new();
    if let Some(method) = pseudo.method {
        pseudos.push((Bytes::from_static(b":method"), text(method.as_str())));
    }
    if let Some(status) = pseudo.status {
        pseudos.push((Bytes::from_static(b":status"), text(status.as_str())));
    }
    for (name, value) in [
        (":authority", pseudo.authority),
        (":scheme", pseudo.scheme),
        (":path", pseudo.path),
    ] {
        if let Some(value) = value {
            pseudos.push((Bytes::from_static(name.as_bytes()), text(&value)));
        }
    }
    if let Some(protocol) = pseudo.protocol {
        pseudos.push((Bytes::from_static(b":protocol"), text(protocol.as_str())));
    }
    pseudos.sort();
    let regular = map
        .iter()
        .map(|(n, v)| (text(n.as_str()), Bytes::copy_from_slice(v.as_bytes())))
        .collect();
    (pseudos, regular)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readers_agree_on_what_the_writer_writes() {
        let mut wire = BytesMut::new();
        frame::encode_settings(
            &frame::Settings {
                max_concurrent_streams: Some(100),
                ..Default::default()
            },
            &mut wire,
        );
        frame::encode_ping(false, *b"pingpong", &mut wire);
        let mut encoder = Encoder::new(4096);
        let mut block = BytesMut::new();
        encoder.encode(
            [
                (&b":method"[..], &b"GET"[..], false),
                (b":path", b"/a", false),
                (b"x-long", &[b'v'; 40_000][..], false),
            ],
            &mut block,
        );
        frame::encode_header_block(1, &block.freeze(), false, 16_384, &mut wire);
        frame::encode_data(1, b"body", true, &mut wire);
        frame::encode_window_update(0, 100, &mut wire);
        compare(&wire);
        let ours = our_events(&wire);
        assert!(matches!(ours[2], Event::OverSize { stream: 1 }), "{ours:?}");
        assert_eq!(ours.len(), 5);
    }

    #[test]
    fn a_window_update_of_0_is_refused_by_both() {
        frame_of_kind(frame::kind::WINDOW_UPDATE, b"\0\0\0\0\x01\0\0\0\0");
        assert_eq!(
            our_events(&{
                let mut b = BytesMut::new();
                frame::encode_window_update(1, 0, &mut b);
                b
            }),
            [Event::Refused]
        );
    }

    #[test]
    fn the_roundtrip_check_runs() {
        hpack_roundtrip(b"\x01\x02\x03\x81\x10\x20\xff\xe4\x02\x05\x06\xff\x01\x02\x03");
        hpack_blocks(b"\x04\x82\x86\x84\x41");
    }

    #[test]
    fn priority_frames_read_the_same() {
        let mut wire = BytesMut::new();
        let priority = frame::Priority {
            depends_on: 1,
            exclusive: true,
            weight: 9,
        };
        frame::encode_priority(3, priority, &mut wire);
        compare(&wire);
        assert!(matches!(&our_events(&wire)[..], [Event::Priority(_)]));
    }
}
