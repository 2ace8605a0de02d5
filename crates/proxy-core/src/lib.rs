//! Legate's data plane.
//!
//! A request travels through these modules, in order:
//!
//! ```text
//! listener/reuse_port.rs   each worker's own SO_REUSEPORT socket and accept loop (worker/)
//! tls/server.rs            TLS handshake on TLS listeners: SNI, ALPN, client certificates
//! conn/                    HTTP/1.1 or HTTP/2 codec for one connection, drain on shutdown
//! http/handler.rs          route, then a direct response or a relayed request
//! router/                  first matching route: host, path prefix or exact path, headers
//! http/headers.rs          hop-by-hop removal, x-forwarded-*, x-request-id
//! cluster/                 the worker's balancer and per-host upstream pools (tls/client.rs)
//! http/body.rs             the response body streamed back
//! ```
//!
//! Starting a proxy from a config:
//!
//! ```no_run
//! use proxy_core::{Config, Server};
//!
//! let config = Config::load("configs/edge.yaml".as_ref())?;
//! let workers = config.worker_count();
//! let server = Server::start(config, workers)?;
//! for (name, addr) in server.addresses() {
//!     println!("{name} listening on {addr}");
//! }
//! server.drain_and_join();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod access_log;
mod admin;
mod catalog;
mod cluster;
pub mod config;
mod conn;
mod error;
mod exec;
mod http;
mod listener;
mod memory;
pub mod router;
mod server;
mod tls;
mod worker;

pub use config::{Config, ConfigError};
pub use error::{ProxyError, ResponseFlag};
pub use server::{Server, StartError};
pub use tls::TlsError;
pub use worker::usable_cores;
