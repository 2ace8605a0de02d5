//! `noop-upstream`: the testbed's no-op upstream as a standalone server, for benchmarking
//! Legate against real processes.

use std::net::SocketAddr;
use std::process::ExitCode;

use testbed::{NoopUpstream, serve_until_stopped};

const USAGE: &str = "\
usage: noop-upstream [--listen ADDR]

Serves HTTP/1.1 and cleartext HTTP/2 on one port; requests steer the response with
x-noop-delay, x-noop-status, x-noop-size, x-noop-chunked and x-noop-echo headers.

options:
  --listen ADDR   address to listen on (default 127.0.0.1:9000)
  -h, --help      print this help
";

const DEFAULT_LISTEN: &str = "127.0.0.1:9000";

enum Command {
    Serve(SocketAddr),
    Help,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Command, String> {
    let mut listen = DEFAULT_LISTEN.to_owned();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--listen" => {
                listen = args
                    .next()
                    .ok_or_else(|| "--listen needs an address".to_owned())?;
            }
            other => match other.strip_prefix("--listen=") {
                Some(value) => value.clone_into(&mut listen),
                None => return Err(format!("unknown argument {other:?}")),
            },
        }
    }
    listen
        .parse()
        .map(Command::Serve)
        .map_err(|e| format!("bad --listen address {listen:?}: {e}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let addr = match parse_args(std::env::args().skip(1)) {
        Ok(Command::Serve(addr)) => addr,
        Ok(Command::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprint!("noop-upstream: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let upstream = match NoopUpstream::bind(addr).await {
        Ok(upstream) => upstream,
        Err(e) => {
            eprintln!("noop-upstream: can't listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let banner = format!("noop-upstream listening on {}", upstream.local_addr());
    if serve_until_stopped("noop-upstream", &banner).await.is_err() {
        return ExitCode::FAILURE;
    }
    upstream.shutdown();
    ExitCode::SUCCESS
}
