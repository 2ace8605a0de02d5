//! Endpoint addresses (`IP:PORT` or `NAME:PORT`) and a cluster's DNS settings.

use std::net::SocketAddr;

use crate::RawCluster;
use crate::*;

/// `IP:PORT`, `localhost:PORT`, or `NAME:PORT` with a DNS name (resolved while serving).
pub(crate) fn endpoint_address(value: &str, path: &str) -> Result<EndpointAddress, ConfigError> {
    if let Ok(addr) = crate::values::socket_addr(value, path) {
        return Ok(EndpointAddress::Ip(addr));
    }
    let invalid = |why: &str| {
        ConfigError::invalid(
            path,
            format!(
                "expected `IP:PORT` or `NAME:PORT` such as `backend.internal:8080`, found `{value}`: {why}"
            ),
        )
    };
    let (host, port) = value.rsplit_once(':').ok_or_else(|| invalid("no port"))?;
    let port = match port.parse::<u16>() {
        Ok(port) if port > 0 => port,
        _ => return Err(invalid("the port is not a number from 1 to 65535")),
    };
    if !is_dns_name(host) {
        return Err(invalid("not an IP address nor a DNS name"));
    }
    Ok(EndpointAddress::Name {
        host: host.to_ascii_lowercase(),
        port,
    })
}

/// RFC 1123 host names (underscores allowed, as in service names), with an optional final
/// dot; the last label is not all digits, so a mistyped IPv4 address is not taken for a name.
fn is_dns_name(host: &str) -> bool {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > 253 {
        return false;
    }
    let labels_ok = host.split('.').all(|label| {
        (1..=63).contains(&label.len())
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    let last = host.rsplit('.').next().unwrap_or(host);
    labels_ok && !last.bytes().all(|b| b.is_ascii_digit())
}

pub(crate) fn dns_config(raw: &RawCluster, path: &str) -> Result<DnsConfig, ConfigError> {
    let defaults = DnsConfig::default();
    let refresh_rate = raw.dns_refresh_rate.unwrap_or(defaults.refresh_rate);
    if refresh_rate.is_zero() {
        return Err(ConfigError::invalid(
            format!("{path}.dns_refresh_rate"),
            "expected a duration above zero",
        ));
    }
    let min_refresh_rate = raw
        .dns_min_refresh_rate
        .unwrap_or(defaults.min_refresh_rate.min(refresh_rate));
    if min_refresh_rate.is_zero() || min_refresh_rate > refresh_rate {
        return Err(ConfigError::invalid(
            format!("{path}.dns_min_refresh_rate"),
            "expected a duration above zero and at most dns_refresh_rate",
        ));
    }
    let lookup_family = match raw.dns_lookup_family.as_deref() {
        None | Some("v4_preferred") => DnsLookupFamily::V4Preferred,
        Some("v4_only") => DnsLookupFamily::V4Only,
        Some("v6_only") => DnsLookupFamily::V6Only,
        Some("all") => DnsLookupFamily::All,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.dns_lookup_family"),
                format!("expected `v4_preferred`, `v4_only`, `v6_only` or `all`, found `{other}`"),
            ));
        }
    };
    let resolvers = raw
        .dns_resolvers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| resolver(r, &format!("{path}.dns_resolvers[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let logical = raw.logical_dns.unwrap_or(false);
    if logical {
        // As Envoy: one endpoint, and here a name (an address needs no lookup).
        let named = matches!(
            raw.endpoints.as_slice(),
            [endpoint] if endpoint_is_name(endpoint)
        );
        if !named {
            return Err(ConfigError::invalid(
                format!("{path}.logical_dns"),
                "a logical DNS cluster has exactly one endpoint, a name (NAME:PORT)",
            ));
        }
    }
    Ok(DnsConfig {
        refresh_rate,
        min_refresh_rate,
        respect_ttl: raw.respect_dns_ttl.unwrap_or(defaults.respect_ttl),
        lookup_family,
        resolvers,
        logical,
    })
}

/// `IP` (port 53) or `IP:PORT`.
fn resolver(value: &str, path: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(ip) = value.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, 53));
    }
    value.parse::<SocketAddr>().map_err(|_| {
        ConfigError::invalid(
            path,
            format!("expected a DNS server `IP` or `IP:PORT`, found `{value}`"),
        )
    })
}

/// Whether an endpoint as written is a name (`NAME:PORT`), not an address.
fn endpoint_is_name(endpoint: &crate::RawEndpoint) -> bool {
    let address = match endpoint {
        crate::RawEndpoint::Address(address) => address,
        crate::RawEndpoint::Weighted(weighted) => &weighted.address,
    };
    address.parse::<SocketAddr>().is_err()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses_are_told_apart() {
        let parse = |v: &str| endpoint_address(v, "e");
        assert_eq!(
            parse("10.0.0.1:80").unwrap(),
            EndpointAddress::Ip("10.0.0.1:80".parse().unwrap())
        );
        assert_eq!(
            parse("Backend.Internal:8080").unwrap(),
            EndpointAddress::Name {
                host: "backend.internal".into(),
                port: 8080
            }
        );
        assert!(parse("_grpc._tcp.svc.cluster.local.:9000").is_ok());
        for bad in [
            "backend.internal",
            "backend:0",
            "backend:http",
            "300.1.1.1:80",
            "-backend:80",
            "back end:80",
            "http://backend:80",
            "::1:80",
            ":80",
        ] {
            let error = parse(bad).unwrap_err().to_string();
            assert!(
                error.starts_with("e: expected `IP:PORT` or `NAME:PORT`"),
                "{bad}: {error}"
            );
        }
    }
}
