//! An HTTP/2 (h2c, prior knowledge) server on `crates/http2`'s connection, one task per
//! connection: it answers every request 200 with the request's body echoed back (`hello`
//! when it had none; N bytes for `/bytes/N`), each after 20 ms, as an upstream would. For
//! conformance suites and interop tests:
//!
//! ```text
//! cargo run --release -p http2 --example echo_server -- 127.0.0.1:8080
//! ```

use std::collections::{HashMap, VecDeque};
use std::io::IoSlice;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http2::frame::Reason;
use http2::server::{Config, Connection, Event};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// How long each response takes, as if it came from an upstream.
const THINK: Duration = Duration::from_millis(20);

#[allow(dead_code)]
#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:8080".to_owned());
    let listener = TcpListener::bind(&addr).await?;
    eprintln!("listening on {}", listener.local_addr()?);
    loop {
        let (socket, _) = listener.accept().await?;
        tokio::spawn(async move {
            if let Err(error) = serve(socket, Config::default()).await {
                eprintln!("connection: {error}");
            }
        });
    }
}

/// A response on its way: the body left to send.
struct Pending {
    body: Bytes,
}

/// Serves one connection to its end.
pub async fn serve(mut socket: TcpStream, config: Config) -> std::io::Result<()> {
    // Frames go out as they are made, as a proxy's do.
    socket.set_nodelay(true)?;
    let mut conn = Connection::new(config);
    let mut input = BytesMut::new();
    // Request bodies being gathered, and response bodies being sent.
    let mut uploads: HashMap<u32, BytesMut> = HashMap::new();
    let mut sending: HashMap<u32, Pending> = HashMap::new();
    // Responses due, in order.
    let mut due: VecDeque<(Instant, u32, Bytes)> = VecDeque::new();
    let mut paused = false;
    loop {
        while let Some(event) = conn.poll_event() {
            match event {
                Event::Request {
                    stream,
                    head,
                    end_stream,
                } => {
                    let path = head.parts.uri.path().to_owned();
                    let at = Instant::now() + THINK;
                    if let Some(n) = path.strip_prefix("/bytes/") {
                        let n: usize = n.parse().unwrap_or(0);
                        due.push_back((at, stream, Bytes::from(vec![b'x'; n])));
                    } else if end_stream {
                        due.push_back((at, stream, Bytes::from_static(b"hello")));
                    } else {
                        uploads.insert(stream, BytesMut::new());
                    }
                }
                Event::Data {
                    stream,
                    data,
                    end_stream,
                } => {
                    conn.release(stream, data.len() as u32);
                    if let Some(upload) = uploads.get_mut(&stream) {
                        upload.extend_from_slice(&data);
                    }
                    if end_stream && let Some(upload) = uploads.remove(&stream) {
                        due.push_back((Instant::now() + THINK, stream, upload.freeze()));
                    }
                }
                Event::Trailers { stream, .. } => {
                    if let Some(upload) = uploads.remove(&stream) {
                        due.push_back((Instant::now() + THINK, stream, upload.freeze()));
                    }
                }
                Event::Reset { stream, .. } => {
                    uploads.remove(&stream);
                    sending.remove(&stream);
                }
                Event::SendReady { stream } => {
                    if let Some(mut pending) = sending.remove(&stream) {
                        let _ = conn.send_data(stream, &mut pending.body, true);
                        if !pending.body.is_empty() {
                            sending.insert(stream, pending);
                        }
                    }
                }
                Event::Pong { .. } | Event::GoAway { .. } => {}
            }
        }
        while conn.output_len() > 0 {
            let mut slices = [IoSlice::new(&[]); 64];
            let n = conn.output(&mut slices);
            let written = socket.write_vectored(&slices[..n]).await?;
            if written == 0 {
                return Ok(());
            }
            conn.advance_output(written);
        }
        if conn.is_done() {
            return linger(socket).await;
        }
        if conn.has_events() {
            // Writing made room for streams waiting to send.
            continue;
        }
        // Frames left by a read that paused for the output are read before more come.
        if !paused {
            input.reserve(16 * 1024);
            let next = due.front().map(|d| d.0);
            tokio::select! {
                read = socket.read_buf(&mut input) => {
                    if read? == 0 {
                        return Ok(());
                    }
                }
                () = sleep_until(next) => {
                    while let Some(&(at, stream, _)) = due.front() && at <= Instant::now() {
                        let body = due.pop_front().map(|d| d.2).unwrap_or_default();
                        respond(&mut conn, &mut sending, stream, body);
                    }
                    continue;
                }
            }
        }
        if let Err(error) = conn.recv(&mut input, Instant::now().into_std()) {
            eprintln!("connection error: {error}");
        }
        paused = conn.wants_write();
    }
}

/// Closes the sending side, then reads what the client still sends until it closes too (or a
/// second passes): closing with bytes unread would reset the connection, and the client
/// could lose the last frames written.
async fn linger(mut socket: TcpStream) -> std::io::Result<()> {
    socket.shutdown().await?;
    let mut sink = [0u8; 4096];
    let drain = async {
        while socket.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn respond(
    conn: &mut Connection,
    sending: &mut HashMap<u32, Pending>,
    stream: u32,
    mut body: Bytes,
) {
    let mut head = http::Response::new(()).into_parts().0;
    head.headers.insert(
        http::header::CONTENT_LENGTH,
        http::HeaderValue::from(body.len()),
    );
    if conn.send_response(stream, &head, body.is_empty()).is_err() {
        return;
    }
    if body.is_empty() {
        return;
    }
    if conn.send_data(stream, &mut body, true).is_err() {
        conn.reset(stream, Reason::INTERNAL_ERROR);
        return;
    }
    if !body.is_empty() {
        sending.insert(stream, Pending { body });
    }
}
