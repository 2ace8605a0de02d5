//! What reading a request's HEADERS costs with the http2 crate beside the h2 crate (under
//! hyper, and so under the proxy's HTTP/2 today): a connection's first two requests, as a
//! browser sends them (the second mostly indexed), from bytes to method, URI and header map.
//! And what writing a response head costs with the http2 crate's encoder.

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use criterion::{Criterion, criterion_group, criterion_main};
use futures_core::Stream;
use http2::frame::{self, BlockAssembler, Frame};
use http2::hpack::{Decoder, Encoder};

const REQUEST: [(&str, &str); 12] = [
    (":method", "GET"),
    (":scheme", "https"),
    (":authority", "www.example.com"),
    (":path", "/assets/app.js?v=3"),
    (
        "sec-ch-ua",
        "\"Chromium\";v=\"131\", \"Not_A Brand\";v=\"24\"",
    ),
    ("sec-ch-ua-mobile", "?0"),
    (
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
    ),
    ("accept", "*/*"),
    ("sec-fetch-site", "same-origin"),
    ("referer", "https://www.example.com/"),
    ("accept-encoding", "gzip, deflate, br, zstd"),
    ("accept-language", "en-US,en;q=0.9"),
];

/// Two HEADERS frames of the request above (the second with another path), as one encoder
/// writes them on one connection.
fn two_requests() -> Bytes {
    let mut encoder = Encoder::new(4096);
    let mut wire = BytesMut::new();
    for (stream, path) in [(1, "/assets/app.js?v=3"), (3, "/assets/app.css?v=3")] {
        let mut block = BytesMut::new();
        encoder.encode(
            REQUEST.iter().map(|&(n, v)| {
                let v = if n == ":path" { path } else { v };
                (n.as_bytes(), v.as_bytes(), false)
            }),
            &mut block,
        );
        frame::encode_header_block(stream, &block.freeze(), true, 16_384, &mut wire);
    }
    wire.freeze()
}

fn read_ours(wire: &Bytes) -> usize {
    let mut buf = BytesMut::from(&wire[..]);
    let mut assembler = BlockAssembler::new(16 * 1024, 16_384);
    let mut decoder = Decoder::new(4096);
    let mut headers = 0;
    while let Ok(Some(frame)) = frame::decode(&mut buf, 16_384) {
        if let Ok(Some(Frame::Headers { fragment, .. })) = assembler.push(frame) {
            let mut fields = Vec::with_capacity(16);
            if decoder
                .decode(&fragment, 16 * 1024, |f| fields.push(f))
                .is_ok()
                && let Ok(head) = http2::head::request(fields, false)
            {
                headers += head.parts.headers.len();
            }
        }
    }
    headers
}

fn read_h2(wire: &Bytes) -> usize {
    let io = std::io::Cursor::new(wire.to_vec());
    let mut codec: h2::Codec<_, Bytes> = h2::Codec::new(io);
    let mut cx = Context::from_waker(Waker::noop());
    let mut headers = 0;
    while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut codec).poll_next(&mut cx) {
        if let h2::frame::Frame::Headers(frame) = frame {
            // What h2's server does next: the pseudo-header fields made into a URI.
            let (pseudo, fields) = frame.into_parts();
            let uri = http::Uri::builder()
                .scheme(pseudo.scheme.as_deref().unwrap_or("https"))
                .authority(pseudo.authority.as_deref().unwrap_or(""))
                .path_and_query(pseudo.path.as_deref().unwrap_or("/"))
                .build();
            if uri.is_ok() {
                headers += fields.len();
            }
        }
    }
    headers
}

fn read_headers(c: &mut Criterion) {
    let wire = two_requests();
    assert_eq!(
        read_ours(&wire),
        read_h2(&wire),
        "both read the same fields"
    );
    let mut group = c.benchmark_group("h2_read_two_requests");
    group.bench_function("http2", |b| b.iter(|| read_ours(black_box(&wire))));
    group.bench_function("h2", |b| b.iter(|| read_h2(black_box(&wire))));
    group.finish();
}

fn write_response(c: &mut Criterion) {
    let fields: [(&[u8], &[u8], bool); 5] = [
        (b":status", b"200", false),
        (b"content-type", b"application/javascript", false),
        (b"content-length", b"48213", false),
        (b"cache-control", b"public, max-age=31536000", false),
        (b"date", b"Sat, 05 Dec 2026 22:00:00 GMT", false),
    ];
    let mut encoder = Encoder::new(4096);
    let mut out = BytesMut::with_capacity(256);
    c.bench_function("h2_write_response_head/http2", |b| {
        b.iter(|| {
            out.clear();
            encoder.encode(black_box(fields), &mut out);
            frame::encode_header_block(1, &out.split().freeze(), false, 16_384, &mut out);
            out.len()
        })
    });
}

criterion_group!(benches, read_headers, write_response);
criterion_main!(benches);
