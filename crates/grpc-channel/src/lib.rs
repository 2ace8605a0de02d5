//! One multiplexed HTTP/2 connection to a gRPC service beside the proxy, and unary calls on it.
//!
//! The proxy asks services on the same host (an authorization service, a rate limit service)
//! about most requests. Done well that costs one loopback round trip, so a [`Channel`] keeps
//! exactly one HTTP/2 connection (make one per worker thread), writes the calls made in one
//! event-loop turn in one system call, makes the connection again after it fails with backoff
//! (while the service is down, calls fail at once instead of each paying a connect attempt),
//! and reads a unary answer as its one message and its `grpc-status`; a streaming call
//! ([`DuplexCall`]) sends and reads messages one at a time. The caller encodes and
//! decodes the messages (prost) and bounds each call by its own timeout.
//!
//! ```no_run
//! use grpc_channel::{Channel, Endpoint, call_head, unary_frame};
//!
//! # async fn run() -> Result<(), grpc_channel::ChannelError> {
//! let channel = Channel::new(Endpoint::Tcp("127.0.0.1:8081".parse().unwrap()));
//! let uri = http::Uri::from_static("http://ratelimit/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit");
//! let request = unary_frame(b"\x0a\x03web");
//! let answer = channel.call(call_head(uri), request).await?;
//! let message: bytes::Bytes = grpc_channel::read_unary(answer, 4 << 20).await?;
//! # Ok(())
//! # }
//! ```

mod batched_writes;
mod channel;
mod duplex;
mod frame;
mod status;
mod transport;

pub use channel::{CallError, Channel, call_head, read_unary};
pub use duplex::{DuplexCall, DuplexReceiver, DuplexSender};
pub use frame::{FRAME_PREFIX, unary_frame};
pub use service_endpoint::Endpoint;
pub use status::{code_of_http_status, grpc_status};
pub use transport::{Backoff, Stream, connect};

/// TLS to the service (over TCP): the client config (its roots, its client certificate) and
/// the name the service's certificate must carry. The caller sets ALPN.
#[derive(Clone)]
pub struct Tls {
    pub config: std::sync::Arc<rustls::ClientConfig>,
    pub server_name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

pub(crate) fn transport_error(error: &h2::Error) -> ChannelError {
    ChannelError::Transport(error.to_string())
}

/// Why a call gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("cannot connect to the service at {endpoint}: {source}")]
    Connect {
        endpoint: Endpoint,
        source: std::io::Error,
    },
    #[error("the service at {endpoint} is unreachable; next connect attempt in {retry_in:?}")]
    Backoff {
        endpoint: Endpoint,
        retry_in: std::time::Duration,
    },
    #[error("the connection to the service failed: {0}")]
    Transport(String),
    #[error("the service answered with gRPC status {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
}
