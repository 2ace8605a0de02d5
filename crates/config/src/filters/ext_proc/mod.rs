//! Settings of the `ext_proc` filter (Envoy's `ext_proc`): each request opens a stream to an
//! external processor (`envoy.service.ext_proc.v3.ExternalProcessor/Process`), which is sent
//! the request's and the response's headers and bodies as the processing mode says, and may
//! change them, or answer the request itself.
//!
//! The listener names the processor, the processing mode and the failure mode; a route (or
//! virtual host) may turn the filter off, or give a processing mode or failure mode of its own.

pub(crate) mod xds;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::filters::grpc_service::{GrpcService, RawGrpcService, grpc_service};
use crate::serialize as ser;
use crate::units::{de_opt_duration, de_opt_size};
use crate::*;

/// Envoy's default: each message to the processor is answered within this.
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_millis(200);

/// The filter's settings on a listener.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExtProcConfig {
    pub service: GrpcService,
    pub processing_mode: ProcessingMode,
    /// A processor that fails (an error, no answer in time, a message out of turn) lets the
    /// exchange go on unprocessed; otherwise the client gets `status_on_error`.
    pub failure_mode_allow: bool,
    /// Each message's answer is awaited this long.
    #[serde(serialize_with = "ser::duration")]
    pub message_timeout: Duration,
    /// The status of an exchange the processor failed (without `failure_mode_allow`).
    pub status_on_error: u16,
    /// The processor may change the processing mode in its answer to the request headers.
    pub allow_mode_override: bool,
    /// An immediate response from the processor is a failure instead of the answer.
    pub disable_immediate_response: bool,
    /// The route is not matched again when the processor asks (`clear_route_cache`).
    pub disable_clear_route_cache: bool,
    /// The most body bytes buffered for the processor (`buffered` and `buffered_partial`),
    /// or held awaiting answers (`streamed`): the listener's buffer limit.
    pub buffer_limit: u64,
}

/// What the processor is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ProcessingMode {
    pub request_headers: HeaderMode,
    pub response_headers: HeaderMode,
    pub request_body: BodyMode,
    pub response_body: BodyMode,
}

impl Default for ProcessingMode {
    /// Envoy's: the headers both ways, no bodies.
    fn default() -> Self {
        Self {
            request_headers: HeaderMode::Send,
            response_headers: HeaderMode::Send,
            request_body: BodyMode::None,
            response_body: BodyMode::None,
        }
    }
}

impl ProcessingMode {
    /// Whether anything at all is sent.
    pub fn sends_anything(&self) -> bool {
        self.request_headers == HeaderMode::Send
            || self.response_headers == HeaderMode::Send
            || self.request_body != BodyMode::None
            || self.response_body != BodyMode::None
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeaderMode {
    Send,
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyMode {
    /// Not sent.
    None,
    /// The whole body in one message; a body over the buffer limit fails the exchange
    /// (413 for a request).
    Buffered,
    /// The body's start, up to the buffer limit, in one message; the rest goes on as it is.
    BufferedPartial,
    /// Each chunk in a message of its own as it comes, passed on when its answer comes.
    /// Chunks awaiting answers are held up to the buffer limit; past it, the body is not read
    /// on until answers come.
    Streamed,
}

/// What a route or virtual host gives the filter instead of the listener's settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ExtProcRoute {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processing_mode: Option<ProcessingMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure_mode_allow: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExtProc {
    pub service: Option<RawGrpcService>,
    pub processing_mode: Option<RawProcessingMode>,
    pub failure_mode_allow: Option<bool>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub message_timeout: Option<Duration>,
    pub status_on_error: Option<u16>,
    pub allow_mode_override: Option<bool>,
    pub disable_immediate_response: Option<bool>,
    pub disable_clear_route_cache: Option<bool>,
    /// At most the listener's buffer limit (its default).
    #[serde(default, deserialize_with = "de_opt_size")]
    pub max_body_bytes: Option<u64>,
}

/// A processing mode as written: what is not given is Envoy's default.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProcessingMode {
    pub request_headers: Option<HeaderMode>,
    pub response_headers: Option<HeaderMode>,
    pub request_body: Option<BodyMode>,
    pub response_body: Option<BodyMode>,
}

impl RawProcessingMode {
    pub fn checked(self) -> ProcessingMode {
        let default = ProcessingMode::default();
        ProcessingMode {
            request_headers: self.request_headers.unwrap_or(default.request_headers),
            response_headers: self.response_headers.unwrap_or(default.response_headers),
            request_body: self.request_body.unwrap_or(default.request_body),
            response_body: self.response_body.unwrap_or(default.response_body),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExtProcRoute {
    pub processing_mode: Option<RawProcessingMode>,
    pub failure_mode_allow: Option<bool>,
}

impl FilterSettings for ExtProcConfig {
    type Raw = RawExtProc;
    type RawRoute = RawPerRoute<RawExtProcRoute>;
    type Route = PerRoute<ExtProcRoute>;

    fn check(raw: RawExtProc, path: &str, chain: &ChainCtx<'_>) -> Result<Self, ConfigError> {
        ext_proc(raw, path, chain.buffer_limit)
    }

    fn check_route(raw: Self::RawRoute, path: &str) -> Result<Self::Route, ConfigError> {
        per_route(raw, path, |raw, _| {
            Ok(ExtProcRoute {
                processing_mode: raw.processing_mode.map(RawProcessingMode::checked),
                failure_mode_allow: raw.failure_mode_allow,
            })
        })
    }

    fn route_switch(on: bool) -> Self::RawRoute {
        RawPerRoute::Word(if on { "enabled" } else { "disabled" }.into())
    }
}

fn ext_proc(raw: RawExtProc, path: &str, buffer_limit: u32) -> Result<ExtProcConfig, ConfigError> {
    let service = grpc_service(raw.service, &format!("{path}.service"), "external processor")?;
    let message_timeout = raw.message_timeout.unwrap_or(DEFAULT_MESSAGE_TIMEOUT);
    if message_timeout.is_zero() {
        return Err(ConfigError::invalid(format!("{path}.message_timeout"), "expected more than 0s"));
    }
    let status_on_error = match raw.status_on_error.unwrap_or(500) {
        code @ 400..=599 => code,
        other => {
            return Err(ConfigError::invalid(
                format!("{path}.status_on_error"),
                format!("expected an error status (400 to 599), found {other}"),
            ));
        }
    };
    let buffer_limit = match raw.max_body_bytes {
        None => u64::from(buffer_limit),
        Some(max) if max > 0 && max <= u64::from(buffer_limit) => max,
        Some(other) => {
            return Err(ConfigError::invalid(
                format!("{path}.max_body_bytes"),
                format!("expected 1 byte up to the listener's buffer limit ({buffer_limit} bytes), found {other}"),
            ));
        }
    };
    Ok(ExtProcConfig {
        service,
        processing_mode: raw.processing_mode.unwrap_or_default().checked(),
        failure_mode_allow: raw.failure_mode_allow.unwrap_or(false),
        message_timeout,
        status_on_error,
        allow_mode_override: raw.allow_mode_override.unwrap_or(false),
        disable_immediate_response: raw.disable_immediate_response.unwrap_or(false),
        disable_clear_route_cache: raw.disable_clear_route_cache.unwrap_or(false),
        buffer_limit,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use super::*;

    fn check(yaml: &str) -> Result<ExtProcConfig, String> {
        let raw: RawExtProc = serde_yaml::from_str(yaml).map_err(|e| e.to_string())?;
        ext_proc(raw, "f", 32 * 1024).map_err(|e| e.to_string())
    }

    #[test]
    fn envoys_defaults_and_what_is_checked_at_load() {
        let config = check("service: { address: 127.0.0.1:9000 }").unwrap();
        assert_eq!(config.processing_mode, ProcessingMode::default());
        assert_eq!(config.message_timeout, DEFAULT_MESSAGE_TIMEOUT);
        assert_eq!((config.status_on_error, config.buffer_limit), (500, 32 * 1024));
        assert!(!config.failure_mode_allow && !config.allow_mode_override);
        let config = check(
            "service: { address: 127.0.0.1:9000 }\nprocessing_mode: { request_headers: skip, request_body: buffered_partial }\nmax_body_bytes: 1KiB",
        )
        .unwrap();
        assert_eq!(config.processing_mode.request_headers, HeaderMode::Skip);
        assert_eq!(config.processing_mode.response_headers, HeaderMode::Send);
        assert_eq!(config.processing_mode.request_body, BodyMode::BufferedPartial);
        assert_eq!(config.buffer_limit, 1024);
        let streamed = check("service: { address: 127.0.0.1:9000 }\nprocessing_mode: { response_body: streamed }").unwrap();
        assert_eq!(streamed.processing_mode.response_body, BodyMode::Streamed);
        let dumped = serde_json::to_value(&config).unwrap();
        assert_eq!(dumped["processing_mode"]["request_body"], "buffered_partial");
        for (yaml, complaint) in [
            ("failure_mode_allow: true", "f.service"),
            ("service: { address: nowhere }", "f.service.address"),
            ("service: { address: 127.0.0.1:1 }\nmessage_timeout: 0s", "f.message_timeout"),
            ("service: { address: 127.0.0.1:1 }\nstatus_on_error: 200", "f.status_on_error"),
            ("service: { address: 127.0.0.1:1 }\nmax_body_bytes: 1MiB", "f.max_body_bytes"),
            ("service: { address: 127.0.0.1:1 }\nprocessing_mode: { request_body: full_duplex }", "full_duplex"),
        ] {
            let err = check(yaml).unwrap_err();
            assert!(err.contains(complaint), "{yaml}: {err}");
        }
    }
}
