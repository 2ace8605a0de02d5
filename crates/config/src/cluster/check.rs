//! A cluster, checked: its name, endpoints, balancing, breakers, health checks and outliers.

use http::{HeaderName, HeaderValue};

use crate::values::*;
use crate::*;

pub(crate) fn cluster(raw: RawCluster, path: &str) -> Result<ClusterConfig, ConfigError> {
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
    let socket_matches = crate::cluster::socket_match::check(
        &raw.transport_socket_matches,
        &format!("{path}.transport_socket_matches"),
    )?;
    let mut endpoints: Vec<Endpoint> = Vec::with_capacity(raw.endpoints.len());
    for (i, e) in raw.endpoints.iter().enumerate() {
        let at = format!("{path}.endpoints[{i}]");
        let (mut endpoint, labels) = match e {
            RawEndpoint::Address(a) => (
                Endpoint::new(crate::cluster::check_dns::endpoint_address(a, &at)?),
                (None, None),
            ),
            RawEndpoint::Weighted(w) => (
                endpoint(w, &at)?,
                (
                    w.transport_socket_match.as_ref(),
                    w.locality_transport_socket_match.as_ref(),
                ),
            ),
        };
        endpoint.transport_socket = crate::cluster::socket_match::resolve(
            socket_matches.iter().map(|m| (&m.labels, &m.name)),
            labels.0,
            labels.1,
        )
        .cloned();
        if endpoints
            .iter()
            .any(|other| other.address == endpoint.address)
        {
            return Err(ConfigError::invalid(
                at,
                format!("{} is listed twice", endpoint.address),
            ));
        }
        if let Some(other) = endpoints.iter().find(|o| {
            o.priority == endpoint.priority
                && o.locality == endpoint.locality
                && o.locality_weight != endpoint.locality_weight
        }) {
            return Err(ConfigError::invalid(
                format!("{at}.locality_weight"),
                format!(
                    "{} gives its locality another weight ({:?}) at the same priority",
                    other.address, other.locality_weight
                ),
            ));
        }
        endpoints.push(endpoint);
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
    let hash_policy =
        crate::hash_policy::hash_policy(raw.hash_policy.clone(), &format!("{path}.hash_policy"))?;
    if hash_policy.is_some() {
        let at = format!("{path}.hash_policy");
        if !matches!(lb_policy, LbPolicy::RingHash(_) | LbPolicy::Maglev(_)) {
            return Err(ConfigError::invalid(
                at,
                "a hash policy is used only by `ring_hash` and `maglev`",
            ));
        }
        if hash_key.is_some() {
            return Err(ConfigError::invalid(
                at,
                "`hash_key` and `hash_policy` both say what to hash: keep one",
            ));
        }
    }
    let protocol = match raw.protocol.as_deref() {
        None | Some("http1") => UpstreamProtocol::Http1,
        Some("http2") => UpstreamProtocol::Http2,
        Some("auto")
            if raw.tls.is_some()
                && raw.transport_socket_matches.iter().all(|m| m.tls.is_some()) =>
        {
            UpstreamProtocol::Auto
        }
        Some("downstream") => UpstreamProtocol::Downstream,
        Some("auto") => {
            return Err(ConfigError::invalid(
                format!("{path}.protocol"),
                "`auto` is chosen by ALPN, which needs `tls` (for every transport socket match too)",
            ));
        }
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.protocol"),
                format!("expected `http1`, `http2`, `auto` or `downstream`, found `{other}`"),
            ));
        }
    };
    let lb_settings = LbSettings {
        panic_threshold: raw
            .healthy_panic_threshold
            .unwrap_or(balancer::DEFAULT_PANIC_THRESHOLD),
        overprovisioning_factor: raw
            .overprovisioning_factor
            .unwrap_or(balancer::DEFAULT_OVERPROVISIONING_FACTOR),
        locality_weighted: raw.locality_weighted.unwrap_or(false),
        zone_aware: zone_aware(raw.zone_aware.as_ref(), path)?,
        slow_start: raw.slow_start.map(|s| balancer::SlowStart {
            window: s.window,
            aggression: s.aggression.unwrap_or(1.0),
            min_weight_percent: s.min_weight_percent.unwrap_or(10.0),
        }),
    };
    if raw.zone_aware.is_some() && lb_settings.locality_weighted {
        return Err(ConfigError::invalid(
            format!("{path}.zone_aware"),
            "zone-aware routing and locality_weighted are two ways to choose a locality; give one",
        ));
    }
    lb_settings.validate(&lb_policy).map_err(|e| {
        let key = match e {
            balancer::BuildError::PanicThresholdOutOfRange { .. } => "healthy_panic_threshold",
            balancer::BuildError::OverprovisioningFactorZero => "overprovisioning_factor",
            balancer::BuildError::RoutingEnabledOutOfRange { .. } => "zone_aware.routing_enabled",
            balancer::BuildError::SlowStartPolicy { .. }
            | balancer::BuildError::InvalidSlowStart { .. } => "slow_start",
            _ => "locality_weighted",
        };
        ConfigError::invalid(format!("{path}.{key}"), e.to_string())
    })?;
    let dns = crate::cluster::check_dns::dns_config(&raw, path)?;
    let connect_timeout = raw.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
    if connect_timeout.is_zero() {
        return Err(ConfigError::invalid(
            format!("{path}.connect_timeout"),
            "expected a duration above zero",
        ));
    }
    let auto_sni = auto_sni(&raw, path)?;
    if protocol == UpstreamProtocol::Http1 {
        // Settings of HTTP/2 connections, which this cluster never makes.
        for (key, set) in [
            (
                "max_concurrent_streams",
                raw.max_concurrent_streams.is_some(),
            ),
            ("http2_keepalive", raw.http2_keepalive.is_some()),
            (
                "stream_error_on_invalid_http_message",
                raw.stream_error_on_invalid_http_message.is_some(),
            ),
        ] {
            if set {
                return Err(ConfigError::invalid(
                    format!("{path}.{key}"),
                    "an HTTP/2 setting on a cluster of `protocol: http1`",
                ));
            }
        }
    }
    Ok(ClusterConfig {
        name,
        endpoints,
        lb_policy,
        lb_settings,
        hash_key,
        hash_policy,
        max_requests_per_connection: raw.max_requests_per_connection.filter(|n| *n > 0),
        idle_timeout: match raw.idle_timeout {
            None => Some(DEFAULT_UPSTREAM_IDLE_TIMEOUT),
            Some(d) => Some(d).filter(|d| !d.is_zero()),
        },
        max_connection_duration: raw.max_connection_duration.filter(|d| !d.is_zero()),
        per_endpoint_stats: raw.per_endpoint_stats.unwrap_or(false),
        tcp_keepalive: raw
            .tcp_keepalive
            .map(|k| tcp_keepalive(k, &format!("{path}.tcp_keepalive")))
            .transpose()?,
        preserve_header_case: raw.preserve_header_case.unwrap_or(false),
        initial_stream_window_size: window(
            raw.initial_stream_window_size,
            &format!("{path}.initial_stream_window_size"),
        )?,
        initial_connection_window_size: window(
            raw.initial_connection_window_size,
            &format!("{path}.initial_connection_window_size"),
        )?,
        max_concurrent_streams: raw
            .max_concurrent_streams
            .map(|n| max_concurrent_streams(n, &format!("{path}.max_concurrent_streams")))
            .transpose()?,
        http2_keepalive: raw
            .http2_keepalive
            .map(|k| upstream_keepalive(k, &format!("{path}.http2_keepalive")))
            .transpose()?,
        stream_error_on_invalid_http_message: raw
            .stream_error_on_invalid_http_message
            .unwrap_or(false),
        close_connections_on_host_health_failure: raw
            .close_connections_on_host_health_failure
            .unwrap_or(false),
        preconnect: raw
            .preconnect
            .map(|p| preconnect(p, &lb_policy, &format!("{path}.preconnect")))
            .transpose()?
            .flatten(),
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
            .transpose()?
            .map(|h| {
                // As Envoy: gRPC checks need a cluster that speaks HTTP/2.
                if h.grpc.is_some() && protocol == UpstreamProtocol::Http1 {
                    return Err(ConfigError::invalid(
                        format!("{path}.health_check.grpc"),
                        "a gRPC health check needs `protocol: http2` (or `auto`)",
                    ));
                }
                Ok(h)
            })
            .transpose()?,
        outlier_detection: raw
            .outlier_detection
            .map(|o| outlier_detection(o, &format!("{path}.outlier_detection")))
            .transpose()?,
        tls: raw
            .tls
            .map(|t| crate::tls::check::cluster_tls(t, &format!("{path}.tls")))
            .transpose()?,
        auto_sni,
        transport_socket_matches: socket_matches,
        dns,
    })
}

/// `auto_sni`, with `auto_san_validation` and `override_auto_sni_header`.
fn auto_sni(raw: &RawCluster, path: &str) -> Result<Option<AutoSni>, ConfigError> {
    let san_validation = raw.auto_san_validation.unwrap_or(false);
    if raw.auto_sni != Some(true) {
        for (key, given) in [
            ("auto_san_validation", san_validation),
            (
                "override_auto_sni_header",
                raw.override_auto_sni_header.is_some(),
            ),
        ] {
            if given {
                return Err(ConfigError::invalid(
                    format!("{path}.{key}"),
                    "only with `auto_sni: true` (the name verified is the one sent)",
                ));
            }
        }
        return Ok(None);
    }
    // The name sent is the one verified, unless `subject_alt_names` decide: asking for the
    // name to be verified beside them could not be honoured.
    let matchers = (raw.tls.iter())
        .chain(
            raw.transport_socket_matches
                .iter()
                .filter_map(|m| m.tls.as_ref()),
        )
        .any(|tls| !tls.subject_alt_names.is_empty());
    if san_validation && matchers {
        return Err(ConfigError::invalid(
            format!("{path}.auto_san_validation"),
            "with `subject_alt_names` the certificate is verified by them, not by the name sent",
        ));
    }
    let header = match &raw.override_auto_sni_header {
        None => None,
        Some(name) => Some(
            HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| {
                    ConfigError::invalid(
                        format!("{path}.override_auto_sni_header"),
                        format!("expected a header name, found `{name}`"),
                    )
                })?
                .as_str()
                .to_owned(),
        ),
    };
    Ok(Some(AutoSni {
        header,
        san_validation,
    }))
}

/// `{ address, weight, priority, locality, locality_weight, health }`.
fn endpoint(raw: &RawWeightedEndpoint, at: &str) -> Result<Endpoint, ConfigError> {
    let address =
        crate::cluster::check_dns::endpoint_address(&raw.address, &format!("{at}.address"))?;
    let weight = raw.weight.unwrap_or(1);
    if weight == 0 {
        return Err(ConfigError::invalid(
            format!("{at}.weight"),
            "expected a weight of at least 1",
        ));
    }
    if raw.locality_weight == Some(0) {
        return Err(ConfigError::invalid(
            format!("{at}.locality_weight"),
            "expected a weight of at least 1 (leave it out for a locality without load)",
        ));
    }
    let health = match raw.health.as_deref() {
        None | Some("healthy") => EndpointHealth::Healthy,
        Some("degraded") => EndpointHealth::Degraded,
        Some("unhealthy") => EndpointHealth::Unhealthy,
        Some("draining") => EndpointHealth::Draining,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{at}.health"),
                format!("expected healthy, degraded, unhealthy or draining, found `{other}`"),
            ));
        }
    };
    // Sent as a host (HTTP/2's `:authority`): a name, with a port or not.
    let name = |value: &Option<String>, key: &str| -> Result<Option<String>, ConfigError> {
        match value.as_deref() {
            None | Some("") => Ok(None),
            Some(v)
                if v.parse::<http::uri::Authority>()
                    .is_ok_and(|a| a.as_str() == v) =>
            {
                Ok(Some(v.to_owned()))
            }
            Some(v) => Err(ConfigError::invalid(
                format!("{at}.{key}"),
                format!("expected a host name, found `{v}`"),
            )),
        }
    };
    let check = raw.health_check.clone().unwrap_or_default();
    if check.port == Some(0) {
        return Err(ConfigError::invalid(
            format!("{at}.health_check.port"),
            "expected a port from 1",
        ));
    }
    Ok(Endpoint {
        address,
        weight,
        priority: raw.priority.unwrap_or(0),
        locality: raw.locality.clone().filter(|l| !l.is_empty()),
        locality_weight: raw.locality_weight,
        health,
        hostname: name(&raw.hostname, "hostname")?,
        health_check_hostname: name(&check.hostname, "health_check.hostname")?,
        health_check_port: check.port,
        transport_socket: None,
    })
}

/// `header: NAME`, `cookie: NAME` or `source_ip: true`.
pub(crate) fn hash_key(raw: &RawHashKey, path: &str) -> Result<HashKey, ConfigError> {
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

pub(crate) fn circuit_breakers(
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
        retry_budget: raw
            .retry_budget
            .map(|b| {
                let budget_percent = b.budget_percent.unwrap_or(20.0);
                if !(0.0..=100.0).contains(&budget_percent) {
                    return Err(ConfigError::invalid(
                        format!("{path}.retry_budget.budget_percent"),
                        format!("expected 0 to 100 (percent), found {budget_percent}"),
                    ));
                }
                Ok(RetryBudget {
                    budget_percent,
                    min_retry_concurrency: b.min_retry_concurrency.unwrap_or(3),
                })
            })
            .transpose()?,
        pending_timeout: positive(
            raw.pending_timeout.unwrap_or(defaults.pending_timeout),
            &format!("{path}.pending_timeout"),
        )?,
        max_connections_per_host: match raw.max_connections_per_host {
            Some(0) => {
                return Err(ConfigError::invalid(
                    format!("{path}.max_connections_per_host"),
                    "expected at least 1",
                ));
            }
            n => n,
        },
        max_connection_pools: match raw.max_connection_pools {
            Some(0) => {
                return Err(ConfigError::invalid(
                    format!("{path}.max_connection_pools"),
                    "expected at least 1",
                ));
            }
            n => n,
        },
    })
}

pub(crate) fn health_check(
    raw: RawHealthCheck,
    path: &str,
) -> Result<HealthCheckConfig, ConfigError> {
    let tcp = raw.tcp.unwrap_or(false);
    if tcp && raw.grpc.is_some() {
        return Err(ConfigError::invalid(
            format!("{path}.grpc"),
            "a check is TCP or gRPC, not both",
        ));
    }
    let other = if tcp {
        Some("TCP")
    } else if raw.grpc.is_some() {
        Some("gRPC")
    } else {
        None
    };
    if let Some(kind) = other {
        for (key, given) in [
            ("path", !raw.path.is_empty()),
            ("host", raw.host.is_some()),
            ("method", raw.method.is_some()),
            ("expected_statuses", raw.expected_statuses.is_some()),
            ("retriable_statuses", raw.retriable_statuses.is_some()),
            (
                "request_headers_to_add",
                tcp && raw.request_headers_to_add.is_some(),
            ),
            (
                "request_headers_to_remove",
                tcp && raw.request_headers_to_remove.is_some(),
            ),
            ("send", raw.grpc.is_some() && raw.send.is_some()),
            ("receive", raw.grpc.is_some() && raw.receive.is_some()),
        ] {
            if given {
                return Err(ConfigError::invalid(
                    format!("{path}.{key}"),
                    format!("not a setting of a {kind} check"),
                ));
            }
        }
    } else if !raw.path.starts_with('/') || raw.path.parse::<http::uri::PathAndQuery>().is_err() {
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
    let no_traffic_interval = match raw.no_traffic_interval {
        Some(d) => positive(d, &format!("{path}.no_traffic_interval"))?,
        None => interval,
    };
    let unhealthy_interval = match raw.unhealthy_interval {
        Some(d) => positive(d, &format!("{path}.unhealthy_interval"))?,
        None => interval,
    };
    let threshold = |n: Option<u32>, default: u32, key: &str| match n.unwrap_or(default) {
        0 => Err(ConfigError::invalid(
            format!("{path}.{key}"),
            "expected at least 1",
        )),
        n => Ok(n),
    };
    let method = raw
        .method
        .as_deref()
        .map(|m| match m.parse::<http::Method>() {
            Ok(method) if method != http::Method::CONNECT => Ok(method),
            _ => Err(ConfigError::invalid(
                format!("{path}.method"),
                format!("expected an HTTP method other than CONNECT, found `{m}`"),
            )),
        })
        .transpose()?;
    let ranges = |list: Option<Vec<RawStatusRange>>, key: &str| {
        list.unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                if (100..=599).contains(&r.start) && r.start < r.end && r.end <= 600 {
                    Ok((r.start, r.end))
                } else {
                    Err(ConfigError::invalid(
                        format!("{path}.{key}[{i}]"),
                        "expected statuses from `start` (100 to 599) up to `end` (excluded, at most 600)",
                    ))
                }
            })
            .collect::<Result<Vec<_>, _>>()
    };
    let send = raw
        .send
        .as_ref()
        .map(|p| payload(p, &format!("{path}.send")))
        .transpose()?;
    let receive = raw
        .receive
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, p)| payload(p, &format!("{path}.receive[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HealthCheckConfig {
        path: raw.path,
        host: raw.host,
        method,
        expected_statuses: ranges(raw.expected_statuses, "expected_statuses")?,
        retriable_statuses: ranges(raw.retriable_statuses, "retriable_statuses")?,
        tcp,
        send,
        receive,
        interval,
        jitter: raw.jitter.unwrap_or(interval / 10),
        timeout,
        healthy_threshold: threshold(raw.healthy_threshold, 1, "healthy_threshold")?,
        unhealthy_threshold: threshold(raw.unhealthy_threshold, 2, "unhealthy_threshold")?,
        grpc: raw
            .grpc
            .map(|g| grpc_check(g, &format!("{path}.grpc")))
            .transpose()?,
        request_headers_to_add: raw
            .request_headers_to_add
            .unwrap_or_default()
            .into_iter()
            .map(|(name, value)| {
                let at = format!("{path}.request_headers_to_add.{name}");
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| ConfigError::invalid(&at, "expected a header name"))?;
                let value = HeaderValue::from_str(&value)
                    .map_err(|_| ConfigError::invalid(&at, "expected a header value"))?;
                Ok((name, value))
            })
            .collect::<Result<Vec<_>, ConfigError>>()?,
        request_headers_to_remove: raw
            .request_headers_to_remove
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, name)| {
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                    ConfigError::invalid(
                        format!("{path}.request_headers_to_remove[{i}]"),
                        "expected a header name",
                    )
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?,
        unhealthy_interval,
        unhealthy_edge_interval: match raw.unhealthy_edge_interval {
            Some(d) => positive(d, &format!("{path}.unhealthy_edge_interval"))?,
            None => unhealthy_interval,
        },
        healthy_edge_interval: match raw.healthy_edge_interval {
            Some(d) => positive(d, &format!("{path}.healthy_edge_interval"))?,
            None => interval,
        },
        no_traffic_interval,
        no_traffic_healthy_interval: match raw.no_traffic_healthy_interval {
            Some(d) => positive(d, &format!("{path}.no_traffic_healthy_interval"))?,
            None => no_traffic_interval,
        },
        event_log_path: raw.event_log_path.filter(|p| !p.is_empty()),
        always_log_health_check_failures: raw.always_log_health_check_failures.unwrap_or(false),
        always_log_health_check_success: raw.always_log_health_check_success.unwrap_or(false),
    })
}

fn grpc_check(raw: RawGrpcHealthCheck, path: &str) -> Result<GrpcHealthCheck, ConfigError> {
    if let Some(authority) = &raw.authority
        && authority.parse::<http::uri::Authority>().is_err()
    {
        return Err(ConfigError::invalid(
            format!("{path}.authority"),
            format!("expected a host name, found `{authority}`"),
        ));
    }
    Ok(GrpcHealthCheck {
        service_name: raw.service_name,
        authority: raw.authority.filter(|a| !a.is_empty()),
    })
}

/// `{ text: HEX }` or `{ binary: BASE64 }` as bytes.
fn payload(raw: &RawPayload, path: &str) -> Result<Vec<u8>, ConfigError> {
    use base64::Engine;
    match (&raw.text, &raw.binary) {
        (Some(text), None) => unhex(text).ok_or_else(|| {
            ConfigError::invalid(
                format!("{path}.text"),
                "expected hexadecimal digits, in pairs",
            )
        }),
        (None, Some(binary)) => base64::engine::general_purpose::STANDARD
            .decode(binary)
            .map_err(|_| ConfigError::invalid(format!("{path}.binary"), "expected base64")),
        _ => Err(ConfigError::invalid(
            path,
            "expected one of `text` (hexadecimal) or `binary` (base64)",
        )),
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}

pub(crate) fn outlier_detection(
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
    let interval = positive(
        raw.interval.unwrap_or(std::time::Duration::from_secs(10)),
        &format!("{path}.interval"),
    )?;
    let success_rate = rate_ejection(
        raw.success_rate.unwrap_or_default(),
        RateEjection::SUCCESS_RATE,
        "stdev_factor",
        &format!("{path}.success_rate"),
    )?;
    let failure_percentage = rate_ejection(
        raw.failure_percentage.unwrap_or_default(),
        RateEjection::FAILURE_PERCENTAGE,
        "threshold",
        &format!("{path}.failure_percentage"),
    )?;
    let percent = |v: Option<u32>, default: u32, key: &str| match v.unwrap_or(default) {
        n @ 0..=100 => Ok(n),
        n => Err(ConfigError::invalid(
            format!("{path}.{key}"),
            format!("expected 0 to 100 (percent), found {n}"),
        )),
    };
    let split = raw.split_external_local_origin_errors.unwrap_or(false);
    if !split
        && (raw.consecutive_local_origin_failure.is_some()
            || raw.enforcing_local_origin_success_rate.is_some()
            || raw.enforcing_failure_percentage_local_origin.is_some())
    {
        return Err(ConfigError::invalid(
            path,
            "the local-origin settings apply with `split_external_local_origin_errors: true`",
        ));
    }
    let local_origin = split
        .then(|| -> Result<LocalOriginConfig, ConfigError> {
            Ok(LocalOriginConfig {
                consecutive_failure: raw.consecutive_local_origin_failure.unwrap_or(5),
                success_rate_enforcing: percent(
                    raw.enforcing_local_origin_success_rate,
                    100,
                    "enforcing_local_origin_success_rate",
                )?,
                failure_percentage_enforcing: percent(
                    raw.enforcing_failure_percentage_local_origin,
                    0,
                    "enforcing_failure_percentage_local_origin",
                )?,
            })
        })
        .transpose()?;
    // Envoy's defaults; the cap is never below one base time.
    Ok(OutlierDetectionConfig {
        local_origin,
        always_eject_one_host: raw.always_eject_one_host.unwrap_or(false),
        uneject_on_health_check: raw
            .successful_active_health_check_uneject_host
            .unwrap_or(true),
        interval,
        success_rate,
        failure_percentage,
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

/// A rate ejection's settings over `defaults`; `threshold_key` is the one its threshold has.
fn rate_ejection(
    raw: RawRateEjection,
    defaults: RateEjection,
    threshold_key: &str,
    path: &str,
) -> Result<RateEjection, ConfigError> {
    let (threshold, other) = match threshold_key {
        "stdev_factor" => (raw.stdev_factor, raw.threshold.map(|_| "threshold")),
        _ => (raw.threshold, raw.stdev_factor.map(|_| "stdev_factor")),
    };
    if let Some(key) = other {
        return Err(ConfigError::invalid(
            format!("{path}.{key}"),
            format!("not a key here (`{threshold_key}` is)"),
        ));
    }
    let percent = |v: Option<u32>, default: u32, key: &str| match v.unwrap_or(default) {
        n @ 0..=100 => Ok(n),
        n => Err(ConfigError::invalid(
            format!("{path}.{key}"),
            format!("expected 0 to 100 (percent), found {n}"),
        )),
    };
    let threshold = match threshold_key {
        "threshold" => percent(threshold, defaults.threshold, "threshold")?,
        _ => threshold.unwrap_or(defaults.threshold),
    };
    Ok(RateEjection {
        enforcing: percent(raw.enforcing, defaults.enforcing, "enforcing")?,
        minimum_hosts: raw.minimum_hosts.unwrap_or(defaults.minimum_hosts),
        request_volume: raw.request_volume.unwrap_or(defaults.request_volume),
        threshold,
    })
}

/// `lb_policy` and the options section that belongs to it.
pub(crate) fn lb_policy(raw: &RawCluster, path: &str) -> Result<LbPolicy, ConfigError> {
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

/// Envoy's range for HTTP/2 `max_concurrent_streams`: 1 to 2^31 - 1.
fn max_concurrent_streams(n: u32, path: &str) -> Result<u32, ConfigError> {
    if !(1..=i32::MAX as u32).contains(&n) {
        return Err(ConfigError::invalid(
            path,
            "expected 1 to 2147483647 streams",
        ));
    }
    Ok(n)
}

/// HTTP/2 PINGs to hosts, with Envoy's bounds and defaults (timeout 20 s, jitter 15%);
/// `None` when neither kind of PING is asked for.
fn upstream_keepalive(
    raw: crate::cluster::raw::RawUpstreamKeepalive,
    path: &str,
) -> Result<UpstreamKeepalive, ConfigError> {
    let timeout = raw.timeout.unwrap_or(Duration::from_secs(20));
    if timeout < Duration::from_millis(1) {
        return Err(ConfigError::invalid(
            format!("{path}.timeout"),
            "expected at least 1ms",
        ));
    }
    let interval_jitter = raw.interval_jitter.unwrap_or(15.0);
    if !(0.0..=100.0).contains(&interval_jitter) {
        return Err(ConfigError::invalid(
            format!("{path}.interval_jitter"),
            "expected a percentage from 0 to 100",
        ));
    }
    let interval = raw.interval.filter(|d| !d.is_zero());
    if interval.is_some_and(|d| d < Duration::from_millis(1)) {
        return Err(ConfigError::invalid(
            format!("{path}.interval"),
            "expected 0s (none) or at least 1ms",
        ));
    }
    let connection_idle_interval = raw.connection_idle_interval.filter(|d| !d.is_zero());
    if connection_idle_interval.is_some_and(|d| d < Duration::from_millis(100)) {
        return Err(ConfigError::invalid(
            format!("{path}.connection_idle_interval"),
            "expected 0s (none) or at least 100ms",
        ));
    }
    Ok(UpstreamKeepalive {
        interval,
        timeout,
        interval_jitter,
        connection_idle_interval,
    })
}

/// Keep-alive settings the kernel takes: whole seconds from 1, at least one probe.
pub(crate) fn tcp_keepalive(raw: RawTcpKeepalive, path: &str) -> Result<TcpKeepalive, ConfigError> {
    for (key, value) in [("time", raw.time), ("interval", raw.interval)] {
        if let Some(d) = value
            && (d.as_secs() == 0 || d.subsec_nanos() != 0 || d.as_secs() > i32::MAX as u64)
        {
            return Err(ConfigError::invalid(
                format!("{path}.{key}"),
                "expected whole seconds, at least 1s",
            ));
        }
    }
    if let Some(probes) = raw.probes
        && !(1..=i32::MAX as u32).contains(&probes)
    {
        return Err(ConfigError::invalid(
            format!("{path}.probes"),
            "expected at least 1",
        ));
    }
    Ok(TcpKeepalive {
        probes: raw.probes,
        time: raw.time,
        interval: raw.interval,
    })
}

/// A cluster's `zone_aware` settings, Envoy's defaults where not given.
fn zone_aware(
    raw: Option<&RawZoneAware>,
    path: &str,
) -> Result<balancer::ZoneAwareSettings, ConfigError> {
    let defaults = balancer::ZoneAwareSettings::default();
    let Some(raw) = raw else {
        return Ok(defaults);
    };
    let routing_enabled = match raw.routing_enabled {
        None => defaults.routing_enabled,
        // Rounded to a whole percent, as Envoy reads it.
        Some(p) if (0.0..=100.0).contains(&p) => p.round() as u32,
        Some(p) => {
            return Err(ConfigError::invalid(
                format!("{path}.zone_aware.routing_enabled"),
                format!("expected a percentage within 0..=100, found {p}"),
            ));
        }
    };
    let weight_basis = match raw.locality_basis.as_deref() {
        None | Some("healthy_hosts_num") => false,
        Some("healthy_hosts_weight") => true,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.zone_aware.locality_basis"),
                format!("expected `healthy_hosts_num` or `healthy_hosts_weight`, found `{other}`"),
            ));
        }
    };
    if raw.force_local_zone_min_size == Some(0) {
        return Err(ConfigError::invalid(
            format!("{path}.zone_aware.force_local_zone_min_size"),
            "expected at least 1 (0 would route to the local zone with no host there)",
        ));
    }
    Ok(balancer::ZoneAwareSettings {
        routing_enabled,
        min_cluster_size: raw.min_cluster_size.unwrap_or(defaults.min_cluster_size),
        force_local_zone_min_size: raw.force_local_zone_min_size,
        fail_traffic_on_panic: raw.fail_traffic_on_panic.unwrap_or(false),
        weight_basis,
    })
}

/// Each ratio within 1..=3; a predictive ratio only where the balancer can tell its next
/// picks. `None` when both are 1 (nothing opened ahead).
fn preconnect(
    raw: RawPreconnect,
    policy: &LbPolicy,
    path: &str,
) -> Result<Option<Preconnect>, ConfigError> {
    let ratio = |value: Option<f64>, key: &str| match value {
        None => Ok(1.0),
        Some(r) if (1.0..=MAX_PRECONNECT_RATIO).contains(&r) => Ok(r),
        Some(_) => Err(ConfigError::invalid(
            format!("{path}.{key}"),
            "expected a ratio from 1 to 3",
        )),
    };
    let per_upstream_ratio = ratio(raw.per_upstream_ratio, "per_upstream_ratio")?;
    let predictive_ratio = ratio(raw.predictive_ratio, "predictive_ratio")?;
    if predictive_ratio > 1.0 && !policy.peeks() {
        return Err(ConfigError::invalid(
            format!("{path}.predictive_ratio"),
            format!(
                "the {} policy cannot tell its next picks: predictive preconnect needs round_robin or random",
                policy.name()
            ),
        ));
    }
    Ok(
        (per_upstream_ratio > 1.0 || predictive_ratio > 1.0).then_some(Preconnect {
            per_upstream_ratio,
            predictive_ratio,
        }),
    )
}
