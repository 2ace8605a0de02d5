//! The `tls` sections of listeners and clusters. Certificate and key files are read and
//! parsed here too, so that `legate validate` and a start with a bad file fail the same way.

use std::collections::HashSet;
use std::path::PathBuf;

use crate::*;
use crate::{RawClusterTls, RawListenerTls};

pub(crate) fn listener_tls(
    raw: RawListenerTls,
    path: &str,
) -> Result<ListenerTlsConfig, ConfigError> {
    if raw.certificates.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.certificates"),
            "expected at least one certificate",
        ));
    }
    let mut seen = HashSet::new();
    let mut certificates = Vec::with_capacity(raw.certificates.len());
    for (i, cert) in raw.certificates.into_iter().enumerate() {
        let at = format!("{path}.certificates[{i}]");
        let mut server_names = Vec::with_capacity(cert.server_names.len());
        for (j, name) in cert.server_names.iter().enumerate() {
            let name = server_name(name, &format!("{at}.server_names[{j}]"))?;
            if !seen.insert(name.clone()) {
                return Err(ConfigError::invalid(
                    format!("{at}.server_names[{j}]"),
                    "this name is already given to another certificate",
                ));
            }
            server_names.push(name);
        }
        certificates.push(CertificateConfig {
            cert_chain: file(cert.cert_chain, &format!("{at}.cert_chain"))?,
            private_key: file(cert.private_key, &format!("{at}.private_key"))?,
            server_names,
        });
    }
    if certificates
        .iter()
        .filter(|c| c.server_names.is_empty())
        .count()
        > 1
    {
        return Err(ConfigError::invalid(
            format!("{path}.certificates"),
            "at most one certificate may leave out `server_names` (it is the default)",
        ));
    }
    let unknown_server_name = match raw.unknown_server_name.as_deref() {
        None | Some("default") => UnknownServerName::Default,
        Some("reject") => UnknownServerName::Reject,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.unknown_server_name"),
                format!("expected `default` or `reject`, found `{other}`"),
            ));
        }
    };
    let alpn = match raw.alpn {
        None => vec![AlpnProtocol::Http2, AlpnProtocol::Http11],
        Some(list) => {
            let mut alpn = Vec::with_capacity(list.len());
            for (i, p) in list.iter().enumerate() {
                let protocol = match p.as_str() {
                    "h2" => AlpnProtocol::Http2,
                    "http/1.1" => AlpnProtocol::Http11,
                    other => {
                        return Err(ConfigError::invalid(
                            format!("{path}.alpn[{i}]"),
                            format!("expected `h2` or `http/1.1`, found `{other}`"),
                        ));
                    }
                };
                if !alpn.contains(&protocol) {
                    alpn.push(protocol);
                }
            }
            alpn
        }
    };
    let client_certificate = raw
        .client_certificate
        .map(|c| -> Result<_, ConfigError> {
            Ok(ClientCertificateConfig {
                ca: file(c.ca, &format!("{path}.client_certificate.ca"))?,
                required: c.required.unwrap_or(true),
            })
        })
        .transpose()?;
    let session_cache_size = match raw.session_cache_size {
        None => DEFAULT_SESSION_CACHE_SIZE,
        Some(n @ 0..=10_000_000) => n as usize,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.session_cache_size"),
                format!("expected 0 to 10000000 sessions, found {other}"),
            ));
        }
    };
    let config = ListenerTlsConfig {
        certificates,
        unknown_server_name,
        min_version: version(raw.min_version.as_deref(), &format!("{path}.min_version"))?,
        alpn,
        session_tickets: raw.session_tickets.unwrap_or(true),
        session_cache_size,
        handshake_timeout: crate::values::positive(
            raw.handshake_timeout.unwrap_or(DEFAULT_HANDSHAKE_TIMEOUT),
            &format!("{path}.handshake_timeout"),
        )?,
        client_certificate,
    };
    crate::tls::material::check_listener(&config)
        .map_err(|e| ConfigError::invalid(path, e.to_string()))?;
    Ok(config)
}

/// TLS to an OpenTelemetry collector at `endpoint`: for `https://`, the settings given (the
/// keys of a cluster's `tls`), the system's roots and the URL's host as the name where they
/// say nothing; `None` for `http://`, which takes no `tls`.
pub(crate) fn collector_tls(
    endpoint: &http::Uri,
    raw: Option<RawClusterTls>,
    path: &str,
) -> Result<Option<ClusterTlsConfig>, ConfigError> {
    match (endpoint.scheme_str(), raw) {
        (Some("https"), raw) => {
            let mut raw = raw.unwrap_or_default();
            if raw.server_name.is_none() {
                let host = endpoint.host().unwrap_or_default();
                let host = host.trim_start_matches('[').trim_end_matches(']');
                raw.server_name = Some(host.to_owned());
            }
            cluster_tls(raw, path).map(Some)
        }
        (_, Some(_)) => Err(ConfigError::invalid(
            path,
            "TLS to a collector needs an `https://` endpoint",
        )),
        (_, None) => Ok(None),
    }
}

pub(crate) fn cluster_tls(raw: RawClusterTls, path: &str) -> Result<ClusterTlsConfig, ConfigError> {
    let server_name = match raw.server_name {
        None => None,
        Some(name) => {
            if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() {
                return Err(ConfigError::invalid(
                    format!("{path}.server_name"),
                    format!("expected a DNS name or an IP address, found `{name}`"),
                ));
            }
            Some(name)
        }
    };
    let client_certificate = raw
        .client_certificate
        .map(|c| -> Result<_, ConfigError> {
            Ok(KeyPairConfig {
                cert_chain: file(
                    c.cert_chain,
                    &format!("{path}.client_certificate.cert_chain"),
                )?,
                private_key: file(
                    c.private_key,
                    &format!("{path}.client_certificate.private_key"),
                )?,
            })
        })
        .transpose()?;
    let config = ClusterTlsConfig {
        ca: raw
            .ca
            .map(|ca| file(ca, &format!("{path}.ca")))
            .transpose()?,
        server_name,
        client_certificate,
        min_version: version(raw.min_version.as_deref(), &format!("{path}.min_version"))?,
        subject_alt_names: crate::tls::san::check(
            &raw.subject_alt_names,
            &format!("{path}.subject_alt_names"),
        )?,
        auto_host_sni: raw.auto_host_sni.unwrap_or(false),
    };
    crate::tls::material::check_cluster(&config)
        .map_err(|e| ConfigError::invalid(path, e.to_string()))?;
    Ok(config)
}

/// A file path, or the PEM text itself.
fn file(value: String, path: &str) -> Result<PemSource, ConfigError> {
    if value.is_empty() {
        return Err(ConfigError::invalid(
            path,
            "expected a file path or PEM text",
        ));
    }
    Ok(if value.trim_start().starts_with("-----BEGIN ") {
        PemSource::Inline(value.into())
    } else {
        PemSource::File(PathBuf::from(value))
    })
}

fn version(value: Option<&str>, path: &str) -> Result<TlsVersion, ConfigError> {
    match value {
        None | Some("1.2") => Ok(TlsVersion::Tls12),
        Some("1.3") => Ok(TlsVersion::Tls13),
        Some(other) => Err(ConfigError::invalid(
            path,
            format!("expected \"1.2\" or \"1.3\", found `{other}`"),
        )),
    }
}

/// `api.example.com` or `*.example.com`, lowercase; a wildcard covers exactly one label.
fn server_name(value: &str, path: &str) -> Result<ServerNameMatch, ConfigError> {
    let lower = value.to_ascii_lowercase();
    if !super::is_host_name(&lower) {
        return Err(ConfigError::invalid(
            path,
            format!(
                "expected a name such as `api.example.com` or `*.example.com`, found `{value}`"
            ),
        ));
    }
    let (wildcard, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest.to_owned()),
        None => (false, lower),
    };
    Ok(if wildcard {
        ServerNameMatch::Wildcard(name)
    } else {
        ServerNameMatch::Exact(name)
    })
}

/// TLS to the service at `address`: a TCP address only.
pub(crate) fn service_tls(
    raw: Option<crate::tls::raw::RawClusterTls>,
    address: &str,
    path: &str,
) -> Result<Option<crate::ClusterTlsConfig>, ConfigError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let at = format!("{path}.tls");
    if address.starts_with("unix:") {
        return Err(ConfigError::invalid(
            at,
            "TLS is for a TCP address, not a Unix socket",
        ));
    }
    cluster_tls(raw, &at).map(Some)
}
