//! What every layer of the request path shares about one exchange: where the connection came
//! from and which listener and worker serve it ([`ConnCtx`]), the request's bookkeeping from
//! head to last response byte ([`InFlight`]), and the request body as it travels upstream
//! ([`RequestBody`]).
//!
//! These types sit below the cluster, filter, HTTP and connection layers so each of those can
//! use them without importing a layer above itself. Nothing here is `Send`: a connection and
//! everything it touches stay on their worker.

pub(crate) mod body_pipe;
mod client;
mod conn;
pub(crate) mod grpc;
mod health;
mod in_flight;
mod metadata;
mod mirror_feed;
mod request_body;
pub(crate) mod request_id;
mod signal;
pub(crate) mod stream_idle;
pub(crate) mod stream_inbox;
pub(crate) mod stream_tunnel;

pub(crate) use client::{Client, ForwardedTrust, X_FORWARDED_FOR, X_FORWARDED_PROTO};
pub(crate) use conn::{
    ClientCertificate, ConnCtx, ListenerCtx, ParkedCtx, Tunnel, TunnelIo, WorkerCtx,
    sleep_until_some,
};
pub(crate) use health::ServerHealth;
pub(crate) use in_flight::{InFlight, refused_head};
pub(crate) use metadata::JwtMetadata;
pub(crate) use request_body::{ProgressClock, Replay, RequestBody};
pub(crate) use signal::{ChainSignals, Signal, SignalWatch};
