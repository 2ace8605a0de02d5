//! Settings of the `fault` filter (Envoy's fault injection): delays and aborts for a share
//! of requests, fixed or asked for by request headers, validated. `xds.rs` maps Envoy's
//! `HTTPFault`.

pub(crate) mod xds;

use std::time::Duration;

use http::StatusCode;
use serde::{Deserialize, Serialize, Serializer};

use crate::serialize as ser;
use crate::units::de_opt_duration;
use crate::*;

/// Faults injected into a share of requests: first a delay, then an abort.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay: Option<FaultDelay>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort: Option<FaultAbort>,
}

/// A delay before the request goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultDelay {
    /// `fixed`, or `header: true`: the milliseconds in `x-envoy-fault-delay-request`.
    #[serde(flatten)]
    pub source: DelaySource,
    #[serde(flatten)]
    pub share: FaultShare,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DelaySource {
    #[serde(serialize_with = "ser_fixed")]
    Fixed(Duration),
    #[serde(serialize_with = "ser_header")]
    Header,
}

/// An answer in the upstream's place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FaultAbort {
    /// `status`, or `header: true`: the status in `x-envoy-fault-abort-request`.
    #[serde(flatten)]
    pub source: AbortSource,
    #[serde(flatten)]
    pub share: FaultShare,
    /// The reply's body.
    pub body: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AbortSource {
    #[serde(serialize_with = "ser::status")]
    Status(StatusCode),
    /// A gRPC status (0 to 16): a gRPC request gets it in a trailers-only answer, any other
    /// a 200 with the body (Envoy's).
    GrpcStatus(u32),
    /// `x-envoy-fault-abort-request` (an HTTP status), or else
    /// `x-envoy-fault-abort-grpc-request` (a gRPC status).
    #[serde(serialize_with = "ser_header")]
    Header,
}

/// The share of requests a fault applies to, in millionths. A request's
/// `x-envoy-fault-*-request-percentage` header, for a header-driven fault, is a numerator
/// of `header_denominator` (Envoy's: the configured percentage's denominator; 100 in the
/// file), capped at this share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FaultShare {
    #[serde(serialize_with = "ser_percentage", rename = "percentage")]
    pub per_million: u32,
    #[serde(skip)]
    pub header_denominator: u32,
}

impl FaultShare {
    /// The share for a request that says `header` (a numerator), in millionths.
    pub fn with_header(&self, header: Option<u32>) -> u32 {
        match header {
            Some(numerator) => {
                let scale = 1_000_000 / self.header_denominator.max(1);
                numerator.saturating_mul(scale).min(self.per_million)
            }
            None => self.per_million,
        }
    }
}

fn ser_fixed<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    ser::duration(d, s)
}

fn ser_header<S: Serializer>(s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str("header")
}

fn ser_percentage<S: Serializer>(per_million: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{}%", f64::from(*per_million) / 10_000.0))
}

/// The abort's body unless configured, as Envoy's.
pub const DEFAULT_FAULT_ABORT_BODY: &str = "fault filter abort";

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFault {
    pub delay: Option<RawFaultDelay>,
    pub abort: Option<RawFaultAbort>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFaultDelay {
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub fixed: Option<Duration>,
    pub header: Option<bool>,
    pub percentage: serde_yaml::Value,
    /// From a management server: the denominator of its percentage.
    #[serde(skip)]
    pub denominator: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFaultAbort {
    pub status: Option<u16>,
    pub grpc_status: Option<u32>,
    pub header: Option<bool>,
    pub percentage: serde_yaml::Value,
    pub body: Option<String>,
    /// From a management server: the denominator of its percentage.
    #[serde(skip)]
    pub denominator: Option<u32>,
}

/// `10%`, `0.5%` or a number of percent (the share of mirrored requests is read the same
/// way), as millionths.
fn share(
    value: &serde_yaml::Value,
    denominator: Option<u32>,
    path: &str,
) -> Result<FaultShare, ConfigError> {
    let per_million = crate::matchers::fraction(value).ok_or_else(|| {
        ConfigError::invalid(
            path,
            "expected a percentage from 0% to 100% (`10%`, `0.5%`)",
        )
    })?;
    Ok(FaultShare {
        per_million,
        header_denominator: denominator.unwrap_or(100),
    })
}

pub(crate) fn fault(raw: RawFault, path: &str, _on_route: bool) -> Result<FaultConfig, ConfigError> {
    let delay = raw
        .delay
        .map(|d| -> Result<FaultDelay, ConfigError> {
            let at = format!("{path}.delay");
            let source = match (d.fixed, d.header.unwrap_or(false)) {
                (Some(fixed), false) => DelaySource::Fixed(fixed),
                (None, true) => DelaySource::Header,
                _ => {
                    return Err(ConfigError::invalid(
                        at,
                        "expected `fixed: DURATION` or `header: true`",
                    ));
                }
            };
            Ok(FaultDelay {
                source,
                share: share(&d.percentage, d.denominator, &format!("{at}.percentage"))?,
            })
        })
        .transpose()?;
    let abort = raw
        .abort
        .map(|a| -> Result<FaultAbort, ConfigError> {
            let at = format!("{path}.abort");
            let source = match (a.status, a.grpc_status, a.header.unwrap_or(false)) {
                (Some(code), None, false) => match StatusCode::from_u16(code) {
                    Ok(status) if (200..600).contains(&code) => AbortSource::Status(status),
                    _ => {
                        return Err(ConfigError::invalid(
                            format!("{at}.status"),
                            format!("expected a status from 200 to 599, found {code}"),
                        ));
                    }
                },
                (None, Some(code), false) if code <= 16 => AbortSource::GrpcStatus(code),
                (None, Some(code), false) => {
                    return Err(ConfigError::invalid(
                        format!("{at}.grpc_status"),
                        format!("expected a gRPC status from 0 to 16, found {code}"),
                    ));
                }
                (None, None, true) => AbortSource::Header,
                _ => {
                    return Err(ConfigError::invalid(
                        at,
                        "expected one of `status: CODE`, `grpc_status: CODE` or `header: true`",
                    ));
                }
            };
            Ok(FaultAbort {
                source,
                share: share(&a.percentage, a.denominator, &format!("{at}.percentage"))?,
                body: a.body.unwrap_or_else(|| DEFAULT_FAULT_ABORT_BODY.to_owned()),
            })
        })
        .transpose()?;
    Ok(FaultConfig { delay, abort })
}

per_route_settings!(FaultConfig, RawFault, fault);
