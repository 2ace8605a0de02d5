//! `ext-processor`: the testbed's external processor (`ExtProcessor`) as a standalone server,
//! for benchmarking Legate's `ext_proc` filter against a processor that answers at once.

use std::net::SocketAddr;
use std::process::ExitCode;

use testbed::{ExtProcessor, serve_until_stopped};

const USAGE: &str = "\
usage: ext-processor [--listen ADDR]

Serves envoy.service.ext_proc.v3.ExternalProcessor/Process, answering each message at once as
testbed::ExtProcessor does (a header added each way, bodies changed), recording nothing.

options:
  --listen ADDR   address to listen on (default 127.0.0.1:8082)
  -h, --help      print this help
";

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:8082".to_owned();
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("-h" | "--help", _) => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            ("--listen", Some(value)) => listen = value,
            (other, _) => {
                eprint!("ext-processor: bad argument {other:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let addr: SocketAddr = match listen.parse() {
        Ok(addr) => addr,
        Err(e) => {
            eprint!("ext-processor: bad --listen address {listen:?}: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let processor = match ExtProcessor::start_unrecorded(addr).await {
        Ok(processor) => processor,
        Err(e) => {
            eprintln!("ext-processor: can't listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let banner = format!("ext-processor listening on {}", processor.local_addr());
    match serve_until_stopped("ext-processor", &banner).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(()) => ExitCode::FAILURE,
    }
}
