//! Shared helpers for the integration tests: run the real `legate` binary, and talk real
//! HTTP/1.1 and HTTP/2 to it over 127.0.0.1.

#![allow(dead_code)] // each test file uses a different subset
#![allow(clippy::unwrap_used)] // test helpers: a failure should stop the test loudly

pub mod certs;
pub mod jwks;
pub mod ratelimit;
pub mod xds;

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;

pub const BIN: &str = env!("CARGO_BIN_EXE_legate");

/// A scratch directory removed on drop.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "legate-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }

    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `legate` binary running a config, with its stderr collected.
pub struct Proxy {
    child: Child,
    /// Bound address of each listener, in config order.
    pub addrs: Vec<SocketAddr>,
    /// The admin server's address, if it runs.
    pub admin: Option<SocketAddr>,
    log: Arc<Mutex<String>>,
    _dir: ScratchDir,
}

/// `yaml` with the admin server on a free port where it says nothing of it: its default,
/// 9901, may be held by another test or by a proxy the developer runs.
fn with_free_admin(yaml: &str) -> String {
    if yaml.lines().any(|l| l.starts_with("admin:")) {
        yaml.to_owned()
    } else {
        format!("admin: {{ address: 127.0.0.1:0 }}\n{yaml}")
    }
}

impl Proxy {
    /// Starts `legate -c CONFIG --concurrency WORKERS` and waits until every listener is up.
    pub fn start(yaml: &str, workers: usize) -> Proxy {
        Self::start_with_env(yaml, workers, &[])
    }

    pub fn start_with_env(yaml: &str, workers: usize, env: &[(&str, &str)]) -> Proxy {
        Self::start_in(Command::new(BIN), yaml, workers, env)
    }

    /// As [`start`](Self::start), with the open-file limit (soft and hard) set to `limit`.
    #[allow(dead_code)]
    pub fn start_with_open_files(yaml: &str, workers: usize, limit: u32) -> Proxy {
        let mut command = Command::new("bash");
        command.args([
            "-c",
            &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
            BIN,
        ]);
        Self::start_in(command, yaml, workers, &[])
    }

    /// Runs `command` (the binary, or what execs it) with `-c CONFIG --concurrency WORKERS`.
    fn start_in(mut command: Command, yaml: &str, workers: usize, env: &[(&str, &str)]) -> Proxy {
        let dir = ScratchDir::new();
        let yaml = with_free_admin(yaml);
        let config = dir.write("legate.yaml", &yaml);
        // Listener addresses are the lines `    address: ...` (admin and endpoint addresses
        // are written inline).
        let listeners = yaml
            .lines()
            .filter(|l| l.starts_with("    address:"))
            .count();
        command
            .arg("-c")
            .arg(&config)
            .arg("--concurrency")
            .arg(workers.to_string());
        Self::spawn(command, env, listeners, dir)
    }

    /// Starts the binary with arbitrary arguments; waits for `listeners` "listening" lines.
    pub fn spawn(
        mut command: Command,
        env: &[(&str, &str)],
        listeners: usize,
        dir: ScratchDir,
    ) -> Proxy {
        command
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("the legate binary starts");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel::<String>();
        {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if line.contains("listening") || line.contains("legate ready") {
                        let _ = tx.send(line.clone());
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            });
        }
        let addr_in = |line: &str| -> SocketAddr {
            line.split("addr=").nth(1).unwrap().trim().parse().unwrap()
        };
        let mut addrs = Vec::new();
        let mut admin = None;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("legate ready") => break,
                Ok(line) if line.contains("admin server listening") => admin = Some(addr_in(&line)),
                Ok(line) => addrs.push(addr_in(&line)),
                Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("legate did not become ready; log:\n{}", log.lock().unwrap());
                }
            }
        }
        assert_eq!(addrs.len(), listeners, "listeners reported");
        Proxy {
            child,
            addrs,
            admin,
            log,
            _dir: dir,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// The config file the proxy runs (and reloads) from.
    #[allow(dead_code)]
    pub fn config_path(&self) -> PathBuf {
        self._dir.0.join("legate.yaml")
    }

    /// Replaces the config file (whole, by rename, as config tools do); the proxy reads it on
    /// its next reload.
    #[allow(dead_code)]
    pub fn rewrite_config(&self, yaml: &str) {
        let path = self.config_path();
        let staged = path.with_extension("yaml.new");
        std::fs::write(&staged, with_free_admin(yaml)).unwrap();
        std::fs::rename(&staged, &path).unwrap();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends SIGTERM to this proxy (and only to it, by its PID).
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Let the log reader catch the last lines.
                std::thread::sleep(Duration::from_millis(50));
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Polls the log until `needle` appears, at most `limit`.
    pub fn wait_for_log(&self, needle: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.log().contains(needle) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A request body of `len` pattern bytes, sent in 64 KiB frames; with `known_length` it
/// carries a content-length, otherwise HTTP/1.1 sends it chunked.
pub struct PatternBody {
    offset: u64,
    len: u64,
    known_length: bool,
}

impl PatternBody {
    pub fn new(len: u64, known_length: bool) -> Self {
        Self {
            offset: 0,
            len,
            known_length,
        }
    }
}

impl Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.offset >= self.len {
            return Poll::Ready(None);
        }
        let n = (self.len - self.offset).min(64 * 1024) as usize;
        let chunk = testbed::pattern_bytes(self.offset, n);
        self.offset += n as u64;
        Poll::Ready(Some(Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.known_length && self.offset >= self.len
    }

    fn size_hint(&self) -> SizeHint {
        if self.known_length {
            SizeHint::with_exact(self.len - self.offset)
        } else {
            SizeHint::default()
        }
    }
}

/// How long a helper here waits for an answer (a handshake, a response head, a whole body)
/// before it fails the test, so that a proxy that never answers fails it with a message
/// instead of leaving the run hung. Well above the slowest answer a test waits for on
/// purpose (a paced upload to a slow upstream reader takes about a minute in tests/buffers.rs).
pub const ANSWER_WITHIN: Duration = Duration::from_secs(300);

/// `step`, or a panic naming `what` if it has not ended within [`ANSWER_WITHIN`].
pub async fn answered<T>(what: &str, step: impl Future<Output = T>) -> T {
    match tokio::time::timeout(ANSWER_WITHIN, step).await {
        Ok(done) => done,
        Err(_) => panic!("{what}: no answer within {ANSWER_WITHIN:?}"),
    }
}

/// Sends one request over a new HTTP/1.1 connection.
pub async fn send_h1<B>(addr: SocketAddr, req: Request<B>) -> Response<Incoming>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    try_send_h1(addr, req).await.expect("HTTP/1.1 request")
}

pub async fn try_send_h1<B>(
    addr: SocketAddr,
    req: Request<B>,
) -> Result<Response<Incoming>, hyper::Error>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the proxy");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    answered("an HTTP/1.1 request", sender.send_request(req)).await
}

/// Sends one request over a new HTTP/2 (prior knowledge) connection.
pub async fn send_h2<B>(addr: SocketAddr, req: Request<B>) -> Response<Incoming>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, _) = h2_client(addr).await;
    answered("an HTTP/2 request", sender.send_request(req))
        .await
        .expect("HTTP/2 request")
}

/// An HTTP/2 connection to `addr`, for several requests.
pub async fn h2_client<B>(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<B>,
    tokio::task::JoinHandle<()>,
)
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the proxy");
    let (sender, conn) = answered(
        "an HTTP/2 handshake",
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)),
    )
    .await
    .expect("HTTP/2 handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

/// A GET with a host and the given extra headers and an empty body.
pub fn get(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut builder = Request::get(path).header("host", "legate.test");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// The same for HTTP/2, whose requests carry the host in an absolute URI.
pub fn get_h2(path: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut builder = Request::get(format!("http://legate.test{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

/// Reads a body to its end: (length, lowercase hex SHA-256).
pub async fn digest(mut body: Incoming) -> (u64, String) {
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    while let Some(frame) = answered("a response body's next frame", body.frame()).await {
        if let Ok(data) = frame.expect("body frame").into_data() {
            len += data.len() as u64;
            hasher.update(&data);
        }
    }
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    (len, hex)
}

pub async fn text(body: Incoming) -> String {
    let bytes = answered("a response body", body.collect())
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A proxy config with one listener on an ephemeral port forwarding everything to `endpoints`.
/// A loopback address nothing listens on, reserved while the value lives: the socket is bound
/// but never listens, so connections are refused and no other test can take the port (a port
/// picked by binding and then released could be).
pub struct ClosedPort {
    pub addr: SocketAddr,
    _socket: socket2::Socket,
}

pub fn closed_port() -> ClosedPort {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("tcp socket");
    let any: SocketAddr = "127.0.0.1:0".parse().expect("address");
    socket.bind(&any.into()).expect("bind 127.0.0.1:0");
    let addr = socket
        .local_addr()
        .expect("bound address")
        .as_socket()
        .expect("an IP address");
    ClosedPort {
        addr,
        _socket: socket,
    }
}

pub fn forward_config(endpoints: &[impl std::fmt::Display], extra_cluster: &str) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(|e| e.to_string()).collect();
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    routes:
      - match: {{ path: /healthz }}
        direct_response: {{ status: 200, body: "ok\n" }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{}]
{extra_cluster}
"#,
        endpoints.join(", ")
    )
}

/// One request to the admin server over a fresh connection: (status, body).
pub fn admin_request(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Waits (up to 20 s) until `stat(admin, name)` is `expected`, and returns what it last read:
/// for stats recorded when a stream is dropped, a moment after the client saw its end.
#[allow(dead_code)]
pub fn stat_settled(admin: SocketAddr, name: &str, expected: i64) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let value = stat(admin, name);
        if value == expected || Instant::now() > deadline {
            return value;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A stat from `/stats`, summed over its series (per-worker lines left out).
pub fn stat(admin: SocketAddr, name: &str) -> i64 {
    let (_, text) = admin_request(
        admin,
        "GET",
        // ^NAME($|{): the name alone, labelled or not.
        &format!("/stats?filter=%5E{name}%28%24%7C%5B%7B%5D%29"),
    );
    text.lines()
        .filter(|l| !l.contains("worker="))
        .filter_map(|l| l.rsplit(": ").next()?.parse::<i64>().ok())
        .sum()
}

/// Polls `check` every 10 ms until it holds; fails the test, naming `what`, after 20 s.
pub async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    eventually_within(Duration::from_secs(20), what, check).await
}

/// [`eventually`] with a deadline of `limit`, for work that grows with a test's size.
pub async fn eventually_within(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "never {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An upstream whose answers wait until the test releases them: requests held in flight for
/// exactly as long as a test needs, whatever the machine's speed.
pub struct HeldUpstream {
    pub addr: SocketAddr,
    arrived: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    release: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl HeldUpstream {
    pub async fn start() -> HeldUpstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let arrived = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let release = tokio::sync::watch::Sender::new(false);
        let task = tokio::spawn({
            let (arrived, accepted, release) =
                (Arc::clone(&arrived), Arc::clone(&accepted), release.clone());
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let (arrived, release) = (Arc::clone(&arrived), release.clone());
                    tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                            arrived.fetch_add(1, Ordering::SeqCst);
                            let mut released = release.subscribe();
                            async move {
                                let _ = released.wait_for(|r| *r).await;
                                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(
                                    "released\n",
                                ))))
                            }
                        });
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        HeldUpstream {
            addr,
            arrived,
            accepted,
            release,
            task,
        }
    }

    /// Waits (up to 20 s) until `n` requests have arrived.
    pub async fn wait_for_requests(&self, n: usize) {
        eventually("reached by the requests", async || {
            self.arrived.load(Ordering::SeqCst) >= n
        })
        .await;
    }

    /// How many requests have arrived so far.
    pub fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// How many connections it has accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Answers the requests held, and every later one at once.
    pub fn release(&self) {
        self.release.send_replace(true);
    }
}

impl Drop for HeldUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gRPC authorization sidecar on 127.0.0.1 with `rules`.
pub async fn grpc_sidecar(rules: testbed::AuthzRules) -> testbed::AuthzSidecar {
    testbed::AuthzSidecar::start(
        testbed::SidecarAddr::Tcp("127.0.0.1:0".parse().unwrap()),
        testbed::SidecarMode::Grpc,
        rules,
    )
    .await
    .unwrap()
}

/// `x-user: alice` gets in; anyone else gets the sidecar's 401.
pub fn alice_or_401() -> testbed::AuthzRules {
    testbed::AuthzRules {
        allow_if: Some(("x-user".into(), "alice".into())),
        deny_status: 401,
        ..testbed::AuthzRules::default()
    }
}

/// Reads what the proxy sends until it closes the connection (within 20 s).
pub async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the proxy never closed the connection");
    seen
}

/// A body compressed with `encoding` (`gzip`, `br`, `zstd`), decompressed.
pub fn decompress(encoding: &str, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    match encoding {
        "gzip" => {
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(bytes), &mut out).unwrap();
        }
        "br" => brotli::BrotliDecompress(&mut &bytes[..], &mut out).unwrap(),
        "zstd" => out = zstd::stream::decode_all(bytes).unwrap(),
        other => panic!("unexpected encoding {other}"),
    }
    out
}

/// `legate demo` with one worker, its ports picked by the system (a port picked here and
/// released could be taken by another test before the demo binds it): its plain listener
/// first, then its TLS one.
#[allow(dead_code)]
pub fn start_demo() -> Proxy {
    let mut command = Command::new(BIN);
    command.args([
        "demo",
        "--port",
        "0",
        "--tls-port",
        "0",
        "--admin-port",
        "0",
        "--concurrency",
        "1",
    ]);
    Proxy::spawn(command, &[], 2, ScratchDir::new())
}

/// `legate -c FILE --upgrade-socket PATH`, in its own scratch directory.
pub fn start_upgradable(yaml: &str, socket: &std::path::Path, from: bool) -> Proxy {
    let dir = ScratchDir::new();
    let yaml = with_free_admin(yaml);
    let config = dir.write("legate.yaml", &yaml);
    let mut command = Command::new(BIN);
    command
        .arg("-c")
        .arg(&config)
        .arg("--concurrency")
        .arg("2")
        .arg("--upgrade-socket")
        .arg(socket);
    if from {
        command.arg("--upgrade-from").arg(socket);
    }
    Proxy::spawn(command, &[], 1, dir)
}

/// The frame types of an HTTP/2 byte stream after its preface (none on a server's side).
pub fn frame_types(mut bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    while bytes.len() >= 9 {
        let len =
            (usize::from(bytes[0]) << 16) | (usize::from(bytes[1]) << 8) | usize::from(bytes[2]);
        types.push(bytes[3]);
        bytes = &bytes[(9 + len).min(bytes.len())..];
    }
    types
}
