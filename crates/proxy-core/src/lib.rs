//! Legate's data plane.
//!
//! Modules depend on each other one way, each only on those listed before it:
//!
//! ```text
//! header_list, runtime, relay, memory, buffer_pool, box_pool, random, throttle, catalog,
//!             error, access_log, tls, listen, overload, stats_retirement, retire
//!             leaves (the configuration is the `config` crate)
//! trace       the request's W3C trace context and its spans
//! context     what all layers share about an exchange: ConnCtx, InFlight, RequestBody
//! cluster     upstream hosts, pools, breakers, retries
//! router      the route table
//! filters     the HTTP filter chain: ext_authz, local_rate_limit, headers, compression, cors
//! tcp_proxy   a `tcp_proxy` listener's connections: bytes relayed to a cluster's host
//! http        the request path after the codec: route, filters, forward, reply, upgrades
//! conn        one downstream connection: TLS, codec, parking, drain
//! live        the config in force as a generation; reloads build and publish the next one
//! worker      a worker thread: applies generations; listeners, accept loops, hand-offs
//! admin, server
//! ```
//!
//! A request travels through these files, in order (docs/architecture.md has the details):
//!
//! ```text
//! worker/accept.rs         each worker's own SO_REUSEPORT socket and accept loop
//! tls/server.rs            TLS handshake on TLS listeners: SNI, ALPN, client certificates
//! conn/                    HTTP/1.1 or HTTP/2 codec for one connection, drain on shutdown
//!                           (or, on a `tcp_proxy` listener, tcp_proxy.rs: bytes relayed)
//! config::listener::path   the path in its one spelling (normalisation), before anything reads it
//! http/handler.rs          route, filters, then a direct response or a relayed request
//! router/                  first matching route: host, path prefix or exact path, headers;
//!                           found by hash and radix tree (index.rs), not by a scan
//! filters/mod.rs           the request phases of the listener's filters, in order
//! http/upgrade.rs          an upgrade the route allows (WebSocket): bytes relayed after 101
//! http/rewrite.rs          hop-by-hop removal, x-forwarded-*, the upstream's authority
//! cluster/forward.rs       host pick, admission, timeout, retries (cluster/retry.rs)
//! cluster/host.rs          the try on the host's pool (h1_pool.rs, h2_conn.rs)
//! filters/mod.rs           the response phases, in reverse (filters/body.rs: compression)
//! filters/response_body.rs the response body streamed back
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
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod bench;
mod box_pool;
mod buffer_pool;
mod catalog;
mod cluster;
mod conn;
mod context;
mod error;
mod filters;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod header_list;
mod http;
mod listen;
mod live;
mod memory;
pub mod overload;
mod pseudo_headers;
mod random;
mod relay;
mod retire;
pub mod router;
mod runtime;
mod server;
mod sleep_pool;
mod stats_retirement;
mod tcp_proxy;
mod throttle;
mod tls;
mod trace;
mod worker;

pub use config::machine::{raise_open_file_limit, usable_cores};
pub use config::{self, Config, ConfigError};
pub use error::{Overflow, ProxyError, ResponseFlag};
pub use live::binary_upgrade::Predecessor;
pub use live::{BuildError, ReloadError, ReloadReport};
pub use server::{Server, StartError, StartOptions};
pub use tls::TlsError;
