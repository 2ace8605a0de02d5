//! A long run of the real binary under the churn of a fleet, judged by what a fleet needs:
//! no failed request, flat memory, every access log line kept.
//!
//! ```text
//! soak --binary target/release/legate [--minutes 30] [--rate 400] [--out target/soak]
//! ```
//!
//! Over 127.0.0.1, for `--minutes`: HTTP/1.1 and HTTP/2 keep-alive clients send `--rate`
//! requests a second in all to a listener from the testbed management server. Every second a
//! tenth of the endpoints of its two clusters are replaced (EDS); every 5 s its route flips
//! from one cluster to the other (RDS); every 30 s the config file is rewritten and reloaded;
//! every 5 minutes the access log is rotated as logrotate's `create` does (renamed, then
//! `POST /reopen_logs`). Resident memory is sampled every second into `OUT/rss.csv`.
//!
//! It passes when no request failed, every sample after the first 5 minutes is within 5% of
//! the one at 5 minutes, and the access log files hold one line per request answered. The
//! proxy is started here and ended by its PID; everything stops by itself.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::accesslog::v3::{AccessLog, access_log};
use envoy_types::pb::envoy::config::listener::v3::filter;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::google::protobuf::Any;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use testbed::resources;
use testbed::xds::{any, type_url};
use testbed::{ManagementServer, NoopHandle, NoopUpstream};

/// Endpoints per cluster, and the upstreams they are drawn from.
const PER_CLUSTER: usize = 10;
const UPSTREAMS: usize = 40;
const CHURN_EVERY: Duration = Duration::from_secs(1);
const FLIP_EVERY: Duration = Duration::from_secs(5);
const RELOAD_EVERY: Duration = Duration::from_secs(30);
const ROTATE_EVERY: Duration = Duration::from_secs(300);
/// Memory is judged from this point on (allocators and pools have grown to the load).
const WARM_UP: Duration = Duration::from_secs(300);
const RSS_TOLERANCE: f64 = 0.05;
const H1_CLIENTS: usize = 8;
const H2_CLIENTS: usize = 2;
const H2_STREAMS: usize = 4;

struct Args {
    binary: PathBuf,
    minutes: f64,
    rate: u64,
    out: PathBuf,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        binary: PathBuf::new(),
        minutes: 30.0,
        rate: 400,
        out: PathBuf::from("target/soak"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--binary" => args.binary = value.into(),
            "--minutes" => args.minutes = value.parse().map_err(|_| "--minutes: a number")?,
            "--rate" => args.rate = value.parse().map_err(|_| "--rate: a number")?,
            "--out" => args.out = value.into(),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if args.binary.as_os_str().is_empty() {
        return Err("--binary PATH is needed".into());
    }
    Ok(args)
}

/// A port free now on 127.0.0.1 (bound and released: this tool runs alone).
fn free_port() -> SocketAddr {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    socket.local_addr().expect("bound")
}

/// One request to the admin server: its status.
fn admin(addr: SocketAddr, method: &str, path: &str) -> Result<u16, String> {
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut answer = String::new();
    stream
        .read_to_string(&mut answer)
        .map_err(|e| e.to_string())?;
    answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {answer:?}"))
}

/// The static part of the config: the management server, the admin server, and a health
/// listener whose body says which reload wrote it.
fn config_file(server: SocketAddr, admin: SocketAddr, health: SocketAddr, round: u64) -> String {
    format!(
        r#"node: {{ id: soak, cluster: soak }}
dynamic_resources: {{ ads: {{ address: "{server}", protocol: delta }} }}
admin: {{ address: {admin} }}
listeners:
  - name: health
    address: {health}
    routes:
      - match: {{ prefix: / }}
        direct_response: {{ status: 200, body: "reload {round}\n" }}
"#
    )
}

/// The soak listener: its routes by RDS, its access log in `log`.
fn soak_listener(addr: SocketAddr, log: &Path) -> (String, Any) {
    let mut listener = resources::listener("soak", addr, "soak-routes");
    let chain = &mut listener.filter_chains[0];
    if let Some(filter::ConfigType::TypedConfig(typed)) = &mut chain.filters[0].config_type {
        let mut hcm = HttpConnectionManager::decode(typed.value.as_slice())
            .expect("the testbed's own connection manager");
        hcm.access_log = vec![AccessLog {
            name: "envoy.access_loggers.file".into(),
            config_type: Some(access_log::ConfigType::TypedConfig(any(&FileAccessLog {
                path: log.display().to_string(),
                ..Default::default()
            }))),
            ..Default::default()
        }];
        *typed = any(&hcm);
    }
    ("soak".into(), any(&listener))
}

fn routes_to(cluster: &str) -> (String, Any) {
    let config = resources::route_config("soak-routes", vec![resources::forward("/", cluster)]);
    ("soak-routes".into(), any(&config))
}

/// The endpoints of the two clusters: which of the upstreams each has.
struct Membership {
    a: VecDeque<usize>,
    b: VecDeque<usize>,
    spare: VecDeque<usize>,
}

impl Membership {
    fn new() -> Self {
        Self {
            a: (0..PER_CLUSTER).collect(),
            b: (PER_CLUSTER..2 * PER_CLUSTER).collect(),
            spare: (2 * PER_CLUSTER..UPSTREAMS).collect(),
        }
    }

    /// Replaces a tenth of each cluster's endpoints with spare ones.
    fn churn(&mut self) {
        let n = (PER_CLUSTER / 10).max(1);
        for _ in 0..n {
            for cluster in [&mut self.a, &mut self.b] {
                if let (Some(old), Some(new)) = (cluster.pop_front(), self.spare.pop_front()) {
                    cluster.push_back(new);
                    self.spare.push_back(old);
                }
            }
        }
    }

    fn assignments(&self, upstreams: &[NoopHandle]) -> Vec<(String, Any)> {
        [("a", &self.a), ("b", &self.b)]
            .into_iter()
            .map(|(name, members)| {
                let hosts: Vec<SocketAddr> =
                    members.iter().map(|&i| upstreams[i].local_addr()).collect();
                (name.to_owned(), any(&resources::assignment(name, &hosts)))
            })
            .collect()
    }
}

#[derive(Default)]
struct Counts {
    answered: AtomicU64,
    failed: AtomicU64,
    failures: std::sync::Mutex<Vec<String>>,
}

impl Counts {
    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut list = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if list.len() < 20 {
            list.push(what);
        }
    }
}

fn request() -> http::Request<Full<bytes::Bytes>> {
    http::Request::get("/")
        .header("host", "soak")
        .body(Full::new(bytes::Bytes::new()))
        .expect("a valid request")
}

/// Judges one answer: a 200 from an upstream.
async fn judge(
    outcome: Result<http::Response<hyper::body::Incoming>, hyper::Error>,
    counts: &Counts,
) {
    match outcome {
        Ok(response) if response.status() == 200 => {
            let served = response.headers().contains_key("x-noop-served-by");
            match response.into_body().collect().await {
                Ok(_) if served => {
                    counts.answered.fetch_add(1, Ordering::Relaxed);
                }
                Ok(_) => counts.fail("a 200 not from an upstream".into()),
                Err(e) => counts.fail(format!("body: {e}")),
            }
        }
        Ok(response) => {
            let status = response.status();
            let body = response.into_body().collect().await.map(|b| b.to_bytes());
            counts.fail(format!("status {status}: {body:?}"));
        }
        Err(e) => counts.fail(format!("request: {e}")),
    }
}

/// One HTTP/1.1 keep-alive client at `every` between requests, until `stop`.
async fn h1_client(addr: SocketAddr, every: Duration, stop: Arc<AtomicBool>, counts: Arc<Counts>) {
    let mut tick = tokio::time::interval(every);
    let mut sender = None;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if sender.is_none() {
            let stream = match tokio::net::TcpStream::connect(addr).await {
                Ok(stream) => stream,
                Err(e) => {
                    counts.fail(format!("connect: {e}"));
                    continue;
                }
            };
            match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
                Ok((s, conn)) => {
                    tokio::spawn(conn);
                    sender = Some(s);
                }
                Err(e) => {
                    counts.fail(format!("handshake: {e}"));
                    continue;
                }
            }
        }
        let Some(s) = sender.as_mut() else { continue };
        if s.ready().await.is_err() {
            // The proxy closed a kept-alive connection between requests: allowed, reconnect.
            sender = None;
            continue;
        }
        judge(s.send_request(request()).await, &counts).await;
    }
}

/// One HTTP/2 connection with `streams` concurrent request loops.
async fn h2_client(
    addr: SocketAddr,
    streams: usize,
    every: Duration,
    stop: Arc<AtomicBool>,
    counts: Arc<Counts>,
) {
    while !stop.load(Ordering::Relaxed) {
        let stream = match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => stream,
            Err(e) => {
                counts.fail(format!("h2 connect: {e}"));
                tokio::time::sleep(every).await;
                continue;
            }
        };
        let (sender, conn) =
            match hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
            {
                Ok(pair) => pair,
                Err(e) => {
                    counts.fail(format!("h2 handshake: {e}"));
                    continue;
                }
            };
        let connection = tokio::spawn(conn);
        let loops: Vec<_> = (0..streams)
            .map(|_| {
                let (mut sender, stop, counts) = (sender.clone(), stop.clone(), counts.clone());
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    while !stop.load(Ordering::Relaxed) {
                        tick.tick().await;
                        if sender.ready().await.is_err() {
                            return; // the connection ended (a GOAWAY): a new one follows
                        }
                        judge(sender.send_request(request()).await, &counts).await;
                    }
                })
            })
            .collect();
        for task in loops {
            let _ = task.await;
        }
        connection.abort();
    }
}

fn resident_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Lines in the access log and its rotated files.
fn log_lines(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("access.log"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .map(|bytes| bytes.iter().filter(|&&b| b == b'\n').count() as u64)
        .sum()
}

struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("soak: {e}");
            std::process::exit(2);
        }
    };
    let passed = run(args).await;
    std::process::exit(if passed { 0 } else { 1 });
}

async fn run(args: Args) -> bool {
    let out = std::fs::canonicalize(".")
        .map(|cwd| cwd.join(&args.out))
        .unwrap_or(args.out.clone());
    let logs = out.join("logs");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&logs).expect("the output folder");
    let log = logs.join("access.log");

    let mut upstreams = Vec::with_capacity(UPSTREAMS);
    for _ in 0..UPSTREAMS {
        upstreams.push(
            NoopUpstream::bind("127.0.0.1:0".parse().expect("an address"))
                .await
                .expect("an upstream on 127.0.0.1"),
        );
    }
    let server = ManagementServer::start("127.0.0.1:0".parse().expect("an address"))
        .await
        .expect("the management server");
    let (admin_addr, health, soak) = (free_port(), free_port(), free_port());
    let mut members = Membership::new();
    server.set(
        type_url::CLUSTER,
        ["a", "b"]
            .map(|name| {
                let cluster = resources::eds_cluster(
                    name,
                    envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy::RoundRobin,
                );
                (name.to_owned(), any(&cluster))
            })
            .to_vec(),
    );
    server.set(type_url::ENDPOINT, members.assignments(&upstreams));
    server.set(type_url::LISTENER, vec![soak_listener(soak, &log)]);
    server.set(type_url::ROUTE, vec![routes_to("a")]);

    let config = out.join("legate.yaml");
    let mut reloads = 0;
    std::fs::write(
        &config,
        config_file(server.local_addr(), admin_addr, health, reloads),
    )
    .expect("the config file");
    let stderr = std::fs::File::create(out.join("legate.log")).expect("the proxy's log file");
    let proxy = Proxy(
        Command::new(&args.binary)
            .arg("-c")
            .arg(&config)
            .arg("--concurrency")
            .arg("2")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("the proxy starts"),
    );
    let pid = proxy.0.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(soak).await.is_err() {
        if Instant::now() > deadline {
            eprintln!("soak: the listener never came up; see {}", out.display());
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let loops = (H1_CLIENTS + H2_CLIENTS * H2_STREAMS) as u64;
    let every = Duration::from_micros(1_000_000 * loops / args.rate.max(1));
    let mut clients = Vec::new();
    for _ in 0..H1_CLIENTS {
        clients.push(tokio::spawn(h1_client(
            soak,
            every,
            stop.clone(),
            counts.clone(),
        )));
    }
    for _ in 0..H2_CLIENTS {
        clients.push(tokio::spawn(h2_client(
            soak,
            H2_STREAMS,
            every,
            stop.clone(),
            counts.clone(),
        )));
    }

    let started = Instant::now();
    let length = Duration::from_secs_f64(args.minutes * 60.0);
    let mut rss = std::fs::File::create(out.join("rss.csv")).expect("rss.csv");
    let _ = writeln!(rss, "seconds,rss_kib");
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut tick = tokio::time::interval(CHURN_EVERY);
    let (mut flips, mut rotations, mut churns) = (0u64, 0u64, 0u64);
    let (mut next_flip, mut next_reload, mut next_rotate) =
        (FLIP_EVERY, RELOAD_EVERY, ROTATE_EVERY);
    let mut errors = Vec::new();
    while started.elapsed() < length {
        tick.tick().await;
        let at = started.elapsed();
        members.churn();
        server.set(type_url::ENDPOINT, members.assignments(&upstreams));
        churns += 1;
        if at >= next_flip {
            flips += 1;
            server.set(
                type_url::ROUTE,
                vec![routes_to(if flips % 2 == 0 { "a" } else { "b" })],
            );
            next_flip += FLIP_EVERY;
        }
        if at >= next_reload {
            reloads += 1;
            let text = config_file(server.local_addr(), admin_addr, health, reloads);
            let staged = config.with_extension("yaml.new");
            let written =
                std::fs::write(&staged, text).and_then(|()| std::fs::rename(&staged, &config));
            match (written, admin(admin_addr, "POST", "/reload")) {
                (Ok(()), Ok(200)) => {}
                (w, r) => errors.push(format!("reload {reloads}: {w:?} {r:?}")),
            }
            next_reload += RELOAD_EVERY;
        }
        if at >= next_rotate {
            rotations += 1;
            let rotated = logs.join(format!("access.log.{rotations}"));
            let moved = std::fs::rename(&log, &rotated);
            match (moved, admin(admin_addr, "POST", "/reopen_logs")) {
                (Ok(()), Ok(200)) => {}
                (m, r) => errors.push(format!("rotation {rotations}: {m:?} {r:?}")),
            }
            next_rotate += ROTATE_EVERY;
        }
        if let Some(kib) = resident_kib(pid) {
            let _ = writeln!(rss, "{:.0},{kib}", at.as_secs_f64());
            samples.push((at.as_secs_f64(), kib));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }

    // Every answered request is a line, once the writer has flushed.
    let answered = counts.answered.load(Ordering::Relaxed);
    let flushed = Instant::now() + Duration::from_secs(20);
    let mut lines = log_lines(&logs);
    while lines < answered && Instant::now() < flushed {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lines = log_lines(&logs);
    }
    drop(proxy);
    server.shutdown().await;

    let failed = counts.failed.load(Ordering::Relaxed);
    let warm = samples
        .iter()
        .find(|(t, _)| *t >= WARM_UP.as_secs_f64())
        .map(|&(_, kib)| kib);
    let (low, high) = samples
        .iter()
        .filter(|(t, _)| *t >= WARM_UP.as_secs_f64())
        .fold((u64::MAX, 0), |(lo, hi), &(_, kib)| {
            (lo.min(kib), hi.max(kib))
        });
    let memory_flat = warm.is_none_or(|warm| {
        let bound = warm as f64 * RSS_TOLERANCE;
        (low as f64) >= warm as f64 - bound && (high as f64) <= warm as f64 + bound
    });
    println!(
        "soak: {:.1} min, {answered} requests answered, {failed} failed; {churns} EDS churns, {flips} route flips, {reloads} reloads, {rotations} log rotations",
        started.elapsed().as_secs_f64() / 60.0
    );
    match warm {
        Some(warm) => println!(
            "memory: {warm} KiB at 5 min, then {low}..{high} KiB ({:+.1}%..{:+.1}%)",
            (low as f64 / warm as f64 - 1.0) * 100.0,
            (high as f64 / warm as f64 - 1.0) * 100.0
        ),
        None => println!("memory: shorter than the 5-minute warm-up, not judged"),
    }
    println!("access log: {lines} lines for {answered} answers");
    for failure in counts
        .failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        println!("  failed: {failure}");
    }
    for error in &errors {
        println!("  error: {error}");
    }
    let passed = failed == 0 && memory_flat && lines == answered && errors.is_empty();
    println!(
        "{}: {}",
        if passed { "PASS" } else { "FAIL" },
        out.display()
    );
    passed
}
