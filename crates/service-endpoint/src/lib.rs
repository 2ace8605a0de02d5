//! Where a service beside the proxy listens: a TCP address or a Unix socket.
//!
//! The proxy's own clients (the ext_authz client, the xDS client) reach their services by
//! one of the two; this is the one type they share, so a config names either the same way
//! (`IP:PORT` or `unix:/path`) and shows it back the same way.
//!
//! ```
//! use service_endpoint::Endpoint;
//!
//! let sidecar = Endpoint::Unix("/run/authz.sock".into());
//! assert_eq!(sidecar.to_string(), "unix:/run/authz.sock");
//! let server = Endpoint::Tcp("127.0.0.1:18000".parse().unwrap());
//! assert_eq!(server.to_string(), "127.0.0.1:18000");
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

/// A TCP address or a Unix socket's path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::fmt::Display for Endpoint {
    /// As a config writes it: `IP:PORT` or `unix:/path`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Tcp(addr) => write!(f, "{addr}"),
            Endpoint::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}
