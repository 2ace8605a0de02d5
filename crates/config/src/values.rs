//! Checks of values every topic shares: names, addresses, positive durations, limits. Each
//! returns the value or a [`ConfigError`] naming the key path.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use crate::*;

pub(crate) fn name(value: String, path: &str) -> Result<String, ConfigError> {
    let ok = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(value)
    } else {
        Err(ConfigError::invalid(
            format!("{path}.name"),
            format!(
                "expected a non-empty name of letters, digits, `-`, `_` or `.`, found `{value}`"
            ),
        ))
    }
}

/// A name from a management server: control planes use `|`, `:`, `/` and more
/// (`outbound|80||web.default.svc.cluster.local`), so anything visible is taken.
pub(crate) fn dynamic_name(value: String, path: &str) -> Result<String, ConfigError> {
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(value)
    } else {
        Err(ConfigError::invalid(
            format!("{path}.name"),
            format!("expected a non-empty name of visible ASCII characters, found `{value}`"),
        ))
    }
}

/// Where a service beside the proxy listens: `IP:PORT` or `unix:/path/to/socket`.
pub(crate) fn service_endpoint(value: &str, path: &str) -> Result<ServiceEndpoint, ConfigError> {
    if let Some(socket) = value.strip_prefix("unix:") {
        if socket.is_empty() {
            return Err(ConfigError::invalid(
                path,
                "expected a socket path after `unix:`",
            ));
        }
        return Ok(ServiceEndpoint::Unix(std::path::PathBuf::from(socket)));
    }
    socket_addr(value, path).map(ServiceEndpoint::Tcp)
}

/// `IP:PORT`, `[IPv6]:PORT` or `localhost:PORT`. Other host names are refused rather than
/// resolved, so that loading a config never waits on DNS.
pub(crate) fn socket_addr(value: &str, path: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = value.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Some(port) = value.strip_prefix("localhost:")
        && let Ok(port) = port.parse::<u16>()
    {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    Err(ConfigError::invalid(
        path,
        format!("expected an address `IP:PORT` such as `127.0.0.1:8080`, found `{value}`"),
    ))
}

/// `per_connection_buffer_limit_bytes`: default 32 KiB. At least one HTTP/2 frame (16 KiB),
/// at most 256 MiB (HTTP/2 windows stop at 2 GiB; beyond that it is no longer a bound).
pub(crate) fn buffer_limit(value: Option<u64>, path: &str) -> Result<u32, ConfigError> {
    const MIN: u64 = 16 * 1024;
    const MAX: u64 = 256 * 1024 * 1024;
    match value {
        None => Ok(DEFAULT_BUFFER_LIMIT),
        Some(bytes @ MIN..=MAX) => Ok(bytes as u32),
        Some(other) => Err(ConfigError::invalid(
            path,
            format!("expected 16KiB to 256MiB, found {other} bytes"),
        )),
    }
}

pub(crate) fn positive(
    d: std::time::Duration,
    path: &str,
) -> Result<std::time::Duration, ConfigError> {
    if d.is_zero() {
        Err(ConfigError::invalid(path, "expected a duration above zero"))
    } else {
        Ok(d)
    }
}

/// A connection limit: at least 1 when given.
pub(crate) fn limit(value: Option<u64>, path: &str) -> Result<Option<usize>, ConfigError> {
    match value {
        None => Ok(None),
        Some(0) => Err(ConfigError::invalid(
            path,
            "expected at least 1 (leave it out for no limit)",
        )),
        Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
    }
}

/// An HTTP/2 flow-control window: 65535 (the protocol's initial window) to 2^31 - 1.
pub(crate) fn window(value: Option<u32>, path: &str) -> Result<Option<u32>, ConfigError> {
    match value {
        Some(v) if !(65_535..=0x7fff_ffff).contains(&v) => Err(ConfigError::invalid(
            path,
            format!("expected 65535 to 2147483647 (bytes), found {v}"),
        )),
        other => Ok(other),
    }
}
