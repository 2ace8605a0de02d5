//! How a listener finds a request's original client address behind proxies it trusts
//! (Envoy's `original_ip_detection_extensions`): a header naming it (a load balancer's or
//! CDN's), or an entry of `x-forwarded-for`, tried in order; with none found, the
//! connection's peer. The data plane's side is proxy-core's `context/client.rs`.

use http::{HeaderName, StatusCode};
use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// One way to find the client, tried in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientDetection {
    /// The header's first value, when it is an IP address; without one, the request is
    /// refused with `reject_with_status` if given, else the next way is tried.
    CustomHeader {
        #[serde(serialize_with = "crate::serialize::header_name")]
        name: HeaderName,
        #[serde(
            serialize_with = "crate::serialize::opt_status",
            skip_serializing_if = "Option::is_none"
        )]
        reject_with_status: Option<StatusCode>,
    },
    /// From `x-forwarded-for`: the entry `num_trusted_hops` places from the right (0: the
    /// last); or, with `trusted_cidrs`, for a peer in them, the first entry from the right
    /// that is not (the leftmost when all are). `append_peer`: the peer is appended to the
    /// header when it found the client (Envoy's `skip_xff_append: false`).
    Xff {
        num_trusted_hops: u32,
        #[serde(serialize_with = "ser_nets", skip_serializing_if = "Vec::is_empty")]
        trusted_cidrs: Vec<ipnet::IpNet>,
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        append_peer: bool,
    },
}

fn ser_nets<S: serde::Serializer>(nets: &[ipnet::IpNet], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(nets.iter().map(|n| n.to_string()))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientDetection {
    pub custom_header: Option<RawCustomHeader>,
    pub xff: Option<RawXff>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCustomHeader {
    pub name: String,
    pub reject_with_status: Option<u16>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawXff {
    pub num_trusted_hops: Option<u32>,
    #[serde(default)]
    pub trusted_cidrs: Vec<String>,
    #[serde(default)]
    pub append_peer: bool,
}

/// Checks `http.original_ip_detection` (`path`).
pub(crate) fn client_detection(
    raw: Vec<RawClientDetection>,
    path: &str,
) -> Result<Vec<ClientDetection>, ConfigError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, way)| {
            let at = format!("{path}[{i}]");
            match (way.custom_header, way.xff) {
                (Some(header), None) => {
                    let name = HeaderName::from_bytes(header.name.to_ascii_lowercase().as_bytes())
                        .map_err(|_| {
                            ConfigError::invalid(
                                format!("{at}.custom_header.name"),
                                format!("expected a header name, found `{}`", header.name),
                            )
                        })?;
                    let reject_with_status = header
                        .reject_with_status
                        .map(|code| {
                            StatusCode::from_u16(code)
                                .ok()
                                .filter(|s| (400..=511).contains(&s.as_u16()))
                                .ok_or_else(|| {
                                    ConfigError::invalid(
                                        format!("{at}.custom_header.reject_with_status"),
                                        format!("expected a status from 400 to 511, found {code}"),
                                    )
                                })
                        })
                        .transpose()?;
                    Ok(ClientDetection::CustomHeader {
                        name,
                        reject_with_status,
                    })
                }
                (None, Some(xff)) => {
                    if xff.num_trusted_hops.is_some() && !xff.trusted_cidrs.is_empty() {
                        return Err(ConfigError::invalid(
                            format!("{at}.xff"),
                            "expected one of `num_trusted_hops` and `trusted_cidrs`",
                        ));
                    }
                    let trusted_cidrs = xff
                        .trusted_cidrs
                        .iter()
                        .enumerate()
                        .map(|(j, net)| {
                            net.parse::<ipnet::IpNet>()
                                .or_else(|_| {
                                    net.parse::<std::net::IpAddr>().map(ipnet::IpNet::from)
                                })
                                .map(|n| n.trunc())
                                .map_err(|_| {
                                    ConfigError::invalid(
                                        format!("{at}.xff.trusted_cidrs[{j}]"),
                                        format!("expected an address range, found `{net}`"),
                                    )
                                })
                        })
                        .collect::<Result<_, _>>()?;
                    Ok(ClientDetection::Xff {
                        num_trusted_hops: xff.num_trusted_hops.unwrap_or(0),
                        trusted_cidrs,
                        append_peer: xff.append_peer,
                    })
                }
                _ => Err(ConfigError::invalid(
                    at,
                    "expected one of `custom_header: { name }` and `xff: { num_trusted_hops }`",
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn load(http: &str) -> Result<Config, String> {
        Config::from_yaml(&format!(
            "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    http: {http}\n    routes:\n      - match: {{ prefix: / }}\n        direct_response: {{ status: 200 }}\n"
        ))
        .map_err(|e| e.to_string())
    }

    #[test]
    fn ways_are_read_in_order_and_turn_the_forwarded_rules_off() {
        let config = load(
            "{ original_ip_detection: [{ custom_header: { name: X-Real-IP, reject_with_status: 403 } }, { xff: { num_trusted_hops: 2 } }] }",
        )
        .unwrap();
        let http = &config.listeners[0].http;
        assert!(
            !http.use_remote_address,
            "no peer appended with ways to find the client"
        );
        assert_eq!(
            serde_json::to_value(&http.original_ip_detection).unwrap(),
            serde_json::json!([
                { "custom_header": { "name": "x-real-ip", "reject_with_status": 403 } },
                { "xff": { "num_trusted_hops": 2 } },
            ])
        );
    }

    #[test]
    fn bad_ways_are_refused_by_path() {
        for (http, says) in [
            (
                "{ original_ip_detection: [{}] }",
                "listeners[0].http.original_ip_detection[0]: expected one of",
            ),
            (
                "{ original_ip_detection: [{ custom_header: { name: 'a b' } }] }",
                "original_ip_detection[0].custom_header.name",
            ),
            (
                "{ original_ip_detection: [{ custom_header: { name: x, reject_with_status: 302 } }] }",
                "expected a status from 400 to 511",
            ),
            (
                "{ use_remote_address: true, original_ip_detection: [{ xff: {} }] }",
                "not with them",
            ),
        ] {
            let error = load(http).unwrap_err();
            assert!(error.contains(says), "{http}: {error}");
        }
    }
}
