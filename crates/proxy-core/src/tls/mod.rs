//! TLS with rustls: termination on listeners ([`ServerTls`]) and origination to clusters
//! ([`UpstreamTls`]).
//!
//! The material (certificates, keys, CA bundles) and the crypto provider come from
//! `config::tls::material`, which validation uses to check the same files.

mod client;
mod server;

use std::sync::Arc;

pub use config::tls::material::TlsError;

pub(crate) use client::{
    UpstreamIo, UpstreamTls, UpstreamTransports, collector_tls, grpc_service_tls, service_tls,
    system_roots,
};
pub(crate) use server::{Handshake, ServerTls, TlsListeners};

/// Session-ticket encryption with keys that rotate (every 6 hours), from the provider.
fn ticketer() -> Result<Arc<dyn rustls::server::ProducesTickets>, rustls::Error> {
    #[cfg(feature = "aws-lc-rs")]
    return rustls::crypto::aws_lc_rs::Ticketer::new();
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return rustls::crypto::ring::Ticketer::new();
}
