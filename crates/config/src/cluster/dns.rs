//! Endpoint addresses, and the settings of clusters whose endpoints are DNS names (Envoy's
//! STRICT_DNS): how often names are resolved again, whether record TTLs shorten that, which
//! address families, and which servers to ask.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::serialize as ser;

/// How often a name is resolved again, unless configured (Envoy's default).
pub const DEFAULT_DNS_REFRESH_RATE: Duration = Duration::from_secs(5);
/// The shortest interval between two resolutions of a name, however short its TTL.
pub const DEFAULT_DNS_MIN_REFRESH_RATE: Duration = Duration::from_secs(1);

/// Where an endpoint is: an address, or a name resolved while serving.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EndpointAddress {
    Ip(SocketAddr),
    /// Every address the name resolves to becomes a host, on `port`.
    Name {
        host: String,
        port: u16,
    },
}

impl EndpointAddress {
    pub fn is_name(&self) -> bool {
        matches!(self, EndpointAddress::Name { .. })
    }
}

impl fmt::Display for EndpointAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointAddress::Ip(addr) => addr.fmt(f),
            EndpointAddress::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl Serialize for EndpointAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// How a cluster's names are resolved. Used only by clusters with a name among their endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DnsConfig {
    /// Names are resolved again this often (`dns_refresh_rate`).
    #[serde(rename = "dns_refresh_rate", serialize_with = "ser::duration")]
    pub refresh_rate: Duration,
    /// With `respect_ttl`, an answer is used until its TTL runs out when that comes sooner than
    /// `refresh_rate`, but names are not resolved more often than this.
    #[serde(rename = "dns_min_refresh_rate", serialize_with = "ser::duration")]
    pub min_refresh_rate: Duration,
    /// Answers are kept (cached) for their TTL, and refreshed when it runs out if that comes
    /// before `refresh_rate`. Off: every refresh asks the servers.
    #[serde(rename = "respect_dns_ttl")]
    pub respect_ttl: bool,
    #[serde(rename = "dns_lookup_family")]
    pub lookup_family: DnsLookupFamily,
    /// The servers asked, in order; empty: the system's (`/etc/resolv.conf`, `/etc/hosts`).
    #[serde(rename = "dns_resolvers")]
    pub resolvers: Vec<SocketAddr>,
    /// Envoy's LOGICAL_DNS: the cluster's one name is one host, reached at the first address
    /// of the latest answer; connections already open stay in use when it changes.
    #[serde(rename = "logical_dns")]
    pub logical: bool,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            refresh_rate: DEFAULT_DNS_REFRESH_RATE,
            min_refresh_rate: DEFAULT_DNS_MIN_REFRESH_RATE,
            respect_ttl: true,
            lookup_family: DnsLookupFamily::V4Preferred,
            resolvers: Vec::new(),
            logical: false,
        }
    }
}

impl DnsConfig {
    /// When to resolve a name again after an answer valid for `ttl`.
    pub fn next_refresh(&self, ttl: Duration) -> Duration {
        if self.respect_ttl {
            ttl.min(self.refresh_rate).max(self.min_refresh_rate)
        } else {
            self.refresh_rate
        }
    }
}

/// Which addresses of a name become hosts (Envoy's `dns_lookup_family`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DnsLookupFamily {
    /// IPv4 addresses if the name has any, else IPv6 (Envoy's default).
    V4Preferred,
    V4Only,
    V6Only,
    /// IPv4 and IPv6 addresses together.
    All,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_ttl_brings_the_refresh_forward_down_to_the_minimum() {
        let dns = DnsConfig::default();
        let s = Duration::from_secs;
        assert_eq!(
            dns.next_refresh(s(300)),
            s(5),
            "refresh_rate caps a long TTL"
        );
        assert_eq!(dns.next_refresh(s(2)), s(2));
        assert_eq!(
            dns.next_refresh(s(0)),
            s(1),
            "never more often than the minimum"
        );
        let fixed = DnsConfig {
            respect_ttl: false,
            ..DnsConfig::default()
        };
        assert_eq!(fixed.next_refresh(s(2)), s(5));
    }
}
