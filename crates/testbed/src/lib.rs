//! Servers that Legate's integration tests, its `demo` command and its benchmarks point the
//! proxy at.
//!
//! * [`NoopUpstream`]: a hyper server speaking HTTP/1.1 and cleartext HTTP/2 (prior knowledge)
//!   on one port. Each request picks its response through `x-noop-*` headers, so a test
//!   states what the origin should do right in the request it sends through the proxy.
//! * [`FailingOrigin`]: origins that break at the TCP level ([`FailureMode`]), for the
//!   proxy's 502 and timeout paths.
//! * [`AuthzSidecar`]: an external authorization service (Envoy's gRPC protocol or plain
//!   HTTP) whose decisions follow [`AuthzRules`], over TCP or a Unix socket.
//! * [`ExtProcessor`]: an external processor (Envoy's ext_proc `Process` stream) that changes
//!   headers and bodies, answers requests itself, hangs or fails, by the request's path.
//! * [`RateLimitService`]: a rate limit service (Envoy's `ShouldRateLimit`) counting hits per
//!   domain and descriptor in memory, up to a limit.
//! * [`DnsServer`]: a DNS server whose answers a test changes while the proxy resolves them.
//! * [`ManagementServer`]: an xDS management server (ADS, state of the world and incremental)
//!   whose resources a test sets while clients are connected; it records every request.
//! * [`OtlpCollector`]: an OpenTelemetry collector (OTLP traces over gRPC and HTTP) that
//!   keeps the spans it receives, and can stall or refuse exports on demand.
//! * [`h3_client`]: an HTTP/3 client on quinn (windows of the caller's, 0-RTT), and
//!   [`quic_hold`]: a UDP relay that holds back a QUIC client's last handshake packets.
//! * [`pattern_bytes`] / [`pattern_sha256`]: the deterministic bodies both sides use, so a
//!   test can check a body of any size by digest.
//!
//! # Request headers the no-op upstream obeys
//!
//! | header | effect |
//! |---|---|
//! | `x-noop-delay: 20ms` | wait before the response head (`250us`, `20ms`, `1s`, `2m`; bare number = ms) |
//! | `x-noop-status: 503` | response status, 200 to 999 (default 200) |
//! | `x-noop-size: 4096` | body of that many [`pattern_bytes`], streamed in chunks of at most 64 KiB |
//! | `x-noop-chunked: 1` | no `content-length` (chunked on HTTP/1.1) |
//! | `x-noop-echo: headers` | body lists the request line and headers, one `name: value` a line |
//! | `x-noop-echo: body` | streams the request body back as it arrives |
//! | `x-noop-read-rate: 1048576` | reads the request body at no more than that many bytes a second |
//! | `x-noop-response-header: content-type: text/html` | sets that response header (repeatable) |
//!
//! Without any, the body is a fixed 100-byte text. A bad value gets a plain-text 400 naming
//! the header. The request body is read and hashed before answering (except when echoed) and
//! reported in `x-noop-request-bytes` and `x-noop-request-sha256`; `x-noop-served-by` carries
//! the upstream's listening address.
//!
//! # Example
//!
//! ```
//! use http_body_util::{BodyExt, Empty};
//! use hyper_util::rt::TokioIo;
//! use testbed::{NoopUpstream, pattern_bytes, pattern_sha256};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let upstream = NoopUpstream::bind("127.0.0.1:0".parse()?).await?;
//!
//! let tcp = tokio::net::TcpStream::connect(upstream.local_addr()).await?;
//! let (mut client, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
//! tokio::spawn(conn);
//!
//! let request = http::Request::get("/")
//!     .header("x-noop-size", "100000")
//!     .body(Empty::<bytes::Bytes>::new())?;
//! let response = client.send_request(request).await?;
//! assert_eq!(response.headers()["x-noop-request-sha256"], pattern_sha256(0).as_str());
//! let body = response.into_body().collect().await?.to_bytes();
//! assert_eq!(body, pattern_bytes(0, 100_000));
//! assert_eq!(upstream.requests(), 1);
//!
//! upstream.shutdown();
//! # Ok(())
//! # }
//! ```

mod authz;
mod dns;
mod duration;
mod ext_proc;
mod failing;
pub mod h3_client;
mod handle;
mod noop;
mod options;
mod otlp;
mod pattern;
pub mod quic_hold;
mod ratelimit;
pub mod resources;
mod signal;
pub mod xds;

pub use authz::{AuthzRules, AuthzSidecar, SidecarAddr, SidecarMode};
pub use dns::DnsServer;
pub use ext_proc::ExtProcessor;
pub use failing::{FailingOrigin, FailureMode};
pub use handle::NoopHandle;
pub use noop::NoopUpstream;
pub use otlp::{Caller, CollectorMode, OtlpCollector, ReceivedLog, ReceivedSpan};
pub use pattern::{pattern_bytes, pattern_sha256};
pub use ratelimit::{RateLimitCall, RateLimitService};
pub use signal::{StopSignal, serve_until_stopped};
pub use xds::ManagementServer;
