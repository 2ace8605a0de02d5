//! `authz-probe`: checks sent straight to an external authorization service at a fixed rate,
//! with their latency: the round trip a proxy's `ext_authz` call cannot beat, measured where
//! the proxy would run (pin it to the proxy's CPU).

use std::path::PathBuf;
use std::process::ExitCode;
use std::rc::Rc;
use std::time::{Duration, Instant};

use authz_client::{AuthzClient, CheckInput, Endpoint};

const USAGE: &str = "\
usage: authz-probe --target ADDR [--rate N] [--duration SECONDS]

Sends gRPC ext_authz checks to ADDR (IP:PORT or unix:/path) at N a second (default 2000) for
SECONDS (default 8) over one HTTP/2 connection, open loop, and prints the latency p50, p99 and
mean in microseconds, each timed from its send to its answer.
";

fn main() -> ExitCode {
    let mut target = None;
    let mut rate = 2000u32;
    let mut seconds = 8u64;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next();
        match (arg.as_str(), value) {
            ("--target", Some(v)) => target = Some(v),
            ("--rate", Some(v)) => match v.parse() {
                Ok(n) if n > 0 => rate = n,
                _ => return usage(&format!("bad --rate {v:?}")),
            },
            ("--duration", Some(v)) => match v.parse() {
                Ok(n) if n > 0 => seconds = n,
                _ => return usage(&format!("bad --duration {v:?}")),
            },
            _ => return usage(&format!("unexpected argument {arg:?}")),
        }
    }
    let Some(target) = target else {
        return usage("--target is required");
    };
    let endpoint = match target.strip_prefix("unix:") {
        Some(path) => Endpoint::Unix(PathBuf::from(path)),
        None => match target.parse() {
            Ok(addr) => Endpoint::Tcp(addr),
            Err(e) => return usage(&format!("bad --target {target:?}: {e}")),
        },
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("authz-probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let client = Rc::new(AuthzClient::grpc(endpoint, Duration::from_secs(1)));
        if let Err(e) = check(&client).await {
            eprintln!("authz-probe: first check failed: {e}");
            return ExitCode::FAILURE;
        }
        let interval = Duration::from_secs(1) / rate;
        let total = rate as u64 * seconds;
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::with_capacity(total as usize);
        for i in 0..total as u32 {
            let at = start + interval * i;
            tokio::time::sleep_until(at).await;
            let client = Rc::clone(&client);
            tasks.push(tokio::task::spawn_local(async move {
                // Timed from the send, not the schedule: tokio's timer wakes on millisecond
                // ticks, which would add up to a millisecond that is the probe's, not the
                // service's.
                let sent = Instant::now();
                let ok = check(&client).await.is_ok();
                (ok, sent.elapsed())
            }));
        }
        let mut latencies = Vec::with_capacity(tasks.len());
        let mut failed = 0;
        for t in tasks {
            match t.await {
                Ok((true, took)) => latencies.push(took.as_secs_f64() * 1e6),
                _ => failed += 1,
            }
        }
        latencies.sort_by(|a, b| a.total_cmp(b));
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
        let mean = latencies.iter().sum::<f64>() / latencies.len().max(1) as f64;
        println!(
            "checks {} failed {failed} p50_us {:.0} p99_us {:.0} mean_us {:.0}",
            latencies.len(),
            at(0.5),
            at(0.99),
            mean
        );
        ExitCode::SUCCESS
    })
}

async fn check(client: &AuthzClient) -> Result<authz_client::Decision, authz_client::AuthzError> {
    let mut headers = http::HeaderMap::new();
    headers.insert("user-agent", http::HeaderValue::from_static("oha/1.16.0"));
    headers.insert("accept", http::HeaderValue::from_static("*/*"));
    let input = CheckInput {
        method: &http::Method::GET,
        path: "/",
        host: "127.0.0.1:21501",
        scheme: "http",
        version: http::Version::HTTP_11,
        headers: &headers,
        request_id: "0b8ab7c4-5b1c-4a8e-9f0e-2f1f2d9d7a11",
        source: ([127, 0, 0, 1], 40000).into(),
        destination: ([127, 0, 0, 1], 21501).into(),
        context_extensions: &[],
        allowed_headers: None,
        route_metadata: None,
        body: None,
        traceparent: None,
        tracestate: None,
    };
    client.check(&input).await
}

fn usage(problem: &str) -> ExitCode {
    eprint!("authz-probe: {problem}\n\n{USAGE}");
    ExitCode::from(2)
}
