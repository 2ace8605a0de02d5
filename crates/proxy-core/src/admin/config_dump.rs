//! `/config_dump`: the effective configuration as JSON, defaults filled in and per-core limits
//! resolved to the numbers in force.

use std::time::Duration;

use serde_json::{Value, json};

use crate::config::{
    AuthzService, Concurrency, Config, ExtAuthzConfig, HeaderValueMatch, HostMatch, LbPolicy,
    LimitSpec, ListenerTlsConfig, PathMatch, RetryPolicy, RouteAction, ServerNameMatch, TlsVersion,
    UnknownServerName, UpstreamProtocol,
};

/// Durations are shown as the config file writes them.
fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !d.subsec_micros().is_multiple_of(1000) {
        format!("{}us", d.as_micros())
    } else if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else {
        format!("{}s", d.as_secs())
    }
}

/// A breaker limit as resolved for this process, with what was written when it was per core.
fn limit(spec: LimitSpec, workers: usize) -> Value {
    match spec {
        LimitSpec::Fixed(_) => json!({ "resolved": spec.resolve(workers) }),
        LimitSpec::PerCore(n) => json!({ "per_core": n, "resolved": spec.resolve(workers) }),
    }
}

fn retry_policy(policy: &RetryPolicy) -> Value {
    let on = policy.retry_on;
    let conditions: Vec<&str> = [
        (on.connect_failure, "connect-failure"),
        (on.refused_stream, "refused-stream"),
        (on.reset, "reset"),
        (on.server_error, "5xx"),
        (on.gateway_error, "gateway-error"),
        (on.retriable_status_codes, "retriable-status-codes"),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name))
    .collect();
    json!({
        "retry_on": conditions,
        "num_retries": policy.num_retries,
        "per_try_timeout": policy.per_try_timeout.map(duration),
        "retriable_status_codes": policy.retriable_status_codes,
    })
}

pub(crate) fn config_dump(config: &Config, workers: usize) -> Value {
    let listeners: Vec<Value> = config
        .listeners
        .iter()
        .map(|l| {
            let routes: Vec<Value> = l
                .routes
                .iter()
                .map(|r| {
                    let mut m = serde_json::Map::new();
                    match &r.matcher.path {
                        PathMatch::Prefix(p) => m.insert("prefix".into(), json!(p)),
                        PathMatch::Exact(p) => m.insert("path".into(), json!(p)),
                    };
                    match &r.matcher.host {
                        HostMatch::Any => None,
                        HostMatch::Exact(h) => m.insert("host".into(), json!(h)),
                        HostMatch::Suffix(s) => m.insert("host".into(), json!(format!("*{s}"))),
                    };
                    if !r.matcher.headers.is_empty() {
                        let headers: Vec<Value> = r
                            .matcher
                            .headers
                            .iter()
                            .map(|h| match &h.value {
                                HeaderValueMatch::Exact(v) => json!({
                                    "name": h.name.as_str(),
                                    "exact": String::from_utf8_lossy(v.as_bytes()),
                                }),
                                HeaderValueMatch::Present => {
                                    json!({ "name": h.name.as_str(), "present": true })
                                }
                                HeaderValueMatch::Absent => {
                                    json!({ "name": h.name.as_str(), "present": false })
                                }
                            })
                            .collect();
                        m.insert("headers".into(), Value::Array(headers));
                    }
                    let route = match &r.action {
                        RouteAction::DirectResponse { status, body } => json!({
                            "match": m,
                            "direct_response": {
                                "status": status.as_u16(),
                                "body": String::from_utf8_lossy(body),
                            },
                        }),
                        RouteAction::Forward(f) => json!({
                            "match": m,
                            "cluster": config.clusters[f.cluster].name,
                            "timeout": duration(f.timeout),
                            "host_rewrite": f.host_rewrite.as_ref().map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
                            "retry_policy": f.retry_policy.as_ref().map(retry_policy),
                        }),
                    };
                    let mut route = route;
                    if r.ext_authz.disabled {
                        route["ext_authz"] = json!("disabled");
                    } else if !r.ext_authz.context_extensions.is_empty() {
                        route["ext_authz"] = json!({
                            "context_extensions": r.ext_authz.context_extensions.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
                        });
                    }
                    route
                })
                .collect();
            json!({
                "name": l.name,
                "address": l.address.to_string(),
                "connection_limit": l.connection_limit,
                "connection_balance": match l.connection_balance {
                    crate::config::ConnectionBalance::ReusePort => "reuse_port",
                    crate::config::ConnectionBalance::Exact => "exact",
                },
                "per_connection_buffer_limit_bytes": l.buffer_limit,
                "http": {
                    "max_concurrent_streams": l.http.max_concurrent_streams,
                    "idle_timeout": duration(l.http.idle_timeout),
                    "request_headers_timeout": duration(l.http.request_headers_timeout),
                    "max_request_headers_kb": l.http.max_request_headers_kb,
                    "max_requests_per_connection": l.http.max_requests_per_connection,
                },
                "tls": l.tls.as_ref().map(listener_tls),
                "ext_authz": l.ext_authz.as_ref().map(ext_authz),
                "routes": routes,
            })
        })
        .collect();
    let clusters: Vec<Value> = config
        .clusters
        .iter()
        .map(|c| {
            json!({
                "name": c.name,
                "endpoints": c.endpoints.iter().map(|e| json!({ "address": e.address.to_string(), "weight": e.weight })).collect::<Vec<_>>(),
                "lb_policy": c.lb_policy.name(),
                "least_request": match c.lb_policy {
                    LbPolicy::LeastRequest(o) => json!({ "choice_count": o.choice_count, "active_request_bias": o.active_request_bias }),
                    _ => Value::Null,
                },
                "ring_hash": match c.lb_policy {
                    LbPolicy::RingHash(o) => json!({ "minimum_ring_size": o.minimum_ring_size, "maximum_ring_size": o.maximum_ring_size }),
                    _ => Value::Null,
                },
                "maglev": match c.lb_policy {
                    LbPolicy::Maglev(o) => json!({ "table_size": o.table_size }),
                    _ => Value::Null,
                },
                "hash_key": match &c.hash_key {
                    None => Value::Null,
                    Some(crate::config::HashKey::Header(h)) => json!({ "header": h.as_str() }),
                    Some(crate::config::HashKey::Cookie(name)) => json!({ "cookie": name }),
                    Some(crate::config::HashKey::SourceIp) => json!({ "source_ip": true }),
                },
                "protocol": match c.protocol {
                    UpstreamProtocol::Http1 => "http1",
                    UpstreamProtocol::Http2 => "http2",
                },
                "connect_timeout": duration(c.connect_timeout),
                "max_requests_per_connection": c.max_requests_per_connection,
                "per_connection_buffer_limit_bytes": c.buffer_limit,
                "circuit_breakers": {
                    "max_connections": limit(c.circuit_breakers.max_connections, workers),
                    "max_pending_requests": limit(c.circuit_breakers.max_pending_requests, workers),
                    "max_requests": limit(c.circuit_breakers.max_requests, workers),
                    "max_retries": limit(c.circuit_breakers.max_retries, workers),
                    "pending_timeout": duration(c.circuit_breakers.pending_timeout),
                },
                "health_check": c.health_check.as_ref().map(|h| json!({
                    "path": h.path,
                    "host": h.host,
                    "interval": duration(h.interval),
                    "jitter": duration(h.jitter),
                    "timeout": duration(h.timeout),
                    "healthy_threshold": h.healthy_threshold,
                    "unhealthy_threshold": h.unhealthy_threshold,
                })),
                "outlier_detection": c.outlier_detection.map(|o| json!({
                    "consecutive_5xx": o.consecutive_5xx,
                    "consecutive_gateway_failure": o.consecutive_gateway_failure,
                    "base_ejection_time": duration(o.base_ejection_time),
                    "max_ejection_percent": o.max_ejection_percent,
                })),
                "tls": c.tls.as_ref().map(|t| json!({
                    "ca": t.ca.as_ref().map_or_else(|| json!("system"), |ca| json!(ca.display().to_string())),
                    "server_name": t.server_name,
                    "client_certificate": t.client_certificate.as_ref().map(|k| json!({
                        "cert_chain": k.cert_chain.display().to_string(),
                        "private_key": k.private_key.display().to_string(),
                    })),
                    "min_version": tls_version(t.min_version),
                })),
            })
        })
        .collect();
    json!({
        "concurrency": match config.concurrency {
            Concurrency::Auto => json!("auto"),
            Concurrency::Fixed(n) => json!(n.get()),
        },
        "workers": workers,
        "drain_timeout": duration(config.drain_timeout),
        "admin": config.admin.map(|a| a.to_string()),
        "max_connections": config.max_connections,
        "listeners": listeners,
        "clusters": clusters,
    })
}

fn ext_authz(a: &ExtAuthzConfig) -> Value {
    let service = match &a.service {
        AuthzService::Grpc { endpoint } => json!({ "grpc": { "address": endpoint.to_string() } }),
        AuthzService::Http {
            endpoint,
            path_prefix,
            allowed_headers,
            allowed_upstream_headers,
        } => json!({ "http": {
            "address": endpoint.to_string(),
            "path_prefix": path_prefix,
            "allowed_headers": allowed_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
            "allowed_upstream_headers": allowed_upstream_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
        } }),
    };
    json!({
        "service": service,
        "timeout": duration(a.timeout),
        "failure_mode_allow": a.failure_mode_allow,
        "status_on_error": a.status_on_error.as_u16(),
        "with_request_body": a.with_request_body.map(|b| json!({
            "max_request_bytes": b.max_request_bytes,
            "allow_partial_message": b.allow_partial_message,
        })),
    })
}

fn tls_version(v: TlsVersion) -> &'static str {
    match v {
        TlsVersion::Tls12 => "1.2",
        TlsVersion::Tls13 => "1.3",
    }
}

fn listener_tls(t: &ListenerTlsConfig) -> Value {
    json!({
        "certificates": t.certificates.iter().map(|c| json!({
            "cert_chain": c.cert_chain.display().to_string(),
            "private_key": c.private_key.display().to_string(),
            "server_names": c.server_names.iter().map(|n| match n {
                ServerNameMatch::Exact(name) => name.clone(),
                ServerNameMatch::Wildcard(parent) => format!("*.{parent}"),
            }).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "default_certificate": t.default_certificate(),
        "unknown_server_name": match t.unknown_server_name {
            UnknownServerName::Default => "default",
            UnknownServerName::Reject => "reject",
        },
        "min_version": tls_version(t.min_version),
        "alpn": t.alpn.iter().map(|p| String::from_utf8_lossy(p.id()).into_owned()).collect::<Vec<_>>(),
        "session_tickets": t.session_tickets,
        "session_cache_size": t.session_cache_size,
        "handshake_timeout": duration(t.handshake_timeout),
        "client_certificate": t.client_certificate.as_ref().map(|c| json!({
            "ca": c.ca.display().to_string(),
            "required": c.required,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_written() {
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
        assert_eq!(duration(Duration::from_secs(15)), "15s");
        assert_eq!(duration(Duration::from_micros(1500)), "1500us");
    }

    #[test]
    fn defaults_appear_filled_in() {
        let config = Config::from_yaml(
            "listeners:\n  - name: l\n    address: 127.0.0.1:1\n    routes:\n      - match: { prefix: / }\n        cluster: c\nclusters:\n  - name: c\n    endpoints: [127.0.0.1:2]\n",
        )
        .unwrap();
        let dump = config_dump(&config, 3);
        assert_eq!(dump["workers"], 3);
        assert_eq!(dump["drain_timeout"], "5s");
        assert_eq!(dump["admin"], "127.0.0.1:9901");
        assert_eq!(dump["listeners"][0]["routes"][0]["timeout"], "15s");
        assert_eq!(dump["clusters"][0]["connect_timeout"], "1s");
        assert_eq!(dump["clusters"][0]["protocol"], "http1");
    }
}
