//! Frames read and written, and the rules of RFC 9113 section 6 on each type.

use bytes::{BufMut, Bytes, BytesMut};

use super::*;

fn raw(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> BytesMut {
    let mut out = BytesMut::new();
    out.put_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream);
    out.put_slice(payload);
    out
}

fn read(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Result<Frame, FrameError> {
    let mut buf = raw(kind, flags, stream, payload);
    let frame = decode(&mut buf, DEFAULT_MAX_FRAME_SIZE).map(|f| f.expect("a whole frame"));
    if frame.is_ok() {
        assert!(buf.is_empty(), "the frame was taken whole");
    }
    frame
}

fn refused(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> (Reason, Option<u32>) {
    let error = read(kind, flags, stream, payload).expect_err("refused");
    (error.reason, error.stream)
}

#[test]
fn a_frame_is_taken_only_once_it_is_all_there() {
    let whole = raw(kind::PING, 0, 0, b"abcdefgh");
    for cut in 0..whole.len() {
        let mut buf = BytesMut::from(&whole[..cut]);
        assert_eq!(decode(&mut buf, DEFAULT_MAX_FRAME_SIZE), Ok(None));
        assert_eq!(buf.len(), cut, "nothing taken");
    }
}

#[test]
fn a_frame_over_the_maximum_is_refused_before_its_payload_comes() {
    let mut head = raw(kind::DATA, 0, 1, &[]);
    head[..3].copy_from_slice(&[0, 0x40, 0x01]); // 16,385 bytes
    assert_eq!(
        decode(&mut head, DEFAULT_MAX_FRAME_SIZE).map_err(|e| e.reason),
        Err(Reason::FRAME_SIZE_ERROR)
    );
    // As soon as the length is there.
    let mut length_only = BytesMut::from(&head[..3]);
    assert_eq!(
        decode(&mut length_only, DEFAULT_MAX_FRAME_SIZE).map_err(|e| e.reason),
        Err(Reason::FRAME_SIZE_ERROR)
    );
}

#[test]
fn data_loses_its_padding_but_flow_control_counts_it() {
    // Pad length 3, "hi", three bytes of padding.
    let frame = read(
        kind::DATA,
        flag::PADDED | flag::END_STREAM,
        1,
        b"\x03hi\0\0\0",
    );
    assert_eq!(
        frame,
        Ok(Frame::Data {
            stream: 1,
            end_stream: true,
            data: Bytes::from_static(b"hi"),
            flow_len: 6,
        })
    );
    // Padding that takes all the rest is fine; as long as the payload, it is not. Nor is a
    // padded frame without its pad length.
    assert_eq!(
        read(kind::DATA, flag::PADDED, 1, b"\x02hi").map(|f| f
            == Frame::Data {
                stream: 1,
                end_stream: false,
                data: Bytes::new(),
                flow_len: 3
            }),
        Ok(true)
    );
    assert_eq!(
        refused(kind::DATA, flag::PADDED, 1, b"\x03hi"),
        (Reason::PROTOCOL_ERROR, None)
    );
    assert_eq!(
        refused(kind::DATA, flag::PADDED, 1, b""),
        (Reason::FRAME_SIZE_ERROR, None)
    );
    assert_eq!(
        refused(kind::DATA, 0, 0, b"hi"),
        (Reason::PROTOCOL_ERROR, None)
    );
}

#[test]
fn headers_with_priority_and_a_stream_that_depends_on_itself() {
    let frame = read(
        kind::HEADERS,
        flag::PRIORITY | flag::END_HEADERS,
        3,
        b"\x80\0\0\x01\x0f\x82",
    );
    assert_eq!(
        frame,
        Ok(Frame::Headers {
            stream: 3,
            end_stream: false,
            end_headers: true,
            priority: Some(Priority {
                depends_on: 1,
                exclusive: true,
                weight: 15
            }),
            fragment: Bytes::from_static(b"\x82"),
        })
    );
    // Read, so that its block is decoded: the connection resets the stream after.
    let on_itself = read(kind::HEADERS, flag::PRIORITY, 3, b"\0\0\0\x03\x0f");
    assert!(matches!(
        on_itself,
        Ok(Frame::Headers { priority: Some(p), .. }) if p.is_on_itself(3)
    ));
    assert_eq!(
        refused(kind::PRIORITY, 0, 3, b"\0\0\0\x03\x0f"),
        (Reason::PROTOCOL_ERROR, Some(3))
    );
    assert_eq!(
        refused(kind::PRIORITY, 0, 3, b"\0\0\0\x01"),
        (Reason::FRAME_SIZE_ERROR, Some(3))
    );
}

#[test]
fn control_frames_on_the_wrong_stream_or_of_the_wrong_length() {
    assert_eq!(
        refused(kind::SETTINGS, 0, 1, b""),
        (Reason::PROTOCOL_ERROR, None)
    );
    assert_eq!(
        refused(kind::SETTINGS, flag::ACK, 0, b"\0\x01\0\0\0\0"),
        (Reason::FRAME_SIZE_ERROR, None)
    );
    assert_eq!(
        refused(kind::SETTINGS, 0, 0, b"\0\x01\0\0\0"),
        (Reason::FRAME_SIZE_ERROR, None)
    );
    assert_eq!(
        refused(kind::PING, 0, 0, b"short"),
        (Reason::FRAME_SIZE_ERROR, None)
    );
    assert_eq!(
        refused(kind::PING, 0, 1, b"12345678"),
        (Reason::PROTOCOL_ERROR, None)
    );
    assert_eq!(
        refused(kind::RST_STREAM, 0, 0, b"\0\0\0\x08"),
        (Reason::PROTOCOL_ERROR, None)
    );
    assert_eq!(
        refused(kind::RST_STREAM, 0, 1, b"\0\0\x08"),
        (Reason::FRAME_SIZE_ERROR, None)
    );
    assert_eq!(
        refused(kind::GOAWAY, 0, 0, b"\0\0\0\x01"),
        (Reason::FRAME_SIZE_ERROR, None)
    );
    assert_eq!(
        refused(kind::WINDOW_UPDATE, 0, 0, b"\0\0\0\0"),
        (Reason::PROTOCOL_ERROR, None)
    );
    assert_eq!(
        refused(kind::WINDOW_UPDATE, 0, 5, b"\0\0\0\0"),
        (Reason::PROTOCOL_ERROR, Some(5))
    );
    assert_eq!(
        refused(kind::CONTINUATION, 0, 0, b""),
        (Reason::PROTOCOL_ERROR, None)
    );
}

#[test]
fn settings_values_are_checked_and_unknown_ones_ignored() {
    let pair = |id: u16, value: u32| {
        let mut p = id.to_be_bytes().to_vec();
        p.extend(value.to_be_bytes());
        p
    };
    assert_eq!(
        refused(kind::SETTINGS, 0, 0, &pair(0x2, 2)),
        (Reason::PROTOCOL_ERROR, None)
    );
    assert_eq!(
        refused(kind::SETTINGS, 0, 0, &pair(0x4, 1 << 31)),
        (Reason::FLOW_CONTROL_ERROR, None)
    );
    assert_eq!(
        refused(kind::SETTINGS, 0, 0, &pair(0x5, 16_383)),
        (Reason::PROTOCOL_ERROR, None)
    );
    assert_eq!(
        refused(kind::SETTINGS, 0, 0, &pair(0x5, 1 << 24)),
        (Reason::PROTOCOL_ERROR, None)
    );
    let mut both = pair(0x3, 100);
    both.extend(pair(0x99, 7));
    both.extend(pair(0x3, 50));
    let expected = Settings {
        max_concurrent_streams: Some(50),
        ..Settings::default()
    };
    assert_eq!(
        read(kind::SETTINGS, 0, 0, &both),
        Ok(Frame::Settings(expected))
    );
}

#[test]
fn what_is_written_reads_back() {
    let settings = Settings {
        header_table_size: Some(0),
        enable_push: Some(false),
        max_concurrent_streams: Some(100),
        initial_window_size: Some(65_535),
        max_frame_size: Some(16_384),
        max_header_list_size: Some(16_384),
        enable_connect_protocol: Some(true),
    };
    let mut buf = BytesMut::new();
    encode_settings(&settings, &mut buf);
    encode_settings_ack(&mut buf);
    encode_data(1, b"body", true, &mut buf);
    encode_reset(1, Reason::CANCEL, &mut buf);
    encode_goaway(7, Reason::NO_ERROR, b"bye", &mut buf);
    let priority = Priority {
        depends_on: 1,
        exclusive: false,
        weight: 200,
    };
    encode_priority(3, priority, &mut buf);
    let mut frames = Vec::new();
    while let Some(frame) = decode(&mut buf, DEFAULT_MAX_FRAME_SIZE).expect("reads") {
        frames.push(frame);
    }
    assert_eq!(
        frames,
        [
            Frame::Settings(settings),
            Frame::SettingsAck,
            Frame::Data {
                stream: 1,
                end_stream: true,
                data: Bytes::from_static(b"body"),
                flow_len: 4
            },
            Frame::Reset {
                stream: 1,
                reason: Reason::CANCEL
            },
            Frame::GoAway {
                last_stream: 7,
                reason: Reason::NO_ERROR,
                debug: Bytes::from_static(b"bye")
            },
            Frame::Priority {
                stream: 3,
                priority
            },
        ]
    );
}

#[test]
fn a_block_split_over_continuations_is_put_back_together() {
    let block = Bytes::from((0..40u8).collect::<Vec<u8>>());
    let mut buf = BytesMut::new();
    encode_header_block(5, &block, true, 16, &mut buf);
    let mut assembler = BlockAssembler::new(16 * 1024, 16);
    let mut out = Vec::new();
    while let Some(frame) = decode(&mut buf, DEFAULT_MAX_FRAME_SIZE).expect("reads") {
        assert!(
            out.is_empty(),
            "nothing comes out before the block's last frame"
        );
        if let Some(frame) = assembler.push(frame).expect("in order") {
            out.push(frame);
        }
    }
    assert_eq!(
        out,
        [Frame::Headers {
            stream: 5,
            end_stream: true,
            end_headers: true,
            priority: None,
            fragment: block,
        }]
    );
    assert!(!assembler.is_partial());
}

#[test]
fn continuation_floods_and_interleaving_end_the_connection() {
    let headers = |end_headers| Frame::Headers {
        stream: 1,
        end_stream: false,
        end_headers,
        priority: None,
        fragment: Bytes::new(),
    };
    let continuation = |stream, end_headers| Frame::Continuation {
        stream,
        end_headers,
        fragment: Bytes::new(),
    };
    // Empty CONTINUATION frames grow nothing but are counted: 16 KiB in 16 KiB frames
    // allows 5.
    let mut assembler = BlockAssembler::new(16 * 1024, 16 * 1024);
    assert_eq!(assembler.push(headers(false)), Ok(None));
    for _ in 0..5 {
        assert_eq!(assembler.push(continuation(1, false)), Ok(None));
    }
    let flood = assembler.push(continuation(1, false)).expect_err("a flood");
    assert_eq!(flood.reason, Reason::ENHANCE_YOUR_CALM);

    let mut assembler = BlockAssembler::new(16 * 1024, 16 * 1024);
    assert_eq!(assembler.push(headers(false)), Ok(None));
    let other = assembler
        .push(continuation(3, true))
        .expect_err("another stream");
    assert_eq!(other.reason, Reason::PROTOCOL_ERROR);

    let mut assembler = BlockAssembler::new(16 * 1024, 16 * 1024);
    assert_eq!(assembler.push(headers(false)), Ok(None));
    let ping = Frame::Ping {
        ack: false,
        payload: [0; 8],
    };
    assert_eq!(
        assembler.push(ping).map_err(|e| e.reason),
        Err(Reason::PROTOCOL_ERROR)
    );

    let mut assembler = BlockAssembler::new(16 * 1024, 16 * 1024);
    assert_eq!(
        assembler.push(continuation(1, true)).map_err(|e| e.reason),
        Err(Reason::PROTOCOL_ERROR)
    );
}

#[test]
fn padding_that_takes_the_fixed_fields_room_is_a_protocol_error() {
    // Padded and with priority: pad length 3 leaves 2 bytes for 5 of priority fields.
    assert_eq!(
        refused(
            kind::HEADERS,
            flag::PADDED | flag::PRIORITY,
            1,
            b"\x03\0\0\0\0\0"
        ),
        (Reason::PROTOCOL_ERROR, None)
    );
    // Not padded, just short.
    assert_eq!(
        refused(kind::HEADERS, flag::PRIORITY, 1, b"\0\0"),
        (Reason::FRAME_SIZE_ERROR, None)
    );
}

#[test]
fn a_stream_error_inside_a_block_ends_the_connection() {
    let mut assembler = BlockAssembler::new(16 * 1024, 16 * 1024);
    let stream_error = read(kind::WINDOW_UPDATE, 0, 3, b"\0\0\0\0").expect_err("0");
    assert_eq!(assembler.frame_error(stream_error), stream_error);
    let headers = Frame::Headers {
        stream: 1,
        end_stream: false,
        end_headers: false,
        priority: None,
        fragment: Bytes::new(),
    };
    assert_eq!(assembler.push(headers), Ok(None));
    let inside = assembler.frame_error(stream_error);
    assert_eq!(
        (inside.reason, inside.stream),
        (Reason::PROTOCOL_ERROR, None)
    );
}

#[test]
fn a_block_encoded_in_place_is_framed_as_one_encoded_apart() {
    // One frame, several, and exactly the frame size: the same bytes either way.
    for (len, end_stream) in [
        (0usize, true),
        (10, false),
        (16, true),
        (17, false),
        (40, true),
    ] {
        let block = Bytes::from((0..len as u8).collect::<Vec<u8>>());
        let mut apart = BytesMut::from(&b"before"[..]);
        encode_header_block(7, &block, end_stream, 16, &mut apart);
        let mut in_place = BytesMut::from(&b"before"[..]);
        encode_header_block_with(7, end_stream, 16, &mut in_place, |out| {
            out.put_slice(&block)
        });
        assert_eq!(in_place, apart, "{len} bytes");
    }
}
