//! How fast a proxy follows a management server: Legate and Envoy side by side, driven by the
//! same testbed ADS server over 127.0.0.1.
//!
//! ```text
//! xds-bench --proxy legate --binary target/release/legate [--protocol sotw|delta]
//! xds-bench --proxy envoy  --binary "$ENVOY"              [--flips 100] [--clusters 1000]
//! ```
//!
//! 1. Route flips: a route's direct response alternates between 201 and 202; each flip is
//!    timed from the server's `set` to the first response with the new status on a kept-alive
//!    connection that asks back to back. p50/p99/max over `--flips`.
//! 2. Scale: `--clusters` EDS clusters with 10 endpoints each pushed at once; the time until
//!    the proxy ACKs the endpoints of all of them, its CPU time meanwhile (/proc), and its
//!    resident memory before and after (at the ACK, and again a second later).
//! 3. Changes at that scale: the route table becomes one route per cluster plus the
//!    catch-all direct response (1,001 routes beside 1,000 clusters), and `--big-flips` times
//!    the catch-all's status flips, to the proxy's ACK of the route table and to the first
//!    response with the new status. Then `--churn-rounds` rounds each move the endpoints of a
//!    tenth of the clusters, timed to the ACK of them all; then the resident memory, at the
//!    last ACK and 3 s later.
//!
//! The proxy's ACKs of every type are listed too: the server speaks the protocol as real
//! control planes do if Envoy accepts it. The proxy is started by this program and ended by
//! its PID; everything stops by itself.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::cluster::v3::cluster;
use envoy_types::pb::google::protobuf::Any;
use testbed::ManagementServer;
use testbed::resources;
use testbed::xds::{any, type_url};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(60);

struct Args {
    proxy: String,
    binary: String,
    protocol: String,
    flips: usize,
    clusters: usize,
    big_flips: usize,
    churn_rounds: usize,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        proxy: String::new(),
        binary: String::new(),
        protocol: "sotw".into(),
        flips: 100,
        clusters: 1000,
        big_flips: 20,
        churn_rounds: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--proxy" => args.proxy = value,
            "--binary" => args.binary = value,
            "--protocol" => args.protocol = value,
            "--flips" => args.flips = value.parse().map_err(|_| "--flips: a number")?,
            "--clusters" => args.clusters = value.parse().map_err(|_| "--clusters: a number")?,
            "--big-flips" => {
                args.big_flips = value.parse().map_err(|_| "--big-flips: a number")?;
            }
            "--churn-rounds" => {
                args.churn_rounds = value.parse().map_err(|_| "--churn-rounds: a number")?;
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if !matches!(args.proxy.as_str(), "legate" | "envoy") || args.binary.is_empty() {
        return Err("usage: xds-bench --proxy legate|envoy --binary PATH [--protocol sotw|delta] [--flips N] [--clusters N] [--big-flips N] [--churn-rounds N]".into());
    }
    Ok(args)
}

fn routes(status: u32) -> (String, Any) {
    let config = resources::route_config("web-routes", vec![resources::direct("/", status)]);
    ("web-routes".into(), any(&config))
}

/// Resources by name, as `ManagementServer::set` takes them.
type Named = Vec<(String, Any)>;

/// The name of cluster `i`.
fn cluster_name(i: usize) -> String {
    format!("service-{i:04}")
}

/// `n` EDS clusters and their assignments.
fn clusters(n: usize) -> (Named, Named) {
    let mut clusters = Vec::with_capacity(n);
    for i in 0..n {
        let name = cluster_name(i);
        let mut cluster = resources::eds_cluster(&name, cluster::LbPolicy::RoundRobin);
        cluster.connect_timeout = Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 1,
            nanos: 0,
        });
        clusters.push((name, any(&cluster)));
    }
    (clusters, assignments(n, |_| 0))
}

/// The assignments of `n` clusters, 10 endpoints each, cluster `i`'s ports moved by
/// `moved(i)` tens.
fn assignments(n: usize, moved: impl Fn(usize) -> u16) -> Named {
    (0..n)
        .map(|i| {
            let name = cluster_name(i);
            let base = 9000 + 10 * moved(i);
            // Addresses nobody listens on: no traffic goes there.
            let hosts: Vec<SocketAddr> = (0..10u16)
                .map(|j| {
                    SocketAddr::from(([127, 1, (i / 250) as u8, (i % 250) as u8 + 1], base + j))
                })
                .collect();
            let assignment = any(&resources::assignment(&name, &hosts));
            (name, assignment)
        })
        .collect()
}

/// A fleet's route table: one route per cluster (`/s/NNNN/`), then the catch-all direct
/// response with `status`.
fn big_routes(clusters: usize, status: u32) -> (String, Any) {
    let mut routes: Vec<_> = (0..clusters)
        .map(|i| resources::forward(&format!("/s/{i:04}/"), &cluster_name(i)))
        .collect();
    routes.push(resources::direct("/", status));
    let config = resources::route_config("web-routes", routes);
    ("web-routes".into(), any(&config))
}

/// Waits until the proxy has ACKed responses of `type_url` sent from the `from`th on that
/// carry every name of `wanted`; whether it did within the limit.
async fn acked_all(
    server: &ManagementServer,
    from: usize,
    type_url: &str,
    wanted: &std::collections::BTreeSet<String>,
) -> bool {
    server
        .wait_for(LIMIT, |requests, responses| {
            let acked: std::collections::HashSet<&str> = requests
                .iter()
                .filter(|r| r.is_ack())
                .map(|r| r.response_nonce.as_str())
                .collect();
            let got: std::collections::BTreeSet<&String> = responses[from.min(responses.len())..]
                .iter()
                .filter(|r| r.type_url == type_url && acked.contains(r.nonce.as_str()))
                .flat_map(|r| r.names.iter())
                .collect();
            wanted.iter().all(|name| got.contains(name))
        })
        .await
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

fn start_proxy(args: &Args, dir: &std::path::Path, server: SocketAddr, admin: u16) -> Child {
    let config = dir.join(format!("{}.yaml", args.proxy));
    let mut command = Command::new(&args.binary);
    if args.proxy == "legate" {
        std::fs::write(
            &config,
            format!(
                "admin: {{ address: 127.0.0.1:{admin} }}\nnode: {{ id: bench, cluster: edge }}\ndynamic_resources: {{ ads: {{ address: \"{server}\", protocol: {} }} }}\n",
                args.protocol
            ),
        )
        .expect("config written");
        command
            .args(["-c"])
            .arg(&config)
            .args(["--concurrency", "2"]);
        command.env("RUST_LOG", "warn");
    } else {
        let api = if args.protocol == "delta" {
            "DELTA_GRPC"
        } else {
            "GRPC"
        };
        std::fs::write(
            &config,
            format!(
                r#"node: {{ id: bench, cluster: edge }}
admin: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {admin} }} }} }}
dynamic_resources:
  ads_config:
    api_type: {api}
    transport_api_version: V3
    grpc_services: [{{ envoy_grpc: {{ cluster_name: xds }} }}]
  lds_config: {{ ads: {{}}, resource_api_version: V3 }}
  cds_config: {{ ads: {{}}, resource_api_version: V3 }}
static_resources:
  clusters:
  - name: xds
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    load_assignment:
      cluster_name: xds
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {} }} }} }} }}] }}]
"#,
                server.port()
            ),
        )
        .expect("config written");
        command
            .args(["-c"])
            .arg(&config)
            .args(["--concurrency", "2", "--log-level", "warn", "--base-id"])
            .arg(admin.to_string());
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the proxy starts")
}

/// One GET on a kept-alive connection; the status.
async fn status(conn: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    conn.write_all(b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n")
        .await?;
    buf.clear();
    loop {
        let mut chunk = [0u8; 1024];
        let n = conn.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(buf);
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return head
                    .get(9..12)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| std::io::ErrorKind::InvalidData.into());
            }
        }
    }
}

/// (user + system CPU seconds, resident bytes) of `pid`.
fn usage(pid: u32, ticks_per_second: f64) -> Result<(f64, u64), String> {
    let read = |file: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .map_err(|e| format!("/proc/{pid}/{file}: {e}"))
    };
    let stat = read("stat")?;
    // utime and stime are fields 14 and 15: 12 and 13 after the `)` closing the command name.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("/proc/{pid}/stat: no field {}", i + 3))
    };
    let cpu = (ticks(11)? + ticks(12)?) / ticks_per_second;
    let rss = read("status")?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .ok_or_else(|| format!("/proc/{pid}/status: no VmRSS"))?;
    Ok((cpu, rss * 1024))
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`), the unit of /proc CPU times.
fn clock_ticks() -> Result<f64, String> {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .map_err(|e| format!("getconf CLK_TCK: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|t| *t > 0.0)
        .ok_or_else(|| "getconf CLK_TCK: not a number".to_owned())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = match args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let server = ManagementServer::start(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("the management server starts");
    let port = free_port();
    server.set(type_url::CLUSTER, vec![]);
    let web = resources::listener(
        "web",
        SocketAddr::from(([127, 0, 0, 1], port)),
        "web-routes",
    );
    server.set(type_url::LISTENER, vec![("web".into(), any(&web))]);
    server.set(type_url::ROUTE, vec![routes(200)]);
    let dir = std::env::temp_dir().join(format!("xds-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let admin = free_port();
    let mut child = start_proxy(&args, &dir, server.local_addr(), admin);
    let pid = child.id();
    let outcome = run(&args, &server, port, pid).await;
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    server.shutdown().await;
    if let Err(e) = outcome {
        eprintln!("{}: {e}", args.proxy);
        std::process::exit(1);
    }
}

async fn run(args: &Args, server: &ManagementServer, port: u16, pid: u32) -> Result<(), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + LIMIT;
    let mut buf = Vec::new();
    let mut conn = loop {
        if let Ok(mut conn) = TcpStream::connect(addr).await
            && status(&mut conn, &mut buf).await.ok() == Some(200)
        {
            break conn;
        }
        if Instant::now() > deadline {
            return Err("the listener never served".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    conn.set_nodelay(true).map_err(|e| e.to_string())?;
    let acked: Vec<&str> = [type_url::LISTENER, type_url::ROUTE, type_url::CLUSTER]
        .into_iter()
        .filter(|t| {
            server
                .requests()
                .iter()
                .any(|r| r.type_url == *t && r.is_ack())
        })
        .collect();
    println!(
        "{}: ACKed {} of LDS, RDS, CDS before traffic; NACKs: {}",
        args.proxy,
        acked.len(),
        server.requests().iter().filter(|r| r.is_nack()).count()
    );

    let mut flips = Vec::with_capacity(args.flips);
    for i in 0..args.flips {
        let want = if i % 2 == 0 { 201 } else { 202 };
        let start = Instant::now();
        server.set(type_url::ROUTE, vec![routes(want)]);
        loop {
            let got = status(&mut conn, &mut buf)
                .await
                .map_err(|e| e.to_string())?;
            if u32::from(got) == want {
                break;
            }
            if start.elapsed() > LIMIT {
                return Err(format!("flip {i} never seen"));
            }
        }
        flips.push(start.elapsed());
    }
    flips.sort();
    println!(
        "{} route flips ({}): n={} p50={:.2} ms p99={:.2} ms max={:.2} ms",
        args.proxy,
        args.protocol,
        flips.len(),
        percentile(&flips, 0.5).as_secs_f64() * 1e3,
        percentile(&flips, 0.99).as_secs_f64() * 1e3,
        flips.last().copied().unwrap_or_default().as_secs_f64() * 1e3,
    );

    if args.clusters > 0 {
        // Settle: the flips' work is done before the baseline is taken.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let ticks = clock_ticks()?;
        let (cpu0, rss0) = usage(pid, ticks)?;
        let (clusters, assignments) = clusters(args.clusters);
        let wanted: std::collections::BTreeSet<String> =
            assignments.iter().map(|(name, _)| name.clone()).collect();
        let from = server.responses().len();
        let start = Instant::now();
        server.set(type_url::ENDPOINT, assignments);
        server.set(type_url::CLUSTER, clusters);
        // Done when every new cluster's endpoints were ACKed, in one response or several.
        let done = acked_all(server, from, type_url::ENDPOINT, &wanted).await;
        let wanted = wanted.len();
        let took = start.elapsed();
        if !done {
            return Err(format!("{wanted} clusters' endpoints never ACKed"));
        }
        let (cpu1, rss1) = usage(pid, ticks)?;
        // Workers may still be taking the clusters in after the ACK (Envoy ACKs from its main
        // thread): a second look once they are surely done.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (cpu2, rss2) = usage(pid, ticks)?;
        println!(
            "{} {wanted} clusters x 10 endpoints ({}): applied and ACKed in {:.0} ms, CPU {:.2} s ({:.2} s a second later), RSS {:.1} -> {:.1} MiB ({:.1} MiB a second later)",
            args.proxy,
            args.protocol,
            took.as_secs_f64() * 1e3,
            cpu1 - cpu0,
            cpu2 - cpu0,
            rss0 as f64 / 1048576.0,
            rss1 as f64 / 1048576.0,
            rss2 as f64 / 1048576.0,
        );
        changes_at_scale(args, server, &mut conn, &mut buf, pid, ticks).await?;
    }
    let nacks: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| r.is_nack())
        .filter_map(|r| r.error_detail.clone())
        .collect();
    println!("{}: NACKs {nacks:?}", args.proxy);
    Ok(())
}

/// 3: a route flip in the fleet's route table, and endpoint churn, beside the clusters.
async fn changes_at_scale(
    args: &Args,
    server: &ManagementServer,
    conn: &mut TcpStream,
    buf: &mut Vec<u8>,
    pid: u32,
    ticks: f64,
) -> Result<(), String> {
    let table: std::collections::BTreeSet<String> = ["web-routes".to_owned()].into();
    let from = server.responses().len();
    server.set(type_url::ROUTE, vec![big_routes(args.clusters, 200)]);
    if !acked_all(server, from, type_url::ROUTE, &table).await {
        return Err("the fleet's route table never ACKed".into());
    }
    let mut to_ack = Vec::with_capacity(args.big_flips);
    let mut to_serve = Vec::with_capacity(args.big_flips);
    let (cpu0, _) = usage(pid, ticks)?;
    for i in 0..args.big_flips {
        let want = if i % 2 == 0 { 201 } else { 202 };
        // Made before the clock starts: the time is the proxy's, not this table's making.
        let changed = big_routes(args.clusters, want);
        let from = server.responses().len();
        let start = Instant::now();
        server.set(type_url::ROUTE, vec![changed]);
        let ack = async {
            let done = acked_all(server, from, type_url::ROUTE, &table).await;
            done.then(|| start.elapsed())
        };
        let served = async {
            loop {
                let got = status(conn, buf).await.map_err(|e| e.to_string())?;
                if u32::from(got) == want {
                    return Ok(start.elapsed());
                }
                if start.elapsed() > LIMIT {
                    return Err(format!("big flip {i} never seen"));
                }
            }
        };
        let (ack, served) = tokio::join!(ack, served);
        to_ack.push(ack.ok_or(format!("big flip {i} never ACKed"))?);
        to_serve.push(served?);
    }
    let (cpu1, _) = usage(pid, ticks)?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    if !to_ack.is_empty() {
        to_ack.sort();
        to_serve.sort();
        println!(
            "{} route flip in a {}-route table beside {} clusters ({}): n={} to ACK p50={:.2} ms p99={:.2} ms; to serve p50={:.2} ms p99={:.2} ms; proxy CPU {:.2} ms a flip (serving the probes too)",
            args.proxy,
            args.clusters + 1,
            args.clusters,
            args.protocol,
            to_ack.len(),
            ms(percentile(&to_ack, 0.5)),
            ms(percentile(&to_ack, 0.99)),
            ms(percentile(&to_serve, 0.5)),
            ms(percentile(&to_serve, 0.99)),
            (cpu1 - cpu0) * 1e3 / to_ack.len() as f64,
        );
    }
    let tenth = (args.clusters / 10).max(1);
    let mut churn = Vec::with_capacity(args.churn_rounds);
    // Where each cluster's ports are, in tens from 9000.
    let mut moved_by = vec![0u16; args.clusters];
    let (cpu0, _) = usage(pid, ticks)?;
    for round in 0..args.churn_rounds {
        // Round r moves the next tenth of the clusters (wrapping) to new ports.
        let moved: Vec<usize> = (0..tenth)
            .map(|k| (round * tenth + k) % args.clusters)
            .collect();
        for &i in &moved {
            // A new place each round (50 of them, in turn).
            moved_by[i] = u16::try_from(round % 50 + 1).unwrap_or(1);
        }
        let wanted: std::collections::BTreeSet<String> =
            moved.iter().map(|i| cluster_name(*i)).collect();
        let assigned = assignments(args.clusters, |i| moved_by[i]);
        let from = server.responses().len();
        let start = Instant::now();
        server.set(type_url::ENDPOINT, assigned);
        if !acked_all(server, from, type_url::ENDPOINT, &wanted).await {
            return Err(format!("churn round {round} never ACKed"));
        }
        churn.push(start.elapsed());
    }
    let (cpu1, rss) = usage(pid, ticks)?;
    // Memory the changes left free may go back to the system once they are quiet.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, rss_later) = usage(pid, ticks)?;
    if !churn.is_empty() {
        churn.sort();
        println!(
            "{} {}% endpoint churn ({} of {} clusters a round, {}): n={} to ACK p50={:.2} ms max={:.2} ms, CPU {:.2} s in all; RSS {:.1} MiB ({:.1} MiB 3 s later)",
            args.proxy,
            100 * tenth / args.clusters,
            tenth,
            args.clusters,
            args.protocol,
            churn.len(),
            ms(percentile(&churn, 0.5)),
            ms(churn.last().copied().unwrap_or_default()),
            cpu1 - cpu0,
            rss as f64 / 1048576.0,
            rss_later as f64 / 1048576.0,
        );
    }
    Ok(())
}
