//! `authz-sidecar`: the testbed's external authorization service as a standalone server
//! (Envoy's gRPC ext_authz protocol, or plain HTTP), for the demo and the benchmarks.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use testbed::{AuthzRules, AuthzSidecar, SidecarAddr, SidecarMode};

const USAGE: &str = "\
usage: authz-sidecar [--listen ADDR] [--http] [rules...]

An external authorization service: gRPC envoy.service.auth.v3.Authorization/Check (default)
or HTTP (--http: a 2xx allows). Without rules it allows every request at once.

options:
  --listen ADDR          IP:PORT or unix:/path (default 127.0.0.1:9191)
  --http                 speak plain HTTP instead of gRPC
  --allow-header N=V     allow only requests whose header N is V
  --deny-status CODE     status of a denial (default 403)
  --deny-body TEXT       body of a denial
  --add-header N=V       header added to allowed requests (repeatable)
  --delay DURATION       wait before each answer, e.g. 5ms
  -h, --help             print this help
";

fn pair(value: &str, flag: &str) -> Result<(String, String), String> {
    value
        .split_once('=')
        .map(|(n, v)| (n.to_ascii_lowercase(), v.to_owned()))
        .ok_or_else(|| format!("{flag} needs NAME=VALUE, found {value:?}"))
}

fn parse_args(
    mut args: impl Iterator<Item = String>,
) -> Result<Option<(SidecarAddr, SidecarMode, AuthzRules)>, String> {
    let mut listen = "127.0.0.1:9191".to_owned();
    let mut mode = SidecarMode::Grpc;
    let mut rules = AuthzRules::default();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--listen" => listen = value("--listen")?,
            "--http" => mode = SidecarMode::Http,
            "--allow-header" => {
                rules.allow_if = Some(pair(&value("--allow-header")?, "--allow-header")?)
            }
            "--deny-status" => {
                let v = value("--deny-status")?;
                rules.deny_status = v.parse().map_err(|_| format!("bad --deny-status {v:?}"))?;
            }
            "--deny-body" => rules.deny_body = value("--deny-body")?,
            "--add-header" => rules
                .add_headers
                .push(pair(&value("--add-header")?, "--add-header")?),
            "--delay" => {
                let v = value("--delay")?;
                rules.delay = parse_delay(&v).ok_or_else(|| format!("bad --delay {v:?}"))?;
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let addr = match listen.strip_prefix("unix:") {
        Some(path) => SidecarAddr::Unix(PathBuf::from(path)),
        None => SidecarAddr::Tcp(
            listen
                .parse()
                .map_err(|e| format!("bad --listen address {listen:?}: {e}"))?,
        ),
    };
    Ok(Some((addr, mode, rules)))
}

fn parse_delay(value: &str) -> Option<Duration> {
    let (number, unit) = value.split_at(value.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = number.parse().ok()?;
    match unit {
        "us" => Some(Duration::from_micros(n)),
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        _ => None,
    }
}

fn main() -> ExitCode {
    let (addr, mode, rules) = match parse_args(std::env::args().skip(1)) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprint!("authz-sidecar: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // One thread: a sidecar shares its host with the proxy, and the benchmarks pin it.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("authz-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match AuthzSidecar::start(addr.clone(), mode, rules).await {
            Ok(sidecar) => {
                eprintln!("authz-sidecar listening on {:?} ({mode:?})", sidecar.addr());
                std::future::pending::<()>().await;
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("authz-sidecar: cannot listen on {addr:?}: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
