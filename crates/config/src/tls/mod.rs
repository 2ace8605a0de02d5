//! TLS settings of listeners (termination) and clusters (origination), validated.
//!
//! The topic's files, side by side: this one holds the typed settings; `raw.rs` the file's
//! form; `check.rs` the checks (which load the files, `material.rs`); `xds.rs` the mapping of
//! Envoy's TLS transport sockets; `sds.rs` the secrets they name, from the management server;
//! `sds_file.rs` those read from files instead (`path_config_source`).

pub(crate) mod check;
pub mod facts;
pub mod material;
pub mod raw;
pub mod san;
pub mod sds;
pub mod sds_file;
pub mod xds;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Serialize, Serializer};

/// `api.example.com` or `*.example.com` (in any case): a name SNI can be matched against, as
/// certificates, chains and secrets give them.
pub(crate) fn is_host_name(name: &str) -> bool {
    let host = name.strip_prefix("*.").unwrap_or(name);
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// How long a client has to finish the TLS handshake, unless configured.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// TLS sessions a listener remembers for resumption by session id, unless configured.
pub const DEFAULT_SESSION_CACHE_SIZE: usize = 4096;

/// TLS termination on a listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ListenerTlsConfig {
    /// At least one. The default certificate is the one without `server_names` (at most one
    /// may omit them), or the first.
    pub certificates: Vec<CertificateConfig>,
    /// What a client gets whose SNI names no certificate (or that sends none).
    pub unknown_server_name: UnknownServerName,
    pub min_version: TlsVersion,
    /// Protocols offered by ALPN, in order of preference.
    pub alpn: Vec<AlpnProtocol>,
    /// Stateless resumption tickets (TLS 1.2 and 1.3), encrypted with keys that rotate.
    pub session_tickets: bool,
    /// Sessions kept for resumption by id (stateful); 0 turns the cache off.
    pub session_cache_size: usize,
    #[serde(serialize_with = "crate::units::ser_duration")]
    pub handshake_timeout: Duration,
    /// Client certificates (mTLS): asked for, verified against a CA bundle.
    pub client_certificate: Option<ClientCertificateConfig>,
}

impl ListenerTlsConfig {
    /// The index of the default certificate in [`Self::certificates`].
    pub fn default_certificate(&self) -> usize {
        self.certificates
            .iter()
            .position(|c| c.server_names.is_empty())
            .unwrap_or(0)
    }
}

/// A certificate chain with its key, and the SNI names it is served for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CertificateConfig {
    /// PEM: the leaf first, then intermediates.
    pub cert_chain: PemSource,
    /// PEM: PKCS#8, SEC1 (EC) or PKCS#1 (RSA).
    pub private_key: PemSource,
    /// Exact names (`api.example.com`) or wildcards (`*.example.com`, one label), lowercase.
    pub server_names: Vec<ServerNameMatch>,
}

/// An SNI name a certificate answers for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServerNameMatch {
    /// `api.example.com`.
    Exact(String),
    /// `*.example.com` stored as `example.com`: any single label before it.
    Wildcard(String),
}

impl Serialize for ServerNameMatch {
    /// As written: `api.example.com` or `*.example.com`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ServerNameMatch::Exact(name) => s.serialize_str(name),
            ServerNameMatch::Wildcard(parent) => s.collect_str(&format_args!("*.{parent}")),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnknownServerName {
    /// Serve the default certificate.
    Default,
    /// Fail the handshake (`unrecognized_name`).
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AlpnProtocol {
    #[serde(rename = "h2")]
    Http2,
    #[serde(rename = "http/1.1")]
    Http11,
}

impl AlpnProtocol {
    /// The ALPN identifier on the wire.
    pub fn id(self) -> &'static [u8] {
        match self {
            AlpnProtocol::Http2 => b"h2",
            AlpnProtocol::Http11 => b"http/1.1",
        }
    }
}

/// Client certificate verification on a listener.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClientCertificateConfig {
    /// PEM bundle of the CAs client certificates must chain to.
    pub ca: PemSource,
    /// Refuse clients without a certificate; when false a certificate is asked for and
    /// verified if given.
    pub required: bool,
}

/// TLS to a cluster's hosts (and to the management server and collectors).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct ClusterTlsConfig {
    /// PEM bundle to verify the hosts against; `None`: the system's roots.
    #[serde(serialize_with = "ca_or_system")]
    pub ca: Option<PemSource>,
    /// Name sent as SNI and checked against the certificate; `None`: the host's IP address
    /// (checked against the certificate's IP addresses, no SNI sent).
    pub server_name: Option<String>,
    /// Presented when the host asks for a client certificate.
    pub client_certificate: Option<KeyPairConfig>,
    pub min_version: TlsVersion,
    /// The names the host's certificate must have one of (Envoy's
    /// `match_typed_subject_alt_names`), checked instead of `server_name`; empty: the
    /// certificate must be valid for `server_name` (or the host's IP address).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<san::SanMatch>,
    /// Each host's name (its endpoint's `hostname`, or the DNS name it was resolved from),
    /// where it has one, is sent and verified instead of `server_name` (Envoy's
    /// `auto_host_sni`).
    pub auto_host_sni: bool,
}

/// A certificate chain and its private key, PEM.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct KeyPairConfig {
    pub cert_chain: PemSource,
    pub private_key: PemSource,
}

/// Where PEM data comes from: a file (read again by `/reload_certs`), or the text itself,
/// written in place of a path (`"-----BEGIN CERTIFICATE-----\n..."`), as management servers
/// send it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PemSource {
    File(PathBuf),
    Inline(Arc<str>),
}

impl std::fmt::Display for PemSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PemSource::File(path) => write!(f, "{}", path.display()),
            PemSource::Inline(_) => f.write_str("inline PEM"),
        }
    }
}

impl Serialize for PemSource {
    /// The path, or `inline`: never the PEM itself (it may be a private key).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PemSource::File(path) => s.collect_str(&path.display()),
            PemSource::Inline(_) => s.serialize_str("inline"),
        }
    }
}

/// As `/config_dump` shows it: the bundle's path, or `system` (never a `null` that could read
/// as "not verified").
fn ca_or_system<S: serde::Serializer>(ca: &Option<PemSource>, s: S) -> Result<S::Ok, S::Error> {
    match ca {
        Some(source) => source.serialize(s),
        None => s.serialize_str("system"),
    }
}

#[cfg(test)]
mod host_name_tests {
    #[test]
    fn host_names_are_labels_with_at_most_one_leading_wildcard() {
        for good in [
            "api.example.com",
            "*.example.com",
            "API.Example.com",
            "a_b-c.d",
        ] {
            assert!(super::is_host_name(good), "{good}");
        }
        let long_label = format!("{}.com", "a".repeat(64));
        for bad in [
            "",
            "*.",
            "*.*.example.com",
            "www.*.com",
            "a..b",
            "a b.com",
            long_label.as_str(),
        ] {
            assert!(!super::is_host_name(bad), "{bad}");
        }
    }
}
