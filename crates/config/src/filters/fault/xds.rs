//! Envoy's `HTTPFault` (the `envoy.filters.http.fault` filter and its per-route settings)
//! as the `fault` filter's settings.

use envoy_types::pb::envoy::extensions::filters::common::fault::v3::fault_delay;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{HttpFault, fault_abort};
use envoy_types::pb::envoy::r#type::v3::FractionalPercent;
use envoy_types::pb::google::protobuf::Any;

use super::{RawFault, RawFaultAbort, RawFaultDelay};
use crate::envoy::{ResourceError, decode, duration, fields, nothing_else};

pub(crate) const TYPE_URL: &str = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault";

/// The filter's settings, on the listener or on a route.
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawFault, ResourceError> {
    let mut fault: HttpFault = decode(any, TYPE_URL, "an HTTPFault")?;
    let delay = match fault.delay.take() {
        None => None,
        Some(mut delay) => {
            let at = format!("{at}.delay");
            let (share, denominator) = percentage(delay.percentage.take(), &at)?;
            let (fixed, header) = match delay.fault_delay_secifier.take() {
                Some(fault_delay::FaultDelaySecifier::FixedDelay(d)) => {
                    (duration(Some(d), &format!("{at}.fixed_delay"))?, None)
                }
                Some(fault_delay::FaultDelaySecifier::HeaderDelay(_)) => (None, Some(true)),
                None => {
                    return Err(ResourceError::invalid(
                        at,
                        "expected fixed_delay or header_delay",
                    ));
                }
            };
            nothing_else(&delay, fields::FAULT_DELAY, &at)?;
            Some(RawFaultDelay {
                fixed,
                header,
                percentage: share,
                denominator: Some(denominator),
            })
        }
    };
    let abort = match fault.abort.take() {
        None => None,
        Some(mut abort) => {
            let at = format!("{at}.abort");
            let (share, denominator) = percentage(abort.percentage.take(), &at)?;
            let (status, grpc_status, header) = match abort.error_type.take() {
                Some(fault_abort::ErrorType::HttpStatus(code)) => (
                    Some(u16::try_from(code).map_err(|_| {
                        ResourceError::invalid(format!("{at}.http_status"), "not a status")
                    })?),
                    None,
                    None,
                ),
                Some(fault_abort::ErrorType::GrpcStatus(code)) => (None, Some(code), None),
                Some(fault_abort::ErrorType::HeaderAbort(_)) => (None, None, Some(true)),
                None => {
                    return Err(ResourceError::invalid(
                        at,
                        "expected http_status, grpc_status or header_abort",
                    ));
                }
            };
            let body = std::mem::take(&mut abort.response_body);
            nothing_else(&abort, fields::FAULT_ABORT, &at)?;
            Some(RawFaultAbort {
                status,
                grpc_status,
                header,
                percentage: share,
                body: (!body.is_empty()).then_some(body),
                denominator: Some(denominator),
            })
        }
    };
    // Runtime keys name overrides of a runtime this proxy does not have: the values given
    // here stand, as in an Envoy whose runtime does not set them.
    fault.delay_percent_runtime.clear();
    fault.abort_percent_runtime.clear();
    fault.delay_duration_runtime.clear();
    fault.abort_http_status_runtime.clear();
    fault.max_active_faults_runtime.clear();
    fault.response_rate_limit_percent_runtime.clear();
    fault.abort_grpc_status_runtime.clear();
    fault.disable_downstream_cluster_stats = false;
    nothing_else(&fault, fields::HTTP_FAULT, at)?;
    Ok(RawFault { delay, abort })
}

/// A fractional percentage as a percent value and its denominator; absent is 0%, as Envoy.
fn percentage(
    value: Option<FractionalPercent>,
    at: &str,
) -> Result<(serde_yaml::Value, u32), ResourceError> {
    let Some(value) = value else {
        return Ok((serde_yaml::Value::Number(0.into()), 100));
    };
    let (percent, denominator) =
        crate::envoy::fractional_percent(&value, &format!("{at}.percentage"))?;
    Ok((serde_yaml::Value::Number(percent.into()), denominator))
}
