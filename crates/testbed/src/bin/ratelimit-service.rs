//! `ratelimit-service`: the testbed's rate limit service as a standalone server, for
//! benchmarking Legate's global rate limit against a service that answers at once.

use std::net::SocketAddr;
use std::process::ExitCode;

use testbed::{RateLimitService, serve_until_stopped};

const USAGE: &str = "\
usage: ratelimit-service [--listen ADDR] [--limit N]

Answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit from counts kept in
memory: N hits per domain and descriptor (default: 4294967295), then OVER_LIMIT.

options:
  --listen ADDR   address to listen on (default 127.0.0.1:8081)
  --limit N       hits allowed per domain and descriptor
  -h, --help      print this help
";

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:8081".to_owned();
    let mut limit = u32::MAX;
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("-h" | "--help", _) => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            ("--listen", Some(value)) => listen = value,
            ("--limit", Some(value)) => match value.parse() {
                Ok(n) => limit = n,
                Err(e) => {
                    eprint!("ratelimit-service: bad --limit {value:?}: {e}\n\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            (other, _) => {
                eprint!("ratelimit-service: bad argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let addr: SocketAddr = match listen.parse() {
        Ok(addr) => addr,
        Err(e) => {
            eprint!("ratelimit-service: bad --listen address {listen:?}: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let service = match RateLimitService::start(addr, limit).await {
        Ok(service) => service,
        Err(e) => {
            eprintln!("ratelimit-service: can't listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let banner = format!("ratelimit-service listening on {}", service.local_addr());
    if serve_until_stopped("ratelimit-service", &banner)
        .await
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    println!("ratelimit-service: {} calls", service.calls());
    ExitCode::SUCCESS
}
