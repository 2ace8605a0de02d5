//! The examples of RFC 7541 Appendix C, and the limits.

use bytes::{Bytes, BytesMut};

use super::*;

fn hex(text: &str) -> Bytes {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| {
            let text = std::str::from_utf8(pair).expect("ascii");
            u8::from_str_radix(text, 16).expect("hex")
        })
        .collect::<Vec<u8>>()
        .into()
}

fn decode(decoder: &mut Decoder, block: &str) -> Vec<(String, String)> {
    let mut fields = Vec::new();
    decoder
        .decode(&hex(block), 64 * 1024, |f| {
            fields.push((
                String::from_utf8_lossy(&f.name).into_owned(),
                String::from_utf8_lossy(&f.value).into_owned(),
            ))
        })
        .expect("decodes");
    fields
}

fn fields(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
        .collect()
}

const REQUESTS: [&[(&str, &str)]; 3] = [
    &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ],
    &[
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ],
    &[
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/index.html"),
        (":authority", "www.example.com"),
        ("custom-key", "custom-value"),
    ],
];

#[test]
fn requests_without_huffman_coding_c3() {
    let mut decoder = Decoder::new(4096);
    let blocks = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    for (block, expected) in blocks.iter().zip(REQUESTS) {
        assert_eq!(decode(&mut decoder, block), fields(expected));
    }
    assert_eq!(decoder.table_len(), 3);
}

const HUFFMAN_REQUESTS: [&str; 3] = [
    "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
    "8286 84be 5886 a8eb 1064 9cbf",
    "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
];

#[test]
fn requests_with_huffman_coding_c4() {
    let mut decoder = Decoder::new(4096);
    for (block, expected) in HUFFMAN_REQUESTS.iter().zip(REQUESTS) {
        assert_eq!(decode(&mut decoder, block), fields(expected));
    }
    assert_eq!(decoder.table_len(), 3);
}

#[test]
fn the_encoder_writes_the_rfc_blocks_for_the_rfc_requests() {
    let mut encoder = Encoder::new(4096);
    for (expected, request) in HUFFMAN_REQUESTS.iter().zip(REQUESTS) {
        let mut out = BytesMut::new();
        encoder.encode(
            request
                .iter()
                .map(|(n, v)| (n.as_bytes(), v.as_bytes(), false)),
            &mut out,
        );
        assert_eq!(out.freeze(), hex(expected));
    }
}

#[test]
fn integers_with_continuation_bytes_c1() {
    // As table size updates (prefix 001, 5 bits): 1337 is 1f 9a 0a (RFC 7541 C.1.2).
    let mut decoder = Decoder::new(4096);
    assert_eq!(decoder.decode(&hex("3f9a0a"), 1024, |_| {}), Ok(()));
    // 4096 (31 + 0x61 + 0x1f << 7) is the limit itself; 4097 is over it.
    assert_eq!(decoder.decode(&hex("3fe11f"), 1024, |_| {}), Ok(()));
    assert_eq!(
        decoder.decode(&hex("3fe21f"), 1024, |_| {}),
        Err(DecodeError::SizeUpdateOverLimit {
            asked: 4097,
            limit: 4096
        })
    );
}

#[test]
fn blocks_past_the_tables_or_their_end_are_refused() {
    let mut decoder = Decoder::new(4096);
    assert_eq!(
        decoder.decode(&hex("80"), 1024, |_| {}),
        Err(DecodeError::InvalidIndex(0))
    );
    assert_eq!(
        decoder.decode(&hex("be"), 1024, |_| {}),
        Err(DecodeError::InvalidIndex(62))
    );
    // A literal whose value runs past the block.
    assert_eq!(
        decoder.decode(&hex("4005 6e61 6d65 0561"), 1024, |_| {}),
        Err(DecodeError::Truncated)
    );
    // An integer with too many continuation bytes.
    assert_eq!(
        decoder.decode(&hex("ff ff ff ff ff 7f"), 1024, |_| {}),
        Err(DecodeError::IntegerOverflow)
    );
    // A size update after a field.
    assert_eq!(
        decoder.decode(&hex("82 20"), 1024, |_| {}),
        Err(DecodeError::SizeUpdateNotFirst)
    );
    assert!(DecodeError::SizeUpdateNotFirst.is_connection_error());
}

#[test]
fn a_list_over_the_limit_is_refused_and_the_table_stays_in_step() {
    let mut decoder = Decoder::new(4096);
    // custom-key: custom-value (54 bytes) added to the table, then :method GET (42).
    let block = hex("400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65 82");
    let mut seen = 0;
    assert_eq!(
        decoder.decode(&block, 60, |_| seen += 1),
        Err(DecodeError::HeaderListTooLarge { limit: 60 })
    );
    assert_eq!(seen, 1);
    assert!(!DecodeError::HeaderListTooLarge { limit: 60 }.is_connection_error());
    // The entry was added all the same: the next block can refer to it.
    assert_eq!(
        decode(&mut decoder, "be"),
        fields(&[("custom-key", "custom-value")])
    );
}

#[test]
fn a_repeated_reference_is_bounded_by_the_list_size() {
    // An HPACK bomb: one 4,000-byte entry, referred to again and again by one-byte indices.
    let mut encoder_side = BytesMut::new();
    let value = vec![b'a'; 4000];
    let mut encoder = Encoder::new(8192);
    encoder.set_peer_limit(8192);
    encoder.encode([(&b"x-big"[..], &value[..], false)], &mut encoder_side);
    let mut decoder = Decoder::new(8192);
    let mut block = encoder_side.to_vec();
    block.extend(std::iter::repeat_n(0xbe, 10_000));
    let mut handed = 0usize;
    let result = decoder.decode(&Bytes::from(block), 16 * 1024, |f| handed += f.size());
    assert_eq!(
        result,
        Err(DecodeError::HeaderListTooLarge { limit: 16 * 1024 })
    );
    assert!(handed <= 16 * 1024, "{handed} bytes handed on");
}

#[test]
fn a_smaller_table_is_announced_and_must_be_heard() {
    let mut encoder = Encoder::new(4096);
    let mut decoder = Decoder::new(4096);
    let mut block = BytesMut::new();
    encoder.encode([(&b"x-a"[..], &b"1"[..], false)], &mut block);
    decoder
        .decode(&block.split().freeze(), 1024, |_| {})
        .expect("decodes");
    assert_eq!(decoder.table_len(), 1);

    // This side lowers its limit to 0 (once acknowledged): a block that does not start
    // with the update is refused.
    decoder.set_limit(0);
    let mut stale = Decoder::new(4096);
    stale.set_limit(0);
    assert_eq!(
        stale.decode(&hex("82"), 1024, |_| {}),
        Err(DecodeError::SizeUpdateMissing)
    );
    // The encoder told of it starts its next block with the update.
    encoder.set_peer_limit(0);
    encoder.encode([(&b"x-a"[..], &b"1"[..], false)], &mut block);
    assert_eq!(block[0], 0x20);
    let mut seen = Vec::new();
    decoder
        .decode(&block.freeze(), 1024, |f| seen.push(f.value))
        .expect("decodes");
    assert_eq!(seen, [&b"1"[..]]);
    assert_eq!(decoder.table_len(), 0);
}

#[test]
fn credentials_are_never_indexed_and_say_so() {
    let mut encoder = Encoder::new(4096);
    let mut block = BytesMut::new();
    encoder.encode(
        [
            (&b"authorization"[..], &b"Bearer secret"[..], false),
            (b"x-token", b"t", true),
        ],
        &mut block,
    );
    let mut decoder = Decoder::new(4096);
    let mut never = Vec::new();
    decoder
        .decode(&block.freeze(), 1024, |f| never.push(f.never_indexed))
        .expect("decodes");
    assert_eq!(never, [true, true]);
    assert_eq!(decoder.table_len(), 0);
}

#[test]
fn a_date_written_again_is_the_literal_coded_afresh() {
    let block_for = |date: &str| {
        let mut block = BytesMut::new();
        Encoder::new(4096).encode(
            [
                (&b":status"[..], &b"200"[..], false),
                (b"date", date.as_bytes(), false),
            ],
            &mut block,
        );
        block.freeze()
    };
    let first = "Mon, 21 Oct 2013 20:13:21 GMT";
    let next = "Mon, 21 Oct 2013 20:13:22 GMT";
    let long = "Mon, 21 Oct 2013 20:13:21 GMT and then some more";
    // Coded afresh (a value this thread has not written last), then copied, then coded
    // afresh again after another value: the same bytes each time.
    let fresh = block_for(first);
    assert_eq!(block_for(first), fresh);
    let other = block_for(next);
    assert_ne!(other, fresh);
    assert_eq!(block_for(first), fresh);
    assert_eq!(block_for(next), other);
    // Huffman-coded (the literal's H bit), as `string` writes a shorter coding.
    assert_eq!(fresh[3] & 0x80, 0x80, "{fresh:?}");
    for (date, block) in [(first, fresh), (next, other), (long, block_for(long))] {
        let mut decoder = Decoder::new(4096);
        let mut got = Vec::new();
        decoder
            .decode(&block, 1024, |f| {
                got.push((
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                ))
            })
            .expect("decodes");
        assert_eq!(got, fields(&[(":status", "200"), ("date", date)]));
        assert_eq!(decoder.table_len(), 0, "a date is not indexed");
    }
}

#[test]
fn an_empty_date_first_on_a_thread_is_still_written() {
    // A thread of its own: its kept date is the empty one it starts with. Marked sensitive,
    // as a plain empty date is the static table's field 33 and written as its index.
    let block = std::thread::spawn(|| {
        let mut block = BytesMut::new();
        Encoder::new(4096).encode([(&b"date"[..], &b""[..], true)], &mut block);
        block.freeze()
    })
    .join()
    .expect("the encoding thread");
    // `date` by its static name (33, never indexed), then the empty literal.
    assert_eq!(&block[..], [0x1f, 0x12, 0x00]);
    let mut decoder = Decoder::new(4096);
    let mut got = Vec::new();
    decoder
        .decode(&block, 1024, |f| {
            got.push((f.name.clone(), f.value.clone()))
        })
        .expect("decodes");
    assert_eq!(got, [(Bytes::from_static(b"date"), Bytes::new())]);
}

/// Each block read back by one decoder, as a connection's peer reads them in turn: the
/// fields, and whether each was marked never to be indexed.
fn read_back(decoder: &mut Decoder, block: &Bytes) -> Vec<(String, String, bool)> {
    let mut got = Vec::new();
    decoder
        .decode(block, 64 * 1024, |f| {
            got.push((
                String::from_utf8_lossy(&f.name).into_owned(),
                String::from_utf8_lossy(&f.value).into_owned(),
                f.never_indexed,
            ))
        })
        .expect("decodes");
    got
}

#[test]
fn fields_repeated_in_place_are_written_by_the_index_they_had() {
    let mut encoder = Encoder::new(4096);
    let mut decoder = Decoder::new(4096);
    let mut write = |fields: &[(&str, &str, bool)]| {
        let mut block = BytesMut::new();
        encoder.encode(
            fields
                .iter()
                .map(|(n, v, s)| (n.as_bytes(), v.as_bytes(), *s)),
            &mut block,
        );
        let block = block.freeze();
        let expected: Vec<_> = fields
            .iter()
            .map(|(n, v, s)| ((*n).to_owned(), (*v).to_owned(), *s))
            .collect();
        assert_eq!(read_back(&mut decoder, &block), expected, "{fields:?}");
        block
    };
    let response = [
        (":status", "200", false),
        ("content-type", "text/plain", false),
        ("x-a", "1", false),
        ("content-length", "100", false),
    ];
    let first = write(&response);
    // The first block put content-type (now 63) and x-a (62) in the table; the next ones
    // refer to both, and to :status 200 (static 8), by index, the same bytes each time.
    let second = write(&response);
    assert_ne!(second, first);
    assert_eq!(&second[..3], [0x88, 0x80 | 63, 0x80 | 62]);
    assert_eq!(write(&response), second);
    // The same fields elsewhere in the block are found all the same.
    let moved = write(&[
        ("x-a", "1", false),
        (":status", "200", false),
        ("content-type", "text/plain", false),
    ]);
    assert_eq!(&moved[..], [0x80 | 62, 0x88, 0x80 | 63]);
    // A new entry moves the others along: a place's old index now names another field, and
    // the field is looked for afresh.
    write(&[("x-b", "2", false)]);
    let after = write(&[
        ("x-a", "1", false),
        (":status", "200", false),
        ("content-type", "text/plain", false),
    ]);
    assert_eq!(&after[..], [0x80 | 63, 0x88, 0x80 | 64]);
    // Marked sensitive where it was indexed before: never indexed, and said so.
    write(&[("x-a", "1", true), (":status", "200", false)]);
}
