//! The admin server's settings: where it listens and who may use it.
//!
//! A peer on loopback may use every endpoint. Any other peer needs to be in `allow` (CIDRs)
//! or to present `authorization: Bearer <the token in token_file>`; without either it may
//! only GET the read-only endpoints listed in `open` (`/ready`, `/stats/prometheus` for
//! scrapers). An admin bound beyond loopback must say which of these applies.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use ipnet::IpNet;
use serde::{Deserialize, Serialize, Serializer};

use super::ConfigError;

/// Endpoints that only read, which `open` may list.
pub const READ_ONLY_ENDPOINTS: &[&str] = &[
    "/ready",
    "/stats",
    "/stats/prometheus",
    "/config_dump",
    "/workers",
    "/clusters",
    "/certs",
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AdminConfig {
    pub address: SocketAddr,
    /// Peers besides loopback that may use every endpoint.
    #[serde(serialize_with = "nets")]
    pub allow: Vec<IpNet>,
    /// A bearer token that opens every endpoint to any peer presenting it.
    pub token: Option<AdminToken>,
    /// Read-only endpoints any peer may GET.
    pub open: Vec<String>,
}

/// The admin token and the file it came from. Only the file is ever shown.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    pub file: PathBuf,
    secret: String,
}

impl AdminToken {
    /// Whether `presented` is the token; takes as long whatever the first difference.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let secret = self.secret.as_bytes();
        if presented.len() != secret.len() {
            return false;
        }
        presented
            .iter()
            .zip(secret)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    }
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminToken({})", self.file.display())
    }
}

impl Serialize for AdminToken {
    /// As `token_file`: the path, never the token.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.file.display())
    }
}

fn nets<S: Serializer>(nets: &[IpNet], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(nets.iter().map(ToString::to_string))
}

impl AdminConfig {
    /// Whether `peer` may use every endpoint without a token.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        // A dual-stack socket shows an IPv4 peer as ::ffff:a.b.c.d.
        let peer = peer.to_canonical();
        peer.is_loopback() || self.allow.iter().any(|net| net.contains(&peer))
    }
}

/// `address` already parsed; the rest of `raw` checked here.
pub(crate) fn admin(address: SocketAddr, raw: RawAdmin) -> Result<AdminConfig, ConfigError> {
    let allow = raw
        .allow
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, net)| {
            net.parse::<IpNet>()
                .or_else(|_| net.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| {
                    ConfigError::invalid(
                        format!("admin.allow[{i}]"),
                        format!("expected an address or CIDR such as `10.0.0.0/8`, found `{net}`"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let token = raw
        .token_file
        .map(|file| {
            let text = std::fs::read_to_string(&file).map_err(|e| {
                ConfigError::invalid("admin.token_file", format!("cannot read {file}: {e}"))
            })?;
            let secret = text.trim().to_owned();
            // Sent in a header: visible ASCII only, and long enough not to be guessed.
            if secret.len() < 16 || !secret.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError::invalid(
                    "admin.token_file",
                    format!("{file}: expected a token of at least 16 visible ASCII characters"),
                ));
            }
            Ok(AdminToken {
                file: PathBuf::from(file),
                secret,
            })
        })
        .transpose()?;
    let open = raw.open.unwrap_or_default();
    for (i, path) in open.iter().enumerate() {
        if !READ_ONLY_ENDPOINTS.contains(&path.as_str()) {
            return Err(ConfigError::invalid(
                format!("admin.open[{i}]"),
                format!(
                    "expected a read-only endpoint ({}), found `{path}`",
                    READ_ONLY_ENDPOINTS.join(", ")
                ),
            ));
        }
    }
    if !address.ip().to_canonical().is_loopback()
        && allow.is_empty()
        && token.is_none()
        && open.is_empty()
    {
        return Err(ConfigError::invalid(
            "admin.address",
            format!(
                "{address} is reachable beyond this host: say who may use the admin with `allow` (CIDRs) or `token_file`, or which read-only endpoints are `open`"
            ),
        ));
    }
    Ok(AdminConfig {
        address,
        allow,
        token,
        open,
    })
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    pub address: Option<String>,
    pub enabled: Option<bool>,
    pub allow: Option<Vec<String>>,
    pub token_file: Option<String>,
    pub open: Option<Vec<String>>,
}
