//! The `legate` command: run the proxy from a config file, check a config, or run a demo.

use std::io::IsTerminal;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[cfg(feature = "demo")]
mod demo;

use anyhow::Context;
use clap::{Parser, Subcommand};
use proxy_core::{Config, Predecessor, Server, StartOptions, usable_cores};

#[derive(Parser)]
#[command(
    name = "legate",
    version,
    about = "An edge reverse proxy for HTTP/1.1 and HTTP/2"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    /// Config file to run.
    #[arg(short, long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Worker threads; overrides the config's `concurrency` (default: usable CPUs).
    #[arg(long, value_name = "N")]
    concurrency: Option<NonZeroUsize>,
    /// Answer a new binary on this Unix socket: it takes the listening sockets, then this
    /// process drains and exits (see `--upgrade-from`).
    #[arg(long, value_name = "PATH")]
    upgrade_socket: Option<PathBuf>,
    /// Upgrade the proxy listening on this Unix socket (its `--upgrade-socket`): take its
    /// listening sockets, start serving, then tell it to drain.
    #[arg(long, value_name = "PATH", requires = "config")]
    upgrade_from: Option<PathBuf>,
    /// The process log on stderr: `text` lines, or `json` (one object a line, for log
    /// pipelines); also `LEGATE_LOG_FORMAT`, which the subcommands take too. `RUST_LOG` sets
    /// the level (default `info`).
    #[arg(long, value_enum, default_value_t = LogStyle::Text, env = "LEGATE_LOG_FORMAT")]
    log_format: LogStyle,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogStyle {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Ask a running proxy's admin server whether it is ready: exit 0 on `GET /ready` 200, 1
    /// otherwise (for a container's HEALTHCHECK, where no HTTP client is installed).
    Ready {
        /// The admin server's address.
        #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:9901")]
        admin: std::net::SocketAddr,
    },
    /// Check a config file and exit: 0 if it is valid, 1 with the reason if not.
    Validate {
        #[arg(short, long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Run a proxy on 127.0.0.1 in front of a built-in no-op upstream.
    #[cfg(feature = "demo")]
    Demo {
        /// Port for the proxy's listener.
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Port for its TLS listener, TCP and UDP (HTTP/3); 0 picks a free one.
        #[arg(long, default_value_t = 8443)]
        tls_port: u16,
        /// Worker threads (default: usable CPUs).
        #[arg(long, value_name = "N")]
        concurrency: Option<NonZeroUsize>,
        /// Port for the admin server (0 picks a free one).
        #[arg(long, default_value_t = 9901)]
        admin_port: u16,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match cli.log_format {
        LogStyle::Text => log.with_ansi(std::io::stderr().is_terminal()).init(),
        // `{"timestamp":..,"level":..,"target":..,"message":..,"addr":..}`: the event's fields
        // beside its message, not nested.
        LogStyle::Json => log.json().flatten_event(true).with_ansi(false).init(),
    }
    // Before the config is read: the overload manager's connection limit follows it.
    if let Some((before, after)) = proxy_core::raise_open_file_limit()
        && after > before
    {
        tracing::debug!(before, after, "raised the open-file limit");
    }
    let result = match cli.command {
        Some(Command::Validate { config }) => validate(&config),
        Some(Command::Ready { admin }) => ready(admin),
        #[cfg(feature = "demo")]
        Some(Command::Demo {
            port,
            tls_port,
            concurrency,
            admin_port,
        }) => demo::demo(port, tls_port, admin_port, concurrency),
        None => match &cli.config {
            Some(path) => run_file(path, &cli),
            None => Err(anyhow::anyhow!(
                "no config given: run `legate -c FILE`, or `legate demo` to try it out"
            )),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// Needs only the configuration crate: the same checks as a start, TLS files loaded included.
fn validate(path: &Path) -> anyhow::Result<()> {
    let config = config::Config::load(path)?;
    println!(
        "{}: ok ({} listeners, {} clusters)",
        path.display(),
        config.listeners.len(),
        config.clusters.len()
    );
    Ok(())
}

/// `GET /ready` on the admin server, within two seconds: `Ok` on 200.
fn ready(admin: std::net::SocketAddr) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let limit = std::time::Duration::from_secs(2);
    let mut stream = std::net::TcpStream::connect_timeout(&admin, limit)
        .with_context(|| format!("cannot reach the admin server at {admin}"))?;
    stream.set_read_timeout(Some(limit))?;
    stream.set_write_timeout(Some(limit))?;
    stream.write_all(b"GET /ready HTTP/1.1\r\nhost: legate\r\nconnection: close\r\n\r\n")?;
    let mut answer = Vec::new();
    // The status line and a little of the body say all there is.
    let _ = stream.take(4096).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    let status = answer.split_whitespace().nth(1).unwrap_or("");
    let said = answer
        .split_once("\r\n\r\n")
        .map_or("", |(_, body)| body.lines().next().unwrap_or(""));
    if status == "200" {
        println!("{said}");
        Ok(())
    } else {
        anyhow::bail!("not ready: {status} {said}")
    }
}

fn run_file(path: &Path, cli: &Cli) -> anyhow::Result<()> {
    let config = Config::load(path)?;
    let mut options = StartOptions::default().config_file(path);
    let mut upgrade = Upgrade {
        from: None,
        socket: cli.upgrade_socket.clone(),
    };
    if let Some(from) = &cli.upgrade_from {
        let mut predecessor = Predecessor::connect(from)?;
        options = options.inherit_from(&mut predecessor);
        upgrade.from = Some(predecessor);
    }
    run(config, cli.concurrency, options, upgrade)
}

/// A binary upgrade: the process this one takes over from, and where this one waits for its
/// own successor.
#[derive(Default)]
struct Upgrade {
    from: Option<Predecessor>,
    socket: Option<PathBuf>,
}

fn run(
    config: Config,
    concurrency: Option<NonZeroUsize>,
    options: StartOptions,
    upgrade: Upgrade,
) -> anyhow::Result<()> {
    let workers = concurrency.map_or_else(|| config.worker_count(), NonZeroUsize::get);
    // Signals are registered before anything announces readiness: a SIGTERM sent the moment
    // the proxy says it is up must start a drain, not kill the process.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the signal runtime")?;
    let (mut signals, mut hangup, mut usr1) = {
        let _entered = runtime.enter();
        (ShutdownSignals::new(), reload_signal(), reopen_signal())
    };
    let server = Server::start_with(config, workers, options)?;
    tracing::info!(
        workers = server.workers(),
        usable_cores = usable_cores(),
        "legate started"
    );
    for (name, addr) in server.addresses() {
        tracing::info!(listener = %name, %addr, "listening");
    }
    if let Some(addr) = server.admin_address() {
        tracing::info!(%addr, "admin server listening");
    }
    if let Some(predecessor) = upgrade.from {
        // Serving now: the old process may stop accepting. If it cannot be told, both serve
        // the same sockets until it is stopped by hand.
        match predecessor.retire() {
            Ok(()) => tracing::info!("upgrade: the previous process is draining"),
            Err(error) => {
                tracing::error!(%error, "upgrade: cannot tell the previous process to drain")
            }
        }
    }
    let mut successor = match &upgrade.socket {
        Some(path) => Some(
            server
                .listen_for_upgrades(path)
                .with_context(|| format!("upgrade socket {}", path.display()))?,
        ),
        None => None,
    };
    tracing::info!("legate ready");
    // One runtime and one registration for both waits, so a second signal during the drain
    // is never missed.
    let forced = runtime.block_on(async {
        loop {
            tokio::select! {
                () = signals.recv() => break,
                Some(()) = async { hangup.as_mut()?.recv().await } => {
                    tracing::info!("SIGHUP: reloading the config");
                    // The outcome is logged, counted and shown in /config_dump by the reload.
                    let _ = server.reload().await;
                }
                Some(()) = async { usr1.as_mut()?.recv().await } => {
                    tracing::info!("SIGUSR1: reopening the access logs");
                    // Each file's outcome is logged.
                    let _ = server.reopen_logs();
                }
                taken = async {
                    match successor.as_mut() {
                        Some(taken) => taken.await,
                        None => std::future::pending().await,
                    }
                } => {
                    successor = None;
                    if taken.is_ok() {
                        tracing::info!("upgrade: a new process took over");
                        break;
                    }
                }
            }
        }
        tracing::info!("draining: no new connections, waiting for requests in flight");
        let drained = std::thread::spawn(move || server.drain_and_join());
        // A second signal while draining exits at once.
        tokio::select! {
            _ = signals.recv() => true,
            _ = async {
                while !drained.is_finished() {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            } => false,
        }
    });
    if forced {
        anyhow::bail!("second signal: exiting without waiting for the drain");
    }
    tracing::info!("drained; exiting");
    Ok(())
}

/// SIGHUP, which reloads the config file.
fn reload_signal() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::hangup())
        .map_err(
            |err| tracing::warn!(error = %err, "cannot watch SIGHUP; reload with POST /reload"),
        )
        .ok()
}

/// SIGUSR1, which reopens the access log files (after logrotate moved them), as Envoy's. Its
/// default action ends the process, so it is registered before the proxy says it is ready.
fn reopen_signal() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::user_defined1())
        .map_err(|err| {
            tracing::warn!(error = %err, "cannot watch SIGUSR1; reopen logs with POST /reopen_logs")
        })
        .ok()
}

/// SIGTERM and SIGINT, registered once.
struct ShutdownSignals {
    term: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    fn new() -> Self {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate())
            .map_err(|err| {
                tracing::warn!(error = %err, "cannot watch SIGTERM; only Ctrl-C will stop the proxy")
            })
            .ok();
        Self { term }
    }

    async fn recv(&mut self) {
        match &mut self.term {
            Some(term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}
