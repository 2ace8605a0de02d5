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

/// Envoy's `retry_on` conditions, by name (`{path}.retry_on`); at least one.
pub(crate) fn retry_conditions(list: &[String], path: &str) -> Result<RetryOn, ConfigError> {
    let mut on = RetryOn::default();
    for (i, condition) in list.iter().enumerate() {
        let flag = match condition.as_str() {
            "connect-failure" => &mut on.connect_failure,
            "refused-stream" => &mut on.refused_stream,
            "reset" => &mut on.reset,
            "reset-before-request" => &mut on.reset_before_request,
            "retriable-headers" => &mut on.retriable_headers,
            "5xx" => &mut on.server_error,
            "gateway-error" => &mut on.gateway_error,
            "retriable-status-codes" => &mut on.retriable_status_codes,
            "retriable-4xx" => &mut on.retriable_4xx,
            "cancelled" => &mut on.grpc_cancelled,
            "deadline-exceeded" => &mut on.grpc_deadline_exceeded,
            "resource-exhausted" => &mut on.grpc_resource_exhausted,
            "internal" => &mut on.grpc_internal,
            "unavailable" => &mut on.grpc_unavailable,
            other => {
                return Err(ConfigError::invalid(
                    format!("{path}.retry_on[{i}]"),
                    format!(
                        "unknown condition `{other}`; expected connect-failure, refused-stream, \
                         reset, reset-before-request, 5xx, gateway-error, retriable-status-codes, \
                         retriable-headers, retriable-4xx, cancelled, deadline-exceeded, \
                         resource-exhausted, internal or unavailable"
                    ),
                ));
            }
        };
        *flag = true;
    }
    if list.is_empty() {
        return Err(ConfigError::invalid(
            format!("{path}.retry_on"),
            "expected at least one condition",
        ));
    }
    Ok(on)
}

/// The wait between tries: `base_interval` (`default_base` when not given) doubling up to
/// `max_interval` (ten times the base when not given), as Envoy's back-off.
pub(crate) fn retry_back_off(
    raw: Option<RawRetryBackOff>,
    default_base: std::time::Duration,
    path: &str,
) -> Result<RetryBackOff, ConfigError> {
    let Some(b) = raw else {
        return Ok(RetryBackOff {
            base_interval: default_base,
            max_interval: default_base * 10,
        });
    };
    let at = format!("{path}.retry_back_off");
    let base_interval = positive(b.base_interval, &format!("{at}.base_interval"))?;
    let max_interval = b.max_interval.unwrap_or(base_interval * 10);
    if max_interval < base_interval {
        return Err(ConfigError::invalid(
            format!("{at}.max_interval"),
            "expected at least base_interval",
        ));
    }
    Ok(RetryBackOff {
        base_interval,
        max_interval,
    })
}

/// A request's own framing, connection and host headers: the proxy sets them, a rule that
/// puts a value on a request may not.
pub(crate) fn framing_or_host(name: &http::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "te"
            | "upgrade"
            | "proxy-connection"
    )
}
