//! `otlp-collector`: the testbed's OpenTelemetry collector as a standalone server, for
//! benchmarking Legate's tracing against a real process. It takes OTLP traces over gRPC and
//! HTTP on one port, keeps them in memory, and prints how many spans it got when stopped.

use std::net::SocketAddr;
use std::process::ExitCode;

use testbed::{OtlpCollector, serve_until_stopped};

const USAGE: &str = "\
usage: otlp-collector [--listen ADDR]

Takes OTLP traces: gRPC TraceService/Export, and protobuf POSTs to /v1/traces, on one port.
Prints the spans received when stopped (SIGTERM, SIGINT).

options:
  --listen ADDR   address to listen on (default 127.0.0.1:4317)
  -h, --help      print this help
";

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:4317".to_owned();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "--listen" => match args.next() {
                Some(value) => listen = value,
                None => {
                    eprint!("otlp-collector: --listen needs an address\n\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            other => {
                eprint!("otlp-collector: unknown argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let addr: SocketAddr = match listen.parse() {
        Ok(addr) => addr,
        Err(e) => {
            eprint!("otlp-collector: bad --listen address {listen:?}: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let collector = match OtlpCollector::start(addr).await {
        Ok(collector) => collector,
        Err(e) => {
            eprintln!("otlp-collector: can't listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let banner = format!("otlp-collector listening on {}", collector.local_addr());
    if serve_until_stopped("otlp-collector", &banner)
        .await
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    println!(
        "otlp-collector: {} spans in {} exports",
        collector.spans().len(),
        collector.exports()
    );
    collector.shutdown();
    ExitCode::SUCCESS
}
