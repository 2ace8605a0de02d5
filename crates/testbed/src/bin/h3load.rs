//! A load client for HTTP/3 (quinn and h3), and for HTTP/2 over TLS (hyper and rustls) to
//! compare it with: the same loop, the same measure, one client core.
//!
//! ```text
//! h3load ADDR [--proto h3|h2] [--server-name NAME] [--path /] [-c CONNECTIONS] [-m STREAMS]
//!        [--duration SECONDS] [--rate PER_SECOND] [--handshakes | --idle]
//! ```
//!
//! - Load (the default): `-c` connections with `-m` streams each. Without `--rate` each stream
//!   sends its next request when its last is answered (saturation); with it, requests are due
//!   at that rate in all, each timed from when it was due (a late request counts its wait).
//! - `--handshakes`: `-c` loops each making a new connection, one request on it, closing it.
//! - `--idle`: `-c` connections, one request each, then `ready` on stderr, then nothing for
//!   `--duration`: for the memory an idle connection holds.
//!
//! Prints one JSON line: requests answered, failures, seconds, the rate, and latency
//! percentiles in microseconds. Certificates are not checked (loopback benchmarks only).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Buf;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;

#[derive(Clone, Copy, PartialEq)]
enum Proto {
    H3,
    H2,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Load,
    Handshakes,
    Idle,
}

struct Args {
    addr: SocketAddr,
    proto: Proto,
    server_name: String,
    path: String,
    connections: usize,
    streams: usize,
    duration: Duration,
    rate: Option<u64>,
    mode: Mode,
}

fn parse() -> Result<Args, String> {
    let mut args = std::env::args().skip(1);
    let mut parsed = Args {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        proto: Proto::H3,
        server_name: "localhost".into(),
        path: "/".into(),
        connections: 1,
        streams: 1,
        duration: Duration::from_secs(5),
        rate: None,
        mode: Mode::Load,
    };
    let mut addr = None;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value"));
        let number = |text: String, name: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("{name} takes a number, not {text}"))
        };
        match arg.as_str() {
            "--proto" => {
                parsed.proto = match value("--proto")?.as_str() {
                    "h3" => Proto::H3,
                    "h2" => Proto::H2,
                    other => return Err(format!("--proto takes h3 or h2, not {other}")),
                }
            }
            "--server-name" => parsed.server_name = value("--server-name")?,
            "--path" => parsed.path = value("--path")?,
            "-c" => parsed.connections = number(value("-c")?, "-c")? as usize,
            "-m" => parsed.streams = number(value("-m")?, "-m")? as usize,
            "--duration" => {
                parsed.duration = Duration::from_secs(number(value("--duration")?, "--duration")?)
            }
            "--rate" => parsed.rate = Some(number(value("--rate")?, "--rate")?),
            "--handshakes" => parsed.mode = Mode::Handshakes,
            "--idle" => parsed.mode = Mode::Idle,
            other if addr.is_none() && !other.starts_with('-') => {
                addr = Some(
                    other
                        .parse()
                        .map_err(|_| format!("expected HOST:PORT, not {other}"))?,
                )
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    parsed.addr = addr.ok_or("usage: h3load ADDR [options]")?;
    if parsed.connections == 0 || parsed.streams == 0 || parsed.rate == Some(0) {
        return Err("-c, -m and --rate must be above 0".into());
    }
    if !parsed.addr.ip().is_loopback() {
        return Err("loopback addresses only".into());
    }
    Ok(parsed)
}

fn tls(alpn: &[u8]) -> Result<rustls::ClientConfig, String> {
    testbed::h3_client::insecure_client_tls(alpn).map_err(|e| e.to_string())
}

/// A connection that sends one request at a time per clone.
#[derive(Clone)]
enum Sender {
    H3(testbed::h3_client::H3Sender),
    H2(hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>),
}

/// What connecting needs, made once.
struct Dialer {
    quic: Option<testbed::h3_client::H3Client>,
    tls: Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    server_name: String,
    uri: http::Uri,
}

impl Dialer {
    fn new(args: &Args) -> Result<Self, String> {
        let uri: http::Uri = format!("https://{}{}", args.server_name, args.path)
            .parse()
            .map_err(|e| format!("bad path: {e}"))?;
        let quic = match args.proto {
            Proto::H3 => Some(testbed::h3_client::H3Client::new(
                args.addr,
                &args.server_name,
                None,
            )?),
            Proto::H2 => None,
        };
        Ok(Self {
            quic,
            tls: Arc::new(tls(b"h2")?),
            addr: args.addr,
            server_name: args.server_name.clone(),
            uri,
        })
    }

    async fn connect(&self) -> Result<Sender, String> {
        match &self.quic {
            Some(quic) => Ok(Sender::H3(quic.connect().await?)),
            None => {
                let tcp = tokio::net::TcpStream::connect(self.addr)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = tcp.set_nodelay(true);
                let name =
                    ServerName::try_from(self.server_name.clone()).map_err(|e| e.to_string())?;
                let stream = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls))
                    .connect(name, tcp)
                    .await
                    .map_err(|e| e.to_string())?;
                let (sender, connection) = hyper::client::conn::http2::handshake(
                    TokioExecutor::new(),
                    TokioIo::new(stream),
                )
                .await
                .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                Ok(Sender::H2(sender))
            }
        }
    }

    /// One GET, its body read to the end: its status.
    async fn request(&self, sender: &mut Sender) -> Result<u16, String> {
        match sender {
            Sender::H3(sender) => {
                let request = http::Request::get(self.uri.clone())
                    .body(())
                    .map_err(|e| e.to_string())?;
                let mut stream = sender
                    .send_request(request)
                    .await
                    .map_err(|e| e.to_string())?;
                testbed::h3_client::finish(&mut stream)
                    .await
                    .map_err(|e| e.to_string())?;
                let response = stream.recv_response().await.map_err(|e| e.to_string())?;
                while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
                    chunk.advance(chunk.remaining());
                }
                Ok(response.status().as_u16())
            }
            Sender::H2(sender) => {
                let request = http::Request::get(self.uri.clone())
                    .body(Empty::new())
                    .map_err(|e| e.to_string())?;
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = response.status().as_u16();
                response
                    .into_body()
                    .collect()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(status)
            }
        }
    }
}

#[derive(Default)]
struct Tally {
    answered: AtomicU64,
    failed: AtomicU64,
    not_2xx: AtomicU64,
}

impl Tally {
    fn count(&self, result: &Result<u16, String>) {
        match result {
            Ok(status) => {
                self.answered.fetch_add(1, Ordering::Relaxed);
                if !(200..300).contains(status) {
                    self.not_2xx.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(error) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("first failure: {error}");
                }
            }
        }
    }
}

/// Microseconds at `q` of sorted `values`.
fn percentile(values: &[u64], q: f64) -> u64 {
    if values.is_empty() {
        return 0;
    }
    let at = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len()) - 1;
    values[at]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(error) => {
            eprintln!("h3load: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let dialer = match Dialer::new(&args) {
        Ok(dialer) => Arc::new(dialer),
        Err(error) => {
            eprintln!("h3load: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let latencies = match args.mode {
        Mode::Load => load(&args, &dialer, &tally).await,
        Mode::Handshakes => handshakes(&args, &dialer, &tally).await,
        Mode::Idle => idle(&args, &dialer, &tally).await,
    };
    let Some(mut latencies) = latencies else {
        return std::process::ExitCode::FAILURE;
    };
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let answered = tally.answered.load(Ordering::Relaxed);
    let measured = if args.mode == Mode::Idle {
        seconds
    } else {
        args.duration.as_secs_f64()
    };
    println!(
        "{{\"answered\":{answered},\"failed\":{},\"not_2xx\":{},\"seconds\":{seconds:.3},\"per_second\":{:.1},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"max_us\":{}}}",
        tally.failed.load(Ordering::Relaxed),
        tally.not_2xx.load(Ordering::Relaxed),
        answered as f64 / measured,
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        percentile(&latencies, 0.999),
        latencies.last().copied().unwrap_or(0),
    );
    if let Some(quic) = &dialer.quic {
        quic.close().await;
    }
    std::process::ExitCode::SUCCESS
}

/// `-c` connections of `-m` streams until `--duration` is up; latencies in microseconds.
async fn load(args: &Args, dialer: &Arc<Dialer>, tally: &Arc<Tally>) -> Option<Vec<u64>> {
    let mut senders = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        match dialer.connect().await {
            Ok(sender) => senders.push(sender),
            Err(error) => {
                eprintln!("h3load: cannot connect: {error}");
                return None;
            }
        }
    }
    let start = Instant::now();
    let end = start + args.duration;
    // Open loop: the times requests are due, handed to whichever stream is free.
    let due = args.rate.map(|rate| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
        tokio::spawn(async move {
            let mut sent: u64 = 0;
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            loop {
                tick.tick().await;
                let now = Instant::now();
                if now >= end {
                    break;
                }
                let elapsed = now.duration_since(start).as_secs_f64();
                let owed = (elapsed * rate as f64) as u64;
                while sent < owed {
                    let at = start + Duration::from_secs_f64(sent as f64 / rate as f64);
                    if tx.send(at).is_err() {
                        return;
                    }
                    sent += 1;
                }
            }
        });
        Arc::new(tokio::sync::Mutex::new(rx))
    });
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for sender in senders {
        for _ in 0..args.streams {
            let (mut sender, dialer, tally, due, stop) = (
                sender.clone(),
                Arc::clone(dialer),
                Arc::clone(tally),
                due.clone(),
                Arc::clone(&stop),
            );
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let from = match &due {
                        Some(due) => match due.lock().await.recv().await {
                            Some(at) => at,
                            None => break,
                        },
                        None => Instant::now(),
                    };
                    let result = dialer.request(&mut sender).await;
                    if Instant::now() < end {
                        latencies.push(from.elapsed().as_micros() as u64);
                        tally.count(&result);
                    }
                }
                latencies
            }));
        }
    }
    tokio::time::sleep_until(end.into()).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for task in tasks {
        // A stream still waiting for its answer after the end is not waited for long.
        if let Ok(Ok(latencies)) = tokio::time::timeout(Duration::from_secs(5), task).await {
            all.extend(latencies);
        }
    }
    Some(all)
}

/// `-c` loops of connect, one request, close, until `--duration` is up; each handshake and
/// request timed together.
async fn handshakes(args: &Args, dialer: &Arc<Dialer>, tally: &Arc<Tally>) -> Option<Vec<u64>> {
    let end = Instant::now() + args.duration;
    let mut tasks = Vec::new();
    for _ in 0..args.connections {
        let (dialer, tally) = (Arc::clone(dialer), Arc::clone(tally));
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < end {
                let from = Instant::now();
                let result = match dialer.connect().await {
                    Ok(mut sender) => dialer.request(&mut sender).await,
                    Err(error) => Err(error),
                };
                latencies.push(from.elapsed().as_micros() as u64);
                tally.count(&result);
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        if let Ok(latencies) = task.await {
            all.extend(latencies);
        }
    }
    Some(all)
}

/// `-c` connections, one request each, then held idle for `--duration`.
async fn idle(args: &Args, dialer: &Arc<Dialer>, tally: &Arc<Tally>) -> Option<Vec<u64>> {
    let mut held = Vec::with_capacity(args.connections);
    let mut latencies = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        let from = Instant::now();
        let result = match dialer.connect().await {
            Ok(mut sender) => {
                let result = dialer.request(&mut sender).await;
                held.push(sender);
                result
            }
            Err(error) => Err(error),
        };
        latencies.push(from.elapsed().as_micros() as u64);
        tally.count(&result);
    }
    eprintln!("ready: {} connections held", held.len());
    tokio::time::sleep(args.duration).await;
    drop(held);
    Some(latencies)
}
