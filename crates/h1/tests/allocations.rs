//! What parsing a head allocates, watched by a counting global allocator: nothing, once the
//! thread is warm, whatever the head's number of fields. Header maps come from the thread's
//! pool, header names from its cache, and the head's copy from its chunk of copies, which is
//! reused once the heads cut from it are gone.

#![allow(clippy::unwrap_used)]

use bytes::BytesMut;

#[global_allocator]
static GLOBAL: alloc_meter::Counting = alloc_meter::Counting;

const REQUEST: &[u8] = b"GET /api/v1/users/12345/orders?page=2 HTTP/1.1\r\n\
Host: api.example.com\r\n\
User-Agent: curl/8.5.0\r\n\
Accept: */*\r\n\
Accept: application/json\r\n\
X-Request-Id: 0f8e2b7a-6c1d-4f3e-9a5b-2d7c8e1f0a9b\r\n\
x-forwarded-for: 192.0.2.1\r\n\
X-Custom-Tenant: acme\r\n\
traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n\
Cookie: session=abc\r\n\
\r\n";

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\n\
Content-Type: application/json\r\n\
Content-Length: 2\r\n\
Date: Tue, 24 Nov 2026 12:00:00 GMT\r\n\
X-Served-By: backend-7\r\n\
x-envoy-upstream-service-time: 3\r\n\
Server-Timing: db;dur=1.2\r\n\
\r\nok";

#[test]
fn a_warm_worker_parses_heads_without_allocating() {
    // The meter works.
    assert!(alloc_meter::allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))) > 0);

    const HEADS: u64 = 1000;
    let mut buf = BytesMut::with_capacity(4096);
    let mut request = || {
        buf.clear();
        buf.extend_from_slice(REQUEST);
        let head = h1::parse_request(&mut buf, 8192).unwrap().unwrap();
        assert_eq!(head.request.headers().len(), 9);
        h1::recycle_header_map(head.request.into_parts().0.headers);
    };
    // Warm: past the first chunk, so that the count starts on one being reused.
    (0..100).for_each(|_| request());
    let counted = alloc_meter::allocations_during(|| (0..HEADS).for_each(|_| request()));
    assert_eq!(counted, 0, "request heads");

    let mut buf = BytesMut::with_capacity(4096);
    let mut response = || {
        buf.clear();
        buf.extend_from_slice(RESPONSE);
        let head = h1::client::parse_response(&mut buf, 8192, false)
            .unwrap()
            .unwrap();
        assert_eq!(head.parts.headers.len(), 6);
        assert_eq!(&buf[..], b"ok");
        h1::recycle_header_map(head.parts.headers);
    };
    (0..100).for_each(|_| response());
    let counted = alloc_meter::allocations_during(|| (0..HEADS).for_each(|_| response()));
    assert_eq!(counted, 0, "response heads");
}
