//! Allocations per proxied HTTP/1.1 request, counted over the whole process: a real server
//! (one worker), a keep-alive client and an upstream on threads of their own that do not
//! allocate while they are counted. What the process allocates meanwhile is its periodic work
//! (the overload manager's and the cluster monitor's ticks), about 200 allocations a second
//! here whatever the load. One allocation per request would be 20,000, one per request with a
//! body 10,000: the bound of 5,000 tells them apart on a machine many times slower.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use proxy_core::{Config, Server};

#[global_allocator]
static GLOBAL: alloc_meter::Counting = alloc_meter::Counting;

const RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: text/plain\r\n\r\nhello";

/// Answers every request on its connections with `RESPONSE`, from a fixed buffer.
fn upstream(listener: TcpListener, stop: Arc<AtomicBool>) {
    let mut buf = [0u8; 4096];
    while let Ok((mut conn, _)) = listener.accept() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut filled = 0;
        while let Ok(n) = conn.read(&mut buf[filled..]) {
            if n == 0 {
                break;
            }
            filled += n;
            while let Some(head) = find_head_end(&buf[..filled]) {
                let end = head + body_length(&buf[..head]);
                if filled < end {
                    break;
                }
                if conn.write_all(RESPONSE).is_err() {
                    return;
                }
                buf.copy_within(end..filled, 0);
                filled -= end;
            }
            if filled == buf.len() {
                break;
            }
        }
    }
}

/// The body's length, for the requests this test sends.
fn body_length(head: &[u8]) -> usize {
    if head.windows(18).any(|w| w == b"content-length: 11") {
        11
    } else {
        0
    }
}

fn find_head_end(bytes: &[u8]) -> Option<usize> {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|at| at + 4)
}

const REQUESTS: [&[u8]; 2] = [
    b"GET /api/v1/users/12345/orders HTTP/1.1\r\nhost: bench.test\r\nuser-agent: test\r\naccept: */*\r\n\r\n",
    b"POST /api/v1/orders HTTP/1.1\r\nhost: bench.test\r\ncontent-type: text/plain\r\ncontent-length: 11\r\n\r\nhello world",
];

/// One request on the client's connection (a GET or a POST with a body), its whole response
/// read into `buf`.
fn request(conn: &mut TcpStream, buf: &mut [u8], index: usize) -> usize {
    conn.write_all(REQUESTS[index % 2])
        .expect("request written");
    let mut filled = 0;
    loop {
        let n = conn.read(&mut buf[filled..]).expect("response read");
        assert!(n > 0, "the proxy closed the connection");
        filled += n;
        if let Some(end) = find_head_end(&buf[..filled])
            && filled >= end + 5
        {
            assert!(buf.starts_with(b"HTTP/1.1 200 "), "not a 200");
            return filled;
        }
    }
}

#[test]
fn a_warm_worker_relays_a_request_without_allocating() {
    let upstream_listener = TcpListener::bind("127.0.0.1:0").expect("upstream bound");
    let upstream_address = upstream_listener.local_addr().expect("address");
    let stop = Arc::new(AtomicBool::new(false));
    let upstream_thread = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || upstream(upstream_listener, stop))
    };
    let config = Config::from_yaml(&format!(
        "admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ prefix: / }}
        cluster: origin
clusters:
  - name: origin
    endpoints: [{upstream_address}]
    protocol: http1
"
    ))
    .expect("config");
    let server = Server::start(config, 1).expect("server started");
    let (_, address) = server.addresses()[0];
    let mut conn = TcpStream::connect(address).expect("connected");
    let mut buf = [0u8; 4096];
    for index in 0..2_000 {
        request(&mut conn, &mut buf, index);
    }
    const COUNTED: u64 = 20_000;
    let before = alloc_meter::allocations_all_threads();
    for index in 0..COUNTED as usize {
        request(&mut conn, &mut buf, index);
    }
    let allocations = alloc_meter::allocations_all_threads() - before;
    eprintln!("{allocations} allocations in {COUNTED} requests");

    conn.shutdown(Shutdown::Both).ok();
    drop(conn);
    server.drain_and_join();
    stop.store(true, Ordering::Relaxed);
    // Wakes the upstream's accept so that it sees `stop`.
    drop(TcpStream::connect(upstream_address));
    upstream_thread.join().expect("upstream thread");
    assert!(
        allocations < COUNTED / 4,
        "{allocations} allocations in {COUNTED} requests"
    );
}
