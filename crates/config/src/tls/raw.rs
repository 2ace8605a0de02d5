//! TLS settings as the file writes them (serde, unknown keys refused).

use std::time::Duration;

use serde::Deserialize;

use crate::units::de_opt_duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawListenerTls {
    pub certificates: Vec<RawCertificate>,
    pub unknown_server_name: Option<String>,
    pub min_version: Option<String>,
    pub alpn: Option<Vec<String>>,
    pub session_tickets: Option<bool>,
    pub session_cache_size: Option<u64>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub handshake_timeout: Option<Duration>,
    pub client_certificate: Option<RawClientCertificate>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificate {
    pub cert_chain: String,
    pub private_key: String,
    #[serde(default)]
    pub server_names: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientCertificate {
    pub ca: String,
    pub required: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClusterTls {
    pub ca: Option<String>,
    pub server_name: Option<String>,
    pub client_certificate: Option<RawKeyPair>,
    pub min_version: Option<String>,
    /// Names the host's certificate must have one of, checked instead of `server_name`.
    #[serde(default)]
    pub subject_alt_names: Vec<crate::tls::san::RawSanMatch>,
    /// The host's name (its endpoint's `hostname`, or its DNS name) as the name sent and
    /// verified, where it has one.
    pub auto_host_sni: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKeyPair {
    pub cert_chain: String,
    pub private_key: String,
}
