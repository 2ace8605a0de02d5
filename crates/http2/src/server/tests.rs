use std::io::IoSlice;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::*;
use crate::frame::{Frame, MAX_MAX_FRAME_SIZE, flag, kind};
use crate::hpack::Field;

/// A client's side of the wire: what it writes, and what it makes of the server's frames.
struct Client {
    encoder: Encoder,
    decoder: Decoder,
    wire: BytesMut,
    read: BytesMut,
    blocks: BlockAssembler,
}

const GET: &[(&str, &str)] = &[
    (":method", "GET"),
    (":scheme", "https"),
    (":path", "/"),
    (":authority", "example.com"),
];

/// A POST to `/`, with these fields after the pseudo-header fields.
fn post<'a>(more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut fields = vec![
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/"),
        (":authority", "example.com"),
    ];
    fields.extend_from_slice(more);
    fields
}

impl Client {
    /// The preface and an empty SETTINGS.
    fn new() -> Self {
        let mut wire = BytesMut::from(&PREFACE[..]);
        frame::encode_settings(&Settings::default(), &mut wire);
        Client {
            encoder: Encoder::new(DEFAULT_TABLE_SIZE),
            decoder: Decoder::new(DEFAULT_TABLE_SIZE),
            wire,
            read: BytesMut::new(),
            blocks: BlockAssembler::new(1 << 20, MAX_MAX_FRAME_SIZE as usize),
        }
    }

    fn headers(&mut self, stream: u32, fields: &[(&str, &str)], end_stream: bool) -> &mut Self {
        let mut block = BytesMut::new();
        self.encoder.encode(
            fields
                .iter()
                .map(|(n, v)| (n.as_bytes(), v.as_bytes(), false)),
            &mut block,
        );
        frame::encode_header_block(stream, &block.freeze(), end_stream, 16_384, &mut self.wire);
        self
    }

    fn get(&mut self, stream: u32) -> &mut Self {
        self.headers(stream, GET, true)
    }

    fn frame(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) -> &mut Self {
        let len = payload.len() as u32;
        self.wire.extend_from_slice(&len.to_be_bytes()[1..]);
        self.wire.extend_from_slice(&[kind, flags]);
        self.wire.extend_from_slice(&stream.to_be_bytes());
        self.wire.extend_from_slice(payload);
        self
    }

    fn send(&mut self, conn: &mut Connection) -> Result<(), ConnectionError> {
        conn.recv(&mut self.wire, Instant::now())
    }

    /// Takes the server's output and reads it as frames, header blocks decoded.
    fn receive(&mut self, conn: &mut Connection) -> Vec<Seen> {
        let mut slices = [IoSlice::new(&[]); 64];
        let n = conn.output(&mut slices);
        let mut written = 0;
        for slice in &slices[..n] {
            self.read.extend_from_slice(slice);
            written += slice.len();
        }
        conn.advance_output(written);
        let mut seen = Vec::new();
        while let Some(frame) = frame::decode(&mut self.read, MAX_MAX_FRAME_SIZE).unwrap() {
            let Some(frame) = self.blocks.push(frame).unwrap() else {
                continue;
            };
            seen.push(match frame {
                Frame::Headers {
                    stream,
                    end_stream,
                    fragment,
                    ..
                } => {
                    let mut fields = Vec::new();
                    self.decoder
                        .decode(&fragment, 1 << 20, |f: Field| {
                            fields.push((
                                String::from_utf8(f.name.to_vec()).unwrap(),
                                String::from_utf8(f.value.to_vec()).unwrap(),
                            ))
                        })
                        .unwrap();
                    Seen::Headers {
                        stream,
                        end_stream,
                        fields,
                    }
                }
                other => Seen::Other(other),
            });
        }
        seen
    }
}

#[derive(Debug)]
enum Seen {
    Headers {
        stream: u32,
        end_stream: bool,
        fields: Vec<(String, String)>,
    },
    Other(Frame),
}

impl Seen {
    fn status(&self) -> Option<&str> {
        match self {
            Seen::Headers { fields, .. } => fields
                .iter()
                .find(|(n, _)| n == ":status")
                .map(|(_, v)| v.as_str()),
            Seen::Other(_) => None,
        }
    }
}

fn resets(seen: &[Seen]) -> Vec<(u32, Reason)> {
    seen.iter()
        .filter_map(|s| match s {
            Seen::Other(Frame::Reset { stream, reason }) => Some((*stream, *reason)),
            _ => None,
        })
        .collect()
}

fn goaway(seen: &[Seen]) -> Option<(u32, Reason)> {
    seen.iter().find_map(|s| match s {
        Seen::Other(Frame::GoAway {
            last_stream,
            reason,
            ..
        }) => Some((*last_stream, *reason)),
        _ => None,
    })
}

fn data_len(seen: &[Seen], id: u32) -> usize {
    seen.iter()
        .map(|s| match s {
            Seen::Other(Frame::Data { stream, data, .. }) if *stream == id => data.len(),
            _ => 0,
        })
        .sum()
}

fn requests(conn: &mut Connection) -> Vec<u32> {
    let mut ids = Vec::new();
    while let Some(event) = conn.poll_event() {
        if let Event::Request { stream, .. } = event {
            ids.push(stream);
        }
    }
    ids
}

fn ok_response() -> http::response::Parts {
    let mut parts = http::Response::new(()).into_parts().0;
    parts
        .headers
        .insert("content-type", http::HeaderValue::from_static("text/plain"));
    parts
}

#[test]
fn a_request_is_read_and_its_response_written() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    client.get(1).send(&mut conn).unwrap();
    let Some(Event::Request {
        stream: 1,
        head,
        end_stream: true,
    }) = conn.poll_event()
    else {
        panic!("a request on stream 1");
    };
    assert_eq!(head.parts.uri, "https://example.com/");
    assert_eq!(conn.open_streams(), 1);
    let mut parts = ok_response();
    // Connection-specific fields are not HTTP/2's: left out.
    parts
        .headers
        .insert("connection", http::HeaderValue::from_static("close"));
    conn.send_response(1, &parts, false).unwrap();
    conn.send_data(1, &mut Bytes::from_static(b"hello"), true)
        .unwrap();
    assert_eq!(
        conn.open_streams(),
        0,
        "both sides ended: the stream is gone"
    );
    let seen = client.receive(&mut conn);
    assert!(
        matches!(seen[0], Seen::Other(Frame::Settings(s)) if s.max_concurrent_streams == Some(100))
    );
    assert!(matches!(seen[1], Seen::Other(Frame::SettingsAck)));
    let Seen::Headers {
        stream: 1,
        end_stream: false,
        fields,
    } = &seen[2]
    else {
        panic!("{seen:?}");
    };
    assert_eq!(
        fields,
        &[
            (":status".to_owned(), "200".to_owned()),
            ("content-type".to_owned(), "text/plain".to_owned())
        ]
    );
    assert!(
        matches!(&seen[3], Seen::Other(Frame::Data { stream: 1, end_stream: true, data, .. }) if data == "hello")
    );
    assert_eq!(seen.len(), 4);
    // Nothing is held once the output is written.
    assert_eq!(conn.output_len(), 0);
    assert_eq!(
        conn.send_data(1, &mut Bytes::from_static(b"more"), true),
        Err(SendError::StreamClosed(1))
    );
}

#[test]
fn emptied_queues_are_not_held_and_the_next_connection_takes_them() {
    let mut first = Connection::new(Config::default());
    Client::new().get(1).get(3).send(&mut first).unwrap();
    let events_at = first.events.as_slices().0.as_ptr();
    let streams_at = first.streams.as_ptr();
    assert_eq!(requests(&mut first), [1, 3]);
    assert_eq!(
        first.events.capacity(),
        0,
        "an idle connection holds its event queue"
    );
    for id in [1, 3] {
        first.send_response(id, &ok_response(), true).unwrap();
    }
    assert_eq!(
        first.streams.capacity(),
        0,
        "a connection without streams holds a list"
    );
    let mut second = Connection::new(Config::default());
    Client::new().get(1).send(&mut second).unwrap();
    assert_eq!(
        second.events.as_slices().0.as_ptr(),
        events_at,
        "the spare queue was not reused"
    );
    assert_eq!(
        second.streams.as_ptr(),
        streams_at,
        "the spare list was not reused"
    );
    assert_eq!(requests(&mut second), [1]);
}

#[test]
fn a_request_s_fields_go_into_the_map_the_config_gives() {
    // A map with room that `HeaderMap::new` never starts with: it is the one the hook made.
    let config = Config {
        header_map: |_| HeaderMap::with_capacity(500),
        ..Config::default()
    };
    let mut conn = Connection::new(config);
    let mut client = Client::new();
    // The pooled list of decoded fields is reused from one block to the next: both requests
    // keep only their own fields.
    client
        .headers(1, &post(&[("x-first", "1"), ("x-one", "a")]), true)
        .headers(3, &post(&[("x-second", "2")]), true)
        .send(&mut conn)
        .unwrap();
    let mut heads = Vec::new();
    while let Some(event) = conn.poll_event() {
        if let Event::Request { head, .. } = event {
            heads.push(head);
        }
    }
    assert_eq!(heads.len(), 2);
    for head in &heads {
        assert!(head.parts.headers.capacity() >= 500, "not the hook's map");
    }
    let names = |head: &RequestHead| -> Vec<String> {
        head.parts.headers.keys().map(|k| k.to_string()).collect()
    };
    assert_eq!(names(&heads[0]), ["x-first", "x-one"]);
    assert_eq!(names(&heads[1]), ["x-second"]);
}

#[test]
fn a_map_is_asked_for_no_more_room_than_a_head_starts_with() {
    // A map made for the client's count of fields would be refused past 24,576 (`with_capacity`
    // panics): the hook is asked for no more than a map starts with, and the map grows as the
    // head fills it.
    let config = Config {
        max_header_list_size: 1 << 20,
        header_map: |fields| {
            assert!(fields <= 64, "asked for a map of {fields} fields");
            HeaderMap::with_capacity(fields)
        },
        ..Config::default()
    };
    let mut conn = Connection::new(config);
    let mut client = Client::new();
    // One field indexed, then repeated by its index: a byte on the wire each.
    let mut fields = post(&[]);
    fields.extend(std::iter::repeat_n(("x-a", "1"), 25_000));
    client
        .headers(1, &fields, true)
        .get(3)
        .send(&mut conn)
        .unwrap();
    let mut heads = Vec::new();
    while let Some(event) = conn.poll_event() {
        if let Event::Request { stream, head, .. } = event {
            heads.push((stream, head));
        }
    }
    assert_eq!(heads.len(), 2);
    assert_eq!(heads[0].0, 1);
    assert_eq!(
        heads[0].1.parts.headers.get_all("x-a").iter().count(),
        25_000
    );
    assert_eq!(heads[1].0, 3);
}

#[test]
fn a_body_larger_than_the_clients_window_waits_for_its_updates() {
    // Room enough in the output that only the windows bound what is sent.
    let mut conn = Connection::new(Config {
        max_output: 1 << 20,
        ..Config::default()
    });
    let mut client = Client::new();
    client.get(1).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [1]);
    conn.send_response(1, &ok_response(), false).unwrap();
    let mut body = Bytes::from(vec![7u8; 100_000]);
    conn.send_data(1, &mut body, true).unwrap();
    // 65,535 went, the rest waits; and the output never grew past its bound.
    assert_eq!(body.len(), 100_000 - 65_535);
    let seen = client.receive(&mut conn);
    assert_eq!(data_len(&seen, 1), 65_535);
    assert!(conn.poll_event().is_none());
    // Room on the stream alone is not enough: the connection's window is spent too.
    client
        .frame(kind::WINDOW_UPDATE, 0, 1, &50_000u32.to_be_bytes())
        .send(&mut conn)
        .unwrap();
    assert!(conn.poll_event().is_none());
    client
        .frame(kind::WINDOW_UPDATE, 0, 0, &50_000u32.to_be_bytes())
        .send(&mut conn)
        .unwrap();
    assert!(matches!(
        conn.poll_event(),
        Some(Event::SendReady { stream: 1 })
    ));
    conn.send_data(1, &mut body, true).unwrap();
    assert!(body.is_empty());
    let seen = client.receive(&mut conn);
    assert_eq!(data_len(&seen, 1), 100_000 - 65_535);
    assert!(matches!(
        seen.last(),
        Some(Seen::Other(Frame::Data {
            end_stream: true,
            ..
        }))
    ));
    assert_eq!(conn.open_streams(), 0);
}

#[test]
fn the_output_is_bounded_and_reading_pauses_until_it_is_written() {
    let config = Config {
        max_output: 1000,
        ..Config::default()
    };
    let mut conn = Connection::new(config);
    let mut client = Client::new();
    for i in 0..200u64 {
        client.frame(kind::PING, 0, 0, &i.to_be_bytes());
    }
    client.send(&mut conn).unwrap();
    // Each answer is 17 bytes: reading stopped once they filled the room.
    assert!(conn.wants_write());
    assert!(conn.output_len() < 1000 + 17);
    assert!(!client.wire.is_empty(), "the rest waits in the input");
    let mut answers = 0;
    while !client.wire.is_empty() {
        let seen = client.receive(&mut conn);
        answers += seen
            .iter()
            .filter(|s| matches!(s, Seen::Other(Frame::Ping { ack: true, .. })))
            .count();
        client.send(&mut conn).unwrap();
    }
    let seen = client.receive(&mut conn);
    answers += seen
        .iter()
        .filter(|s| matches!(s, Seen::Other(Frame::Ping { ack: true, .. })))
        .count();
    assert_eq!(answers, 200);
}

#[test]
fn a_request_body_is_handed_on_and_its_credit_given_back() {
    let config = Config {
        initial_stream_window: 32_768,
        ..Config::default()
    };
    let mut conn = Connection::new(config);
    let mut client = Client::new();
    // The client acknowledges the server's SETTINGS: streams get 32 KiB windows.
    client.frame(kind::SETTINGS, flag::ACK, 0, &[]);
    client.headers(1, &post(&[("content-length", "20000")]), false);
    client.frame(kind::DATA, 0, 1, &[1; 10_000]);
    client.frame(kind::DATA, flag::END_STREAM, 1, &[2; 10_000]);
    client.send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [1]);
    client.receive(&mut conn);
    // Events were drained above; the bodies came as two DATA events, released here.
    conn.release(1, 10_000);
    let seen = client.receive(&mut conn);
    // The stream's window update is not sent: its request has ended; the connection's
    // waits for half of its window.
    assert!(seen.is_empty(), "{seen:?}");
    conn.release(1, 10_000);
    let seen = client.receive(&mut conn);
    assert!(seen.is_empty(), "{seen:?}");
    // A second upload, beyond the stream's window: the first 32 KiB are fine, a byte more
    // is a stream error.
    client
        .headers(3, &post(&[("content-length", "40000")]), false)
        .send(&mut conn)
        .unwrap();
    assert_eq!(requests(&mut conn), [3]);
    client.frame(kind::DATA, 0, 3, &[3; 16_384]);
    client.frame(kind::DATA, 0, 3, &[3; 16_384]);
    client.frame(kind::DATA, 0, 3, &[3; 1]);
    client.send(&mut conn).unwrap();
    let mut data = 0;
    let mut reset = None;
    while let Some(event) = conn.poll_event() {
        match event {
            Event::Data { data: d, .. } => data += d.len(),
            Event::Reset { stream, reason } => reset = Some((stream, reason)),
            _ => {}
        }
    }
    assert_eq!(data, 32_768);
    assert_eq!(reset, Some((3, Reason::FLOW_CONTROL_ERROR)));
    let seen = client.receive(&mut conn);
    assert_eq!(resets(&seen), [(3, Reason::FLOW_CONTROL_ERROR)]);
    // The connection's window got the stream's bytes back when it went, and the rest of
    // the first upload's: one update for all of it.
    let update: u32 = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Other(Frame::WindowUpdate {
                stream: 0,
                increment,
            }) => Some(*increment),
            _ => None,
        })
        .sum();
    assert_eq!(update, 20_000 + 32_769);
}

#[test]
fn a_body_that_differs_from_its_content_length_is_malformed() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    let post = post(&[("content-length", "3")]);
    client.headers(1, &post, false);
    client.frame(kind::DATA, flag::END_STREAM, 1, b"ab");
    // No body at all, with a length declared.
    client.headers(3, &post, true);
    client.send(&mut conn).unwrap();
    let seen = client.receive(&mut conn);
    assert_eq!(
        resets(&seen),
        [(1, Reason::PROTOCOL_ERROR), (3, Reason::PROTOCOL_ERROR)]
    );
    // Neither request reached the application: both were refused before it took them.
    assert_eq!(requests(&mut conn), Vec::<u32>::new());
}

#[test]
fn a_malformed_request_resets_its_stream_and_the_tables_stay_in_step() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    // Uppercase names are malformed in HTTP/2; the field is added to both tables all the
    // same.
    let mut fields = GET.to_vec();
    fields.push(("X-Upper", "1"));
    client.headers(1, &fields, true);
    // The next request's block refers to the entries the first one added.
    client.headers(3, GET, true);
    client.send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [3]);
    let seen = client.receive(&mut conn);
    // Answered 400 first (RFC 9113 section 8.1.1 allows it), then reset.
    let answer = seen
        .iter()
        .find(|s| matches!(s, Seen::Headers { stream: 1, .. }))
        .expect("an answer on stream 1");
    assert_eq!(answer.status(), Some("400"));
    assert_eq!(resets(&seen), [(1, Reason::PROTOCOL_ERROR)]);
    assert_eq!(goaway(&seen), None);
}

#[test]
fn streams_over_the_limit_are_refused() {
    let config = Config {
        max_concurrent_streams: 2,
        ..Config::default()
    };
    let mut conn = Connection::new(config);
    let mut client = Client::new();
    client.get(1).get(3).get(5).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [1, 3]);
    let seen = client.receive(&mut conn);
    assert_eq!(resets(&seen), [(5, Reason::REFUSED_STREAM)]);
    // One finishes: there is room again.
    conn.send_response(1, &ok_response(), true).unwrap();
    client.get(7).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [7]);
}

#[test]
fn a_head_over_the_limit_is_answered_431() {
    let config = Config {
        max_header_list_size: 1024,
        ..Config::default()
    };
    let mut conn = Connection::new(config);
    let mut client = Client::new();
    let big = "x".repeat(2000);
    let mut fields = GET.to_vec();
    fields.push(("x-big", &big));
    client.headers(1, &fields, true);
    client.get(3).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [3]);
    let seen = client.receive(&mut conn);
    let refused = seen
        .iter()
        .find(|s| matches!(s, Seen::Headers { stream: 1, .. }))
        .expect("a response on stream 1");
    assert_eq!(refused.status(), Some("431"));
    assert!(matches!(
        refused,
        Seen::Headers {
            end_stream: true,
            ..
        }
    ));
}

#[test]
fn a_rapid_reset_flood_ends_the_connection() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    for i in 0..1000u32 {
        let stream = 2 * i + 1;
        client.get(stream);
        client.frame(kind::RST_STREAM, 0, stream, &Reason::CANCEL.0.to_be_bytes());
    }
    let error = client.send(&mut conn).unwrap_err();
    assert_eq!(error.flood, Some(Flood::Reset));
    assert_eq!(error.reason, Reason::ENHANCE_YOUR_CALM);
    // None of the reset streams reached the application.
    assert_eq!(requests(&mut conn), Vec::<u32>::new());
    let seen = client.receive(&mut conn);
    assert_eq!(goaway(&seen), Some((41, Reason::ENHANCE_YOUR_CALM)));
    assert!(conn.is_done());
}

#[test]
fn streams_the_client_resets_after_they_are_taken_are_reported() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    for i in 0..100u32 {
        let stream = 2 * i + 1;
        client.get(stream).send(&mut conn).unwrap();
        assert_eq!(requests(&mut conn), [stream]);
        client
            .frame(kind::RST_STREAM, 0, stream, &Reason::CANCEL.0.to_be_bytes())
            .send(&mut conn)
            .unwrap();
        assert!(matches!(
            conn.poll_event(),
            Some(Event::Reset {
                reason: Reason::CANCEL,
                ..
            })
        ));
    }
    // 100 premature resets are under Envoy's bound of 500 streams.
    assert_eq!(conn.open_streams(), 0);
    let seen = client.receive(&mut conn);
    assert_eq!(goaway(&seen), None);
}

#[test]
fn a_continuation_flood_ends_the_connection() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    client.frame(kind::HEADERS, flag::END_STREAM, 1, b"\x82\x86\x84");
    for _ in 0..100 {
        client.frame(kind::CONTINUATION, 0, 1, b"\x41");
    }
    let error = client.send(&mut conn).unwrap_err();
    assert_eq!(error.flood, Some(Flood::Continuation));
    let seen = client.receive(&mut conn);
    assert_eq!(goaway(&seen).map(|g| g.1), Some(Reason::ENHANCE_YOUR_CALM));
}

#[test]
fn a_ping_flood_ends_the_connection_unless_responses_flow() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    for i in 0..1001u64 {
        client.frame(kind::PING, 0, 0, &i.to_be_bytes());
        if client.wire.len() > 30_000 {
            let _ = client.send(&mut conn);
            client.receive(&mut conn);
        }
    }
    let error = client.send(&mut conn).unwrap_err();
    assert_eq!(error.flood, Some(Flood::Control));

    // A client that pings between responses (as gRPC clients do) is not cut off.
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    client.send(&mut conn).unwrap();
    for i in 0..1500u32 {
        let stream = 2 * i + 1;
        client
            .get(stream)
            .frame(kind::PING, 0, 0, &u64::from(i).to_be_bytes());
        client.send(&mut conn).unwrap();
        assert_eq!(requests(&mut conn), [stream]);
        conn.send_response(stream, &ok_response(), true).unwrap();
        client.receive(&mut conn);
    }
}

#[test]
fn a_graceful_shutdown_serves_what_was_on_its_way() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    client.get(1).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [1]);
    conn.go_away();
    let seen = client.receive(&mut conn);
    assert_eq!(goaway(&seen), Some((MAX_WINDOW_ID, Reason::NO_ERROR)));
    let Some(Seen::Other(Frame::Ping {
        ack: false,
        payload,
    })) = seen.last()
    else {
        panic!("{seen:?}");
    };
    // A request sent before the client read the GOAWAY is served.
    client.get(3);
    client.frame(kind::PING, flag::ACK, 0, &payload[..]);
    // One sent after the final GOAWAY is not.
    client.get(5).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [3]);
    let seen = client.receive(&mut conn);
    assert_eq!(goaway(&seen), Some((3, Reason::NO_ERROR)));
    assert!(!conn.is_done(), "streams 1 and 3 are still open");
    conn.send_response(1, &ok_response(), true).unwrap();
    conn.send_response(3, &ok_response(), true).unwrap();
    assert!(conn.is_done());
}

const MAX_WINDOW_ID: u32 = crate::frame::MAX_WINDOW;

#[test]
fn what_is_not_http2_is_refused() {
    let mut conn = Connection::new(Config::default());
    let mut input = BytesMut::from(&b"GET / HTTP/1.1\r\nhost: a\r\n\r\n"[..]);
    let error = conn.recv(&mut input, Instant::now()).unwrap_err();
    assert_eq!(error.reason, Reason::PROTOCOL_ERROR);
    assert!(conn.is_done());

    // The preface must be followed by SETTINGS.
    let mut conn = Connection::new(Config::default());
    let mut input = BytesMut::from(&PREFACE[..]);
    frame::encode_ping(false, [0; 8], &mut input);
    assert!(conn.recv(&mut input, Instant::now()).is_err());

    // A preface that comes a byte at a time is waited for.
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    client.get(1);
    let wire = client.wire.split().freeze();
    let mut input = BytesMut::new();
    for byte in wire {
        input.extend_from_slice(&[byte]);
        conn.recv(&mut input, Instant::now()).unwrap();
    }
    assert_eq!(requests(&mut conn), [1]);
}

#[test]
fn frames_on_streams_in_the_wrong_state() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    // DATA on a stream never opened: a connection error.
    client.frame(kind::DATA, 0, 1, b"x");
    assert_eq!(
        client.send(&mut conn).unwrap_err().reason,
        Reason::PROTOCOL_ERROR
    );

    // DATA after the request ended: the stream is reset.
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    client
        .get(1)
        .frame(kind::DATA, 0, 1, b"x")
        .send(&mut conn)
        .unwrap();
    let seen = client.receive(&mut conn);
    assert_eq!(resets(&seen), [(1, Reason::STREAM_CLOSED)]);
    // HEADERS on a lower stream id: a connection error.
    client.get(5).get(3);
    assert_eq!(
        client.send(&mut conn).unwrap_err().reason,
        Reason::PROTOCOL_ERROR
    );
}

#[test]
fn settings_take_effect_as_rfc_9113_says() {
    let config = Config {
        header_table_size: 0,
        initial_stream_window: 1000,
        ..Config::default()
    };
    let mut conn = Connection::new(config);
    let mut client = Client::new();
    // Before the acknowledgement the client may use the default window, 65,535.
    let post = post(&[]);
    client.headers(1, &post, false);
    client.frame(kind::DATA, 0, 1, &[0; 5000]);
    client.send(&mut conn).unwrap();
    // After it, the table must be emptied (a size update first) and the windows are 1,000:
    // stream 1 has spent 5,000 of the 65,535 it had, and is now 4,000 below zero.
    client.frame(kind::SETTINGS, flag::ACK, 0, &[]);
    client.encoder.set_peer_limit(0);
    client.headers(3, &post, false);
    client.frame(kind::DATA, 0, 3, &[0; 1000]);
    client.send(&mut conn).unwrap();
    client.frame(kind::DATA, 0, 1, &[0; 1]);
    client.send(&mut conn).unwrap();
    let seen = client.receive(&mut conn);
    assert_eq!(resets(&seen), [(1, Reason::FLOW_CONTROL_ERROR)]);
    // A block without the size update the smaller table needs ends the connection.
    let mut stale = Client::new();
    let mut conn = Connection::new(Config {
        header_table_size: 0,
        ..Config::default()
    });
    stale.frame(kind::SETTINGS, flag::ACK, 0, &[]);
    stale.headers(1, GET, true);
    assert_eq!(
        stale.send(&mut conn).unwrap_err().reason,
        Reason::COMPRESSION_ERROR
    );
}

#[test]
fn the_clients_settings_shape_what_is_sent() {
    // Room enough in the output that only the windows and frame size bound what is sent.
    let mut conn = Connection::new(Config {
        max_output: 1 << 20,
        ..Config::default()
    });
    let mut client = Client::new();
    // The client's initial window is 10, its frames up to 20,000 bytes.
    let mut settings = BytesMut::new();
    frame::encode_settings(
        &Settings {
            initial_window_size: Some(10),
            max_frame_size: Some(20_000),
            ..Settings::default()
        },
        &mut settings,
    );
    client.wire.extend_from_slice(&settings);
    client.get(1).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [1]);
    conn.send_response(1, &ok_response(), false).unwrap();
    let mut body = Bytes::from(vec![1u8; 100_000]);
    conn.send_data(1, &mut body, true).unwrap();
    assert_eq!(body.len(), 100_000 - 10);
    assert_eq!(conn.send_capacity(1), 0);
    // A larger initial window grows the open stream's too; its frames are at most 20,000.
    let mut settings = BytesMut::new();
    frame::encode_settings(
        &Settings {
            initial_window_size: Some(100_000),
            ..Settings::default()
        },
        &mut settings,
    );
    client.wire.extend_from_slice(&settings);
    client.send(&mut conn).unwrap();
    assert!(matches!(
        conn.poll_event(),
        Some(Event::SendReady { stream: 1 })
    ));
    // The connection's window is still 65,535 less 10.
    conn.send_data(1, &mut body, true).unwrap();
    let seen = client.receive(&mut conn);
    let sizes: Vec<usize> = seen
        .iter()
        .filter_map(|s| match s {
            Seen::Other(Frame::Data { data, .. }) => Some(data.len()),
            _ => None,
        })
        .collect();
    assert_eq!(sizes, [10, 20_000, 20_000, 20_000, 5_525]);
    assert_eq!(body.len(), 100_000 - 65_535);
}

#[test]
fn trailers_end_a_request_and_a_response() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    let post = post(&[]);
    client.headers(1, &post, false);
    client.frame(kind::DATA, 0, 1, b"body");
    client.headers(1, &[("grpc-status", "0")], true);
    client.send(&mut conn).unwrap();
    let events: Vec<Event> = std::iter::from_fn(|| conn.poll_event()).collect();
    assert!(
        matches!(&events[2], Event::Trailers { stream: 1, trailers } if trailers["grpc-status"] == "0")
    );
    conn.send_response(1, &ok_response(), false).unwrap();
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    conn.send_trailers(1, &trailers).unwrap();
    assert_eq!(conn.open_streams(), 0);
    let seen = client.receive(&mut conn);
    assert!(
        matches!(seen.last(), Some(Seen::Headers { end_stream: true, fields, .. }) if fields[0].0 == "grpc-status")
    );
}

#[test]
fn only_young_streams_count_as_premature_resets() {
    let config = || Config {
        floods: FloodLimits {
            premature_reset_streams: 4,
            ..FloodLimits::default()
        },
        ..Config::default()
    };
    let age = FloodLimits::default().premature_reset_age;
    // Streams the client resets once they are older than the age: no flood.
    let mut conn = Connection::new(config());
    let mut client = Client::new();
    let start = Instant::now();
    for i in 0..8u32 {
        let stream = 2 * i + 1;
        let opened = start + age * (2 * i);
        client.get(stream);
        conn.recv(&mut client.wire, opened).unwrap();
        assert_eq!(requests(&mut conn), [stream]);
        client.frame(kind::RST_STREAM, 0, stream, &Reason::CANCEL.0.to_be_bytes());
        conn.recv(&mut client.wire, opened + age + Duration::from_millis(1))
            .unwrap();
        assert!(matches!(conn.poll_event(), Some(Event::Reset { .. })));
    }
    // The same resets at once: the fourth stream makes half of four premature.
    let mut conn = Connection::new(config());
    let mut client = Client::new();
    let mut result = Ok(());
    for i in 0..4u32 {
        let stream = 2 * i + 1;
        client.get(stream);
        conn.recv(&mut client.wire, start).unwrap();
        assert_eq!(requests(&mut conn), [stream]);
        client.frame(kind::RST_STREAM, 0, stream, &Reason::CANCEL.0.to_be_bytes());
        result = conn.recv(&mut client.wire, start);
        if i < 3 {
            assert!(result.is_ok(), "stream {stream}");
        }
    }
    assert_eq!(result.unwrap_err().flood, Some(Flood::Reset));
}

#[test]
fn what_a_client_opens_after_the_final_goaway_is_dropped_quietly() {
    let mut conn = Connection::new(Config::default());
    let mut client = Client::new();
    client.get(1).send(&mut conn).unwrap();
    assert_eq!(requests(&mut conn), [1]);
    conn.go_away();
    conn.finish_drain();
    client.receive(&mut conn);
    // An upload the client began before it heard: its HEADERS, DATA, WINDOW_UPDATE and
    // RST_STREAM are all dropped; the connection and stream 1 go on.
    client.headers(3, &post(&[]), false);
    client.frame(kind::DATA, 0, 3, b"part");
    client.frame(kind::WINDOW_UPDATE, 0, 3, &1u32.to_be_bytes());
    client.frame(kind::RST_STREAM, 0, 3, &Reason::CANCEL.0.to_be_bytes());
    client.send(&mut conn).unwrap();
    assert!(conn.poll_event().is_none());
    let seen = client.receive(&mut conn);
    assert_eq!(resets(&seen), []);
    assert_eq!(goaway(&seen), None);
    // A stream id above any the client used is still idle.
    client.frame(kind::DATA, 0, 5, b"x");
    assert_eq!(
        client.send(&mut conn).unwrap_err().reason,
        Reason::PROTOCOL_ERROR
    );
}

#[test]
fn told_to_go_before_the_client_began_the_connection_closes() {
    let mut conn = Connection::new(Config::default());
    conn.go_away();
    assert!(conn.is_done());
    let mut client = Client::new();
    client.get(1).send(&mut conn).unwrap();
    assert!(conn.poll_event().is_none());
    let seen = client.receive(&mut conn);
    assert_eq!(goaway(&seen), Some((0, Reason::NO_ERROR)));
}
