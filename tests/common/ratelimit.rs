//! The real envoyproxy/ratelimit service on Redis, when both are installed (the testbed's
//! `RateLimitService` covers the protocol everywhere).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// envoyproxy/ratelimit and its Redis, ended (by their PIDs) when dropped.
pub struct RealService {
    pub grpc: SocketAddr,
    children: Vec<Child>,
    _dir: super::ScratchDir,
}

impl Drop for RealService {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A free port on 127.0.0.1 for a program that binds it itself (taken back at once).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn on_path(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

/// The real service with `config` (its YAML, for domain `domain`), on a Redis of its own
/// (a Unix socket); `Err` says what is missing: the test then says so and stops.
pub fn real_service(config: &str) -> Result<RealService, String> {
    let ratelimit = std::env::var_os("RATELIMIT_BIN")
        .map(std::path::PathBuf::from)
        .or_else(|| on_path("ratelimit"))
        .filter(|p| p.is_file())
        .ok_or("envoyproxy/ratelimit is not installed (RATELIMIT_BIN or `ratelimit` on PATH; .ci/run builds it)")?;
    let redis = on_path("redis-server").ok_or("redis-server is not installed")?;
    let dir = super::ScratchDir::new();
    let socket = dir.0.join("redis.sock");
    let mut children = Vec::new();
    children.push(
        Command::new(redis)
            .args([
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
                "--unixsocket",
            ])
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start redis-server: {e}"))?,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        if Instant::now() > deadline {
            return Err("redis-server did not open its socket".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let config_dir = dir.0.join("runtime/ratelimit/config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("config.yaml"), config).unwrap();
    let grpc_port = free_port();
    let log = std::fs::File::create(dir.0.join("ratelimit.log")).unwrap();
    children.push(
        Command::new(ratelimit)
            .env("USE_STATSD", "false")
            .env("USE_PROMETHEUS", "false")
            .env("LOG_LEVEL", "warn")
            .env("REDIS_SOCKET_TYPE", "unix")
            .env("REDIS_URL", &socket)
            .env("RUNTIME_ROOT", dir.0.join("runtime"))
            .env("RUNTIME_SUBDIRECTORY", "ratelimit")
            .env("RUNTIME_WATCH_ROOT", "false")
            .env("HOST", "127.0.0.1")
            .env("PORT", free_port().to_string())
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", grpc_port.to_string())
            .env("DEBUG_HOST", "127.0.0.1")
            .env("DEBUG_PORT", free_port().to_string())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot start ratelimit: {e}"))?,
    );
    let grpc: SocketAddr = ([127, 0, 0, 1], grpc_port).into();
    let mut service = RealService {
        grpc,
        children,
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(grpc).is_err() {
        if Instant::now() > deadline || service.children[1].try_wait().ok().flatten().is_some() {
            let log =
                std::fs::read_to_string(service._dir.0.join("ratelimit.log")).unwrap_or_default();
            return Err(format!("ratelimit did not come up: {log}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(service)
}
