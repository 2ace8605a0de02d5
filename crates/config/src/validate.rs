//! Raw config -> [`Config`]: defaults filled in, references resolved, every value checked.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::Arc;

use http::{HeaderName, HeaderValue};

use super::raw::*;
use super::*;
use crate::check::*;

/// `origin` is the file's part of `raw` (without resources from a management server), kept
/// in the config so that those can be put together with it again.
pub(super) fn validate(raw: RawConfig, origin: Arc<RawConfig>) -> Result<Config, ConfigError> {
    let concurrency = match raw.concurrency {
        None => Concurrency::Auto,
        Some(RawConcurrency::Word(w)) if w == "auto" => Concurrency::Auto,
        Some(RawConcurrency::Word(w)) => {
            return Err(ConfigError::invalid(
                "concurrency",
                format!("expected `auto` or a number of workers, found `{w}`"),
            ));
        }
        Some(RawConcurrency::Workers(n)) => NonZeroUsize::new(n as usize)
            .filter(|n| n.get() <= 1024)
            .map(Concurrency::Fixed)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "concurrency",
                    format!("expected `auto` or 1 to 1024 workers, found {n}"),
                )
            })?,
    };

    let clusters = raw
        .clusters
        .into_iter()
        .enumerate()
        .map(|(i, c)| cluster(c, &format!("clusters[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let mut cluster_index = HashMap::new();
    for (i, c) in clusters.iter().enumerate() {
        if cluster_index.insert(c.name.as_str(), i).is_some() {
            return Err(ConfigError::invalid(
                format!("clusters[{i}].name"),
                format!("duplicate cluster name `{}`", c.name),
            ));
        }
    }

    let xds = xds::bootstrap(raw.node, raw.dynamic_resources)?;
    // With a management server, listeners may all come from it.
    if raw.listeners.is_empty() && xds.is_none() {
        return Err(ConfigError::invalid(
            "listeners",
            "expected at least one listener",
        ));
    }
    let mut listeners: Vec<ListenerConfig> = Vec::with_capacity(raw.listeners.len());
    for (i, l) in raw.listeners.into_iter().enumerate() {
        let path = format!("listeners[{i}]");
        let l = listener(l, &path, &cluster_index, &clusters)?;
        if listeners.iter().any(|other| other.name == l.name) {
            return Err(ConfigError::invalid(
                format!("{path}.name"),
                format!("duplicate listener name `{}`", l.name),
            ));
        }
        // Port 0 asks for a fresh ephemeral port each time, so it never clashes.
        if let Some(other) = listeners
            .iter()
            .find(|o| o.address == l.address && l.address.port() != 0)
        {
            return Err(ConfigError::invalid(
                format!("{path}.address"),
                format!("{} is already used by listener `{}`", l.address, other.name),
            ));
        }
        listeners.push(l);
    }

    let admin = match raw.admin.unwrap_or_default() {
        RawAdmin {
            enabled: Some(false),
            address: None,
            allow: None,
            token_file: None,
            open: None,
        } => None,
        RawAdmin {
            enabled: Some(false),
            ..
        } => {
            return Err(ConfigError::invalid(
                "admin",
                "settings given but `enabled: false`",
            ));
        }
        raw => {
            let address = match &raw.address {
                Some(a) => socket_addr(a, "admin.address")?,
                None => DEFAULT_ADMIN_ADDRESS,
            };
            Some(admin::admin(address, raw)?)
        }
    };
    if let Some(admin) = &admin
        && let Some(l) = listeners
            .iter()
            .find(|l| l.address == admin.address && admin.address.port() != 0)
    {
        return Err(ConfigError::invalid(
            "admin.address",
            format!("{} is already used by listener `{}`", admin.address, l.name),
        ));
    }

    Ok(Config {
        concurrency,
        drain_timeout: raw.drain_timeout.unwrap_or(DEFAULT_DRAIN_TIMEOUT),
        admin,
        max_connections: limit(raw.max_connections, "max_connections")?,
        overload: super::overload::overload(raw.overload, super::OverloadEnvironment::current())?,
        watch: raw.watch,
        stats: super::stats::stats(raw.stats)?,
        tracing: super::tracing::tracing(raw.tracing)?,
        listeners,
        clusters,
        xds,
        origin,
    })
}

fn listener(
    raw: RawListener,
    path: &str,
    cluster_index: &HashMap<&str, usize>,
    clusters: &[ClusterConfig],
) -> Result<ListenerConfig, ConfigError> {
    let name = if raw.dynamic {
        dynamic_name(raw.name, path)?
    } else {
        name(raw.name, path)?
    };
    let address = socket_addr(&raw.address, &format!("{path}.address"))?;
    let connection_limit = limit(raw.connection_limit, &format!("{path}.connection_limit"))?;
    let connection_balance = match raw.connection_balance.as_deref() {
        None | Some("reuse_port") => ConnectionBalance::ReusePort,
        Some("exact") => ConnectionBalance::Exact,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.connection_balance"),
                format!("expected `reuse_port` or `exact`, found `{other}`"),
            ));
        }
    };
    let max_concurrent_streams = raw
        .http
        .max_concurrent_streams
        .unwrap_or(DEFAULT_MAX_CONCURRENT_STREAMS);
    if max_concurrent_streams == 0 {
        return Err(ConfigError::invalid(
            format!("{path}.http.max_concurrent_streams"),
            "expected at least 1",
        ));
    }
    let buffer_limit = buffer_limit(
        raw.per_connection_buffer_limit_bytes,
        &format!("{path}.per_connection_buffer_limit_bytes"),
    )?;
    if raw.ext_authz.is_some() {
        return Err(ConfigError::invalid(
            format!("{path}.ext_authz"),
            "ext_authz is a filter now: write it as `http_filters: [{ ext_authz: { ... } }]`",
        ));
    }
    let http_filters = filters::http_filters(
        raw.http_filters,
        &format!("{path}.http_filters"),
        buffer_limit,
    )?;
    let path_normalization = path_normalization(
        raw.http.path_normalization.clone(),
        &format!("{path}.http.path_normalization"),
    )?;
    let route_config = routes::route_configuration(
        raw.routes,
        raw.virtual_hosts,
        path,
        &routes::RouteCtx {
            cluster_index,
            clusters,
            chain: &http_filters,
            dynamic: raw.dynamic,
            path_normalization,
        },
    )?;
    let access_log = raw
        .access_log
        .map(|log| -> Result<AccessLogConfig, ConfigError> {
            let target = match log.path.as_str() {
                "stdout" => LogTarget::Stdout,
                "" => {
                    return Err(ConfigError::invalid(
                        format!("{path}.access_log.path"),
                        "expected `stdout` or a file path",
                    ));
                }
                file => LogTarget::File(file.into()),
            };
            let format = LogFormat::parse(
                log.format
                    .as_deref()
                    .unwrap_or(crate::access_log::DEFAULT_FORMAT),
            )
            .map_err(|e| ConfigError::invalid(format!("{path}.access_log.format"), e))?;
            let json_format = log
                .json_format
                .map(|json| {
                    if log.format.is_some() {
                        return Err(ConfigError::invalid(
                            format!("{path}.access_log"),
                            "expected `format` or `json_format`, not both",
                        ));
                    }
                    json_format(json, &format!("{path}.access_log.json_format"))
                })
                .transpose()?;
            Ok(AccessLogConfig {
                target,
                format,
                json_format,
            })
        })
        .transpose()?;
    let tls = raw
        .tls
        .map(|t| tls::listener_tls(t, &format!("{path}.tls")))
        .transpose()?;
    let proxy_protocol = raw
        .proxy_protocol
        .map(|p| proxy_protocol(p, &format!("{path}.proxy_protocol")))
        .transpose()?;
    Ok(ListenerConfig {
        name,
        address,
        connection_limit,
        connection_balance,
        buffer_limit,
        access_log,
        proxy_protocol,
        tls,
        http_filters,
        http: HttpConfig {
            max_concurrent_streams,
            idle_timeout: positive(
                raw.http.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
                &format!("{path}.http.idle_timeout"),
            )?,
            request_headers_timeout: positive(
                raw.http
                    .request_headers_timeout
                    .unwrap_or(DEFAULT_REQUEST_HEADERS_TIMEOUT),
                &format!("{path}.http.request_headers_timeout"),
            )?,
            stream_idle_timeout: positive(
                raw.http
                    .stream_idle_timeout
                    .unwrap_or(DEFAULT_STREAM_IDLE_TIMEOUT),
                &format!("{path}.http.stream_idle_timeout"),
            )?,
            // 0 means no limit, as in Envoy and the peer-bench template.
            max_requests_per_connection: raw.http.max_requests_per_connection.filter(|n| *n > 0),
            path_normalization,
            http2_keepalive: raw
                .http
                .http2_keepalive
                .map(|k| -> Result<Keepalive, ConfigError> {
                    let at = format!("{path}.http.http2_keepalive");
                    Ok(Keepalive {
                        interval: positive(k.interval, &format!("{at}.interval"))?,
                        // Envoy's default: 20 s.
                        timeout: positive(
                            k.timeout.unwrap_or(Duration::from_secs(20)),
                            &format!("{at}.timeout"),
                        )?,
                    })
                })
                .transpose()?,
            max_connection_duration: raw
                .http
                .max_connection_duration
                .map(|d| positive(d, &format!("{path}.http.max_connection_duration")))
                .transpose()?,
            use_remote_address: raw.http.use_remote_address.unwrap_or(true),
            xff_num_trusted_hops: raw.http.xff_num_trusted_hops.unwrap_or(0),
            max_request_headers_kb: match raw.http.max_request_headers_kb {
                None => DEFAULT_MAX_REQUEST_HEADERS_KB,
                Some(kb @ 1..=8192) => kb,
                Some(other) => {
                    return Err(ConfigError::invalid(
                        format!("{path}.http.max_request_headers_kb"),
                        format!("expected 1 to 8192 (KiB), found {other}"),
                    ));
                }
            },
        },
        route_config,
    })
}

/// `json_format: { key: "%FIELD%", ... }`: keys and value formats, in order.
fn json_format(raw: serde_yaml::Mapping, path: &str) -> Result<JsonFormat, ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError::invalid(path, "expected at least one key"));
    }
    raw.into_iter()
        .map(|(key, value)| {
            let Some(key) = key.as_str().map(str::to_owned) else {
                return Err(ConfigError::invalid(path, "expected text keys"));
            };
            let at = format!("{path}.{key}");
            let Some(value) = value.as_str() else {
                return Err(ConfigError::invalid(
                    at,
                    "expected a format string (`%FIELD%`)",
                ));
            };
            let format = LogFormat::parse(value).map_err(|e| ConfigError::invalid(&at, e))?;
            Ok((key, format))
        })
        .collect::<Result<_, _>>()
        .map(JsonFormat)
}

/// `proxy_protocol: { versions: [v1, v2], required: true }` (both versions and required by
/// default).
fn proxy_protocol(raw: RawProxyProtocol, path: &str) -> Result<ProxyProtocolConfig, ConfigError> {
    let mut versions = ProxyProtocolVersions {
        v1: raw.versions.is_none(),
        v2: raw.versions.is_none(),
    };
    for (i, v) in raw.versions.iter().flatten().enumerate() {
        match v.as_str() {
            "v1" => versions.v1 = true,
            "v2" => versions.v2 = true,
            other => {
                return Err(ConfigError::invalid(
                    format!("{path}.versions[{i}]"),
                    format!("expected `v1` or `v2`, found `{other}`"),
                ));
            }
        }
    }
    if !versions.v1 && !versions.v2 {
        return Err(ConfigError::invalid(
            format!("{path}.versions"),
            "expected at least one of `v1` and `v2`",
        ));
    }
    Ok(ProxyProtocolConfig {
        versions,
        required: raw.required.unwrap_or(true),
    })
}

fn path_normalization(
    raw: Option<RawPathNormalization>,
    path: &str,
) -> Result<PathNormalization, ConfigError> {
    let defaults = PathNormalization::default();
    let Some(raw) = raw else {
        return Ok(defaults);
    };
    let escaped_slashes = match raw.escaped_slashes.as_deref() {
        None => defaults.escaped_slashes,
        Some("keep") => EscapedSlashes::Keep,
        Some("reject") => EscapedSlashes::Reject,
        Some("unescape_and_redirect") => EscapedSlashes::UnescapeAndRedirect,
        Some("unescape_and_forward") => EscapedSlashes::UnescapeAndForward,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.escaped_slashes"),
                format!(
                    "expected `keep`, `reject`, `unescape_and_redirect` or `unescape_and_forward`, found `{other}`"
                ),
            ));
        }
    };
    Ok(PathNormalization {
        normalize: raw.normalize.unwrap_or(defaults.normalize),
        merge_slashes: raw.merge_slashes.unwrap_or(defaults.merge_slashes),
        escaped_slashes,
    })
}

fn cluster(raw: RawCluster, path: &str) -> Result<ClusterConfig, ConfigError> {
    let name = if raw.dynamic {
        dynamic_name(raw.name.clone(), path)?
    } else {
        name(raw.name.clone(), path)?
    };
    // A cluster from a management server may have no endpoints (yet, or any more).
    if raw.endpoints.is_empty() && !raw.dynamic {
        return Err(ConfigError::invalid(
            format!("{path}.endpoints"),
            "expected at least one endpoint `IP:PORT` or `NAME:PORT`",
        ));
    }
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(raw.endpoints.len());
    for (i, e) in raw.endpoints.iter().enumerate() {
        let at = format!("{path}.endpoints[{i}]");
        let (address, weight) = match e {
            RawEndpoint::Address(a) => (dns::endpoint_address(a, &at)?, 1),
            RawEndpoint::Weighted(w) => (
                dns::endpoint_address(&w.address, &format!("{at}.address"))?,
                w.weight.unwrap_or(1),
            ),
        };
        if weight == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.weight"),
                "expected a weight of at least 1",
            ));
        }
        if endpoints.iter().any(|other| other.address == address) {
            return Err(ConfigError::invalid(
                at,
                format!("{address} is listed twice"),
            ));
        }
        endpoints.push(Endpoint { address, weight });
    }
    let lb_policy = lb_policy(&raw, path)?;
    let hash_key = raw
        .hash_key
        .as_ref()
        .map(|k| hash_key(k, &format!("{path}.hash_key")))
        .transpose()?;
    if hash_key.is_some() && !matches!(lb_policy, LbPolicy::RingHash(_) | LbPolicy::Maglev(_)) {
        return Err(ConfigError::invalid(
            format!("{path}.hash_key"),
            "a hash key is used only by `ring_hash` and `maglev`",
        ));
    }
    let protocol = match raw.protocol.as_deref() {
        None | Some("http1") => UpstreamProtocol::Http1,
        Some("http2") => UpstreamProtocol::Http2,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.protocol"),
                format!("expected `http1` or `http2`, found `{other}`"),
            ));
        }
    };
    let dns = dns::dns_config(&raw, path)?;
    let connect_timeout = raw.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    if connect_timeout.is_zero() {
        return Err(ConfigError::invalid(
            format!("{path}.connect_timeout"),
            "expected a duration above zero",
        ));
    }
    Ok(ClusterConfig {
        name,
        endpoints,
        lb_policy,
        hash_key,
        max_requests_per_connection: raw.max_requests_per_connection.filter(|n| *n > 0),
        protocol,
        connect_timeout,
        buffer_limit: buffer_limit(
            raw.per_connection_buffer_limit_bytes,
            &format!("{path}.per_connection_buffer_limit_bytes"),
        )?,
        circuit_breakers: circuit_breakers(
            raw.circuit_breakers.unwrap_or_default(),
            &format!("{path}.circuit_breakers"),
        )?,
        health_check: raw
            .health_check
            .map(|h| health_check(h, &format!("{path}.health_check")))
            .transpose()?,
        outlier_detection: raw
            .outlier_detection
            .map(|o| outlier_detection(o, &format!("{path}.outlier_detection")))
            .transpose()?,
        tls: raw
            .tls
            .map(|t| tls::cluster_tls(t, &format!("{path}.tls")))
            .transpose()?,
        dns,
    })
}

/// `header: NAME`, `cookie: NAME` or `source_ip: true`.
pub(super) fn hash_key(raw: &RawHashKey, path: &str) -> Result<HashKey, ConfigError> {
    match raw {
        RawHashKey {
            header: Some(h),
            cookie: None,
            source_ip: None,
        } => Ok(HashKey::Header(
            HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                ConfigError::invalid(
                    format!("{path}.header"),
                    format!("expected a header name, found `{h}`"),
                )
            })?,
        )),
        RawHashKey {
            header: None,
            cookie: Some(c),
            source_ip: None,
        } if !c.is_empty() => Ok(HashKey::Cookie(c.clone())),
        RawHashKey {
            header: None,
            cookie: None,
            source_ip: Some(true),
        } => Ok(HashKey::SourceIp),
        _ => Err(ConfigError::invalid(
            path,
            "expected exactly one of `header: NAME`, `cookie: NAME` or `source_ip: true`",
        )),
    }
}

fn circuit_breakers(
    raw: RawCircuitBreakers,
    path: &str,
) -> Result<CircuitBreakerConfig, ConfigError> {
    let defaults = CircuitBreakerConfig::default();
    // Up to u32::MAX, which control planes (Istio) send for "no limit". Zero only for
    // retries, where it means none; a zero elsewhere would refuse every request.
    let limit = |raw: Option<RawLimit>, default: LimitSpec, key: &str| match raw {
        None => Ok(default),
        Some(RawLimit::Fixed(0)) if key == "max_retries" => Ok(LimitSpec::Fixed(0)),
        Some(RawLimit::Fixed(n @ 1..=0xFFFF_FFFF)) => Ok(LimitSpec::Fixed(n as u32)),
        Some(RawLimit::PerCore(RawPerCore {
            per_core: n @ 1..=10_000_000,
        })) => Ok(LimitSpec::PerCore(n as u32)),
        Some(_) => Err(ConfigError::invalid(
            format!("{path}.{key}"),
            "expected a number from 1 to 4294967295 (0 for max_retries) or `{ per_core: N }` with N from 1",
        )),
    };
    Ok(CircuitBreakerConfig {
        max_connections: limit(
            raw.max_connections,
            defaults.max_connections,
            "max_connections",
        )?,
        max_pending_requests: limit(
            raw.max_pending_requests,
            defaults.max_pending_requests,
            "max_pending_requests",
        )?,
        max_requests: limit(raw.max_requests, defaults.max_requests, "max_requests")?,
        max_retries: limit(raw.max_retries, defaults.max_retries, "max_retries")?,
        pending_timeout: positive(
            raw.pending_timeout.unwrap_or(defaults.pending_timeout),
            &format!("{path}.pending_timeout"),
        )?,
    })
}

fn health_check(raw: RawHealthCheck, path: &str) -> Result<HealthCheckConfig, ConfigError> {
    if !raw.path.starts_with('/') || raw.path.parse::<http::uri::PathAndQuery>().is_err() {
        return Err(ConfigError::invalid(
            format!("{path}.path"),
            format!("expected a path starting with `/`, found `{}`", raw.path),
        ));
    }
    if let Some(host) = &raw.host
        && HeaderValue::from_str(host).is_err()
    {
        return Err(ConfigError::invalid(
            format!("{path}.host"),
            format!("expected a host name, found `{host}`"),
        ));
    }
    let interval = positive(
        raw.interval.unwrap_or(std::time::Duration::from_secs(5)),
        &format!("{path}.interval"),
    )?;
    let timeout = positive(
        raw.timeout.unwrap_or(std::time::Duration::from_secs(1)),
        &format!("{path}.timeout"),
    )?;
    let threshold = |n: Option<u32>, default: u32, key: &str| match n.unwrap_or(default) {
        0 => Err(ConfigError::invalid(
            format!("{path}.{key}"),
            "expected at least 1",
        )),
        n => Ok(n),
    };
    Ok(HealthCheckConfig {
        path: raw.path,
        host: raw.host,
        interval,
        jitter: raw.jitter.unwrap_or(interval / 10),
        timeout,
        healthy_threshold: threshold(raw.healthy_threshold, 1, "healthy_threshold")?,
        unhealthy_threshold: threshold(raw.unhealthy_threshold, 2, "unhealthy_threshold")?,
    })
}

fn outlier_detection(
    raw: RawOutlierDetection,
    path: &str,
) -> Result<OutlierDetectionConfig, ConfigError> {
    let max_ejection_percent = raw.max_ejection_percent.unwrap_or(10);
    if max_ejection_percent > 100 {
        return Err(ConfigError::invalid(
            format!("{path}.max_ejection_percent"),
            format!("expected 0 to 100, found {max_ejection_percent}"),
        ));
    }
    let base_ejection_time = positive(
        raw.base_ejection_time
            .unwrap_or(std::time::Duration::from_secs(30)),
        &format!("{path}.base_ejection_time"),
    )?;
    // Envoy's defaults; the cap is never below one base time.
    Ok(OutlierDetectionConfig {
        consecutive_5xx: raw.consecutive_5xx.unwrap_or(5),
        consecutive_gateway_failure: raw.consecutive_gateway_failure.unwrap_or(0),
        base_ejection_time,
        max_ejection_time: raw
            .max_ejection_time
            .unwrap_or(std::time::Duration::from_secs(300))
            .max(base_ejection_time),
        max_ejection_percent,
    })
}

/// `lb_policy` and the options section that belongs to it.
fn lb_policy(raw: &RawCluster, path: &str) -> Result<LbPolicy, ConfigError> {
    let name = raw.lb_policy.as_deref().unwrap_or("round_robin");
    for (key, given) in [
        ("least_request", raw.least_request.is_some()),
        ("ring_hash", raw.ring_hash.is_some()),
        ("maglev", raw.maglev.is_some()),
    ] {
        if given && name != key {
            return Err(ConfigError::invalid(
                format!("{path}.{key}"),
                format!("options for `{key}` given, but lb_policy is `{name}`"),
            ));
        }
    }
    let (policy, key) = match name {
        "round_robin" => (LbPolicy::RoundRobin, "lb_policy"),
        "random" => (LbPolicy::Random, "lb_policy"),
        "least_request" => {
            let mut options = balancer::LeastRequestOptions::default();
            if let Some(lr) = &raw.least_request {
                options.choice_count = lr.choice_count.unwrap_or(options.choice_count);
                options.active_request_bias = lr
                    .active_request_bias
                    .unwrap_or(options.active_request_bias);
            }
            (LbPolicy::LeastRequest(options), "least_request")
        }
        "ring_hash" => {
            let mut options = balancer::RingHashOptions::default();
            if let Some(rh) = &raw.ring_hash {
                options.minimum_ring_size =
                    rh.minimum_ring_size.unwrap_or(options.minimum_ring_size);
                options.maximum_ring_size =
                    rh.maximum_ring_size.unwrap_or(options.maximum_ring_size);
            }
            (LbPolicy::RingHash(options), "ring_hash")
        }
        "maglev" => {
            let mut options = balancer::MaglevOptions::default();
            if let Some(m) = &raw.maglev {
                options.table_size = m.table_size.unwrap_or(options.table_size);
            }
            (LbPolicy::Maglev(options), "maglev")
        }
        other => {
            return Err(ConfigError::invalid(
                format!("{path}.lb_policy"),
                format!(
                    "expected round_robin, least_request, random, ring_hash or maglev, found `{other}`"
                ),
            ));
        }
    };
    policy
        .validate()
        .map_err(|e| ConfigError::invalid(format!("{path}.{key}"), e.to_string()))?;
    Ok(policy)
}

mod dns;
mod route_actions;
mod routes;
mod tls;

#[cfg(test)]
mod tests;
