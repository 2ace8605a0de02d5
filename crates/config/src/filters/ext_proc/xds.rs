//! Envoy's `ExternalProcessor` (the `envoy.filters.http.ext_proc` filter) and
//! `ExtProcPerRoute` as the `ext_proc` filter's settings. The processor is named by a cluster
//! (one endpoint) or an address, as for the rate limit service. What changes the exchange and
//! is not done here (full-duplex bodies, trailers, attributes, metadata, mutation rules)
//! is refused by name.

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::{
    BodySendMode, HeaderSendMode,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::{
    ExtProcPerRoute, ExternalProcessor, ProcessingMode, ext_proc_per_route,
};
use envoy_types::pb::google::protobuf::Any;

use super::{BodyMode, HeaderMode, RawExtProc, RawExtProcRoute, RawProcessingMode};
use crate::envoy::{ResourceError, decode, duration, unsupported};
use crate::filters::RawPerRoute;
use crate::filters::grpc_service::xds::Target;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExtProcPerRoute";

/// The filter, with the processor's address or the cluster that has it.
#[derive(Debug, Clone)]
pub(crate) struct XdsExtProc {
    raw: RawExtProc,
    target: Target,
}

impl XdsExtProc {
    pub(crate) fn decode(any: &Any, at: &str) -> Result<Self, ResourceError> {
        let mut filter: ExternalProcessor = decode(any, TYPE_URL, "an ExternalProcessor")?;
        if filter.http_service.take().is_some() {
            return Err(unsupported(at, "http_service (a gRPC processor only)"));
        }
        let service = filter
            .grpc_service
            .take()
            .ok_or_else(|| ResourceError::invalid(at, "expected a grpc_service"))?;
        // The stream has no deadline of its own in Envoy's filter: each message has
        // `message_timeout`.
        let (target, _) = Target::of(service, &format!("{at}.grpc_service"))?;
        let processing_mode = filter
            .processing_mode
            .take()
            .map(|m| mode(m, &format!("{at}.processing_mode")))
            .transpose()?;
        let status_on_error = filter
            .status_on_error
            .take()
            .map(|s| {
                u16::try_from(s.code)
                    .ok()
                    .filter(|c| (400..=599).contains(c))
                    .ok_or_else(|| {
                        ResourceError::invalid(
                            format!("{at}.status_on_error"),
                            format!("{} is not an error status", s.code),
                        )
                    })
            })
            .transpose()?;
        let disable_clear_route_cache = match filter.route_cache_action {
            0 => filter.disable_clear_route_cache,
            2 => true,
            1 => return Err(unsupported(at, "route_cache_action CLEAR")),
            other => {
                return Err(ResourceError::invalid(
                    format!("{at}.route_cache_action"),
                    format!("unknown action {other}"),
                ));
            }
        };
        let raw = RawExtProc {
            service: None,
            processing_mode,
            failure_mode_allow: Some(filter.failure_mode_allow),
            message_timeout: duration(filter.message_timeout.take(), &format!("{at}.message_timeout"))?,
            status_on_error,
            allow_mode_override: Some(filter.allow_mode_override),
            disable_immediate_response: Some(filter.disable_immediate_response),
            disable_clear_route_cache: Some(disable_clear_route_cache),
            max_body_bytes: None,
        };
        // Without observability mode the close timeout is not read.
        let deferred_close = filter.observability_mode && filter.deferred_close_timeout.is_some();
        let rest = [
            (!filter.request_attributes.is_empty(), "request_attributes"),
            (!filter.response_attributes.is_empty(), "response_attributes"),
            (filter.mutation_rules.is_some(), "mutation_rules"),
            (filter.max_message_timeout.is_some(), "max_message_timeout"),
            (filter.forward_rules.is_some(), "forward_rules"),
            (filter.filter_metadata.is_some(), "filter_metadata"),
            (filter.metadata_options.is_some(), "metadata_options"),
            (filter.observability_mode, "observability_mode"),
            (deferred_close, "deferred_close_timeout"),
            (
                filter.send_body_without_waiting_for_header_response,
                "send_body_without_waiting_for_header_response",
            ),
            (!filter.allowed_override_modes.is_empty(), "allowed_override_modes"),
            (filter.processing_request_modifier.is_some(), "processing_request_modifier"),
            (filter.on_processing_response.is_some(), "on_processing_response"),
            (filter.allow_content_length_header, "allow_content_length_header"),
            (filter.emit_client_span.is_some_and(|b| b.value), "emit_client_span"),
        ];
        let named: Vec<String> = rest
            .iter()
            .filter(|(set, _)| *set)
            .map(|(_, n)| (*n).to_owned())
            .collect();
        if !named.is_empty() {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: named,
            });
        }
        Ok(Self { raw, target })
    }

    /// The cluster the processor's address comes from, if it is named by one.
    pub(crate) fn cluster(&self) -> Option<&str> {
        self.target.cluster()
    }

    /// The filter's section, with the address of its cluster's one host; `None` while that
    /// cluster is not known.
    pub(crate) fn section(
        &self,
        clusters: &dyn crate::cluster::xds::ReadyClusters,
    ) -> Option<RawExtProc> {
        let mut raw = self.raw.clone();
        raw.service = Some(self.target.service(clusters)?);
        Some(raw)
    }
}

/// A processing mode: Envoy's `DEFAULT`s are its defaults; full-duplex bodies and trailers
/// are refused.
fn mode(mode: ProcessingMode, at: &str) -> Result<RawProcessingMode, ResourceError> {
    let header = |value: i32, name: &str| match HeaderSendMode::try_from(value) {
        Ok(HeaderSendMode::Default) => Ok(None),
        Ok(HeaderSendMode::Send) => Ok(Some(HeaderMode::Send)),
        Ok(HeaderSendMode::Skip) => Ok(Some(HeaderMode::Skip)),
        Err(_) => Err(ResourceError::invalid(
            format!("{at}.{name}"),
            format!("unknown mode {value}"),
        )),
    };
    let body = |value: i32, name: &str| match BodySendMode::try_from(value) {
        Ok(BodySendMode::None) => Ok(Some(BodyMode::None)),
        Ok(BodySendMode::Buffered) => Ok(Some(BodyMode::Buffered)),
        Ok(BodySendMode::BufferedPartial) => Ok(Some(BodyMode::BufferedPartial)),
        Ok(BodySendMode::Streamed) => Ok(Some(BodyMode::Streamed)),
        Ok(other) => Err(unsupported(at, format!("{name} {}", other.as_str_name()))),
        Err(_) => Err(ResourceError::invalid(
            format!("{at}.{name}"),
            format!("unknown mode {value}"),
        )),
    };
    // Trailers are skipped unless sent: SEND is refused.
    for (value, name) in [
        (mode.request_trailer_mode, "request_trailer_mode"),
        (mode.response_trailer_mode, "response_trailer_mode"),
    ] {
        if header(value, name)? == Some(HeaderMode::Send) {
            return Err(unsupported(at, format!("{name} SEND")));
        }
    }
    Ok(RawProcessingMode {
        request_headers: header(mode.request_header_mode, "request_header_mode")?,
        response_headers: header(mode.response_header_mode, "response_header_mode")?,
        request_body: body(mode.request_body_mode, "request_body_mode")?,
        response_body: body(mode.response_body_mode, "response_body_mode")?,
    })
}

/// A route's or virtual host's `ExtProcPerRoute`: off, or its processing and failure modes.
#[allow(deprecated)] // `async_mode`: deprecated, but it would change the exchange if set
pub(crate) fn per_route(any: &Any, at: &str) -> Result<RawPerRoute<RawExtProcRoute>, ResourceError> {
    let ExtProcPerRoute { r#override } = decode(any, PER_ROUTE, "an ExtProcPerRoute")?;
    let mut overrides = match r#override {
        Some(ext_proc_per_route::Override::Disabled(true)) => {
            return Ok(RawPerRoute::Word("disabled".into()));
        }
        Some(ext_proc_per_route::Override::Overrides(overrides)) => overrides,
        Some(ext_proc_per_route::Override::Disabled(false)) | None => {
            return Err(ResourceError::invalid(at, "expected `disabled: true` or overrides"));
        }
    };
    let processing_mode = overrides
        .processing_mode
        .take()
        .map(|m| mode(m, &format!("{at}.overrides.processing_mode")))
        .transpose()?;
    let failure_mode_allow = overrides.failure_mode_allow.take().map(|b| b.value);
    let rest = [
        (overrides.async_mode, "async_mode"),
        (!overrides.request_attributes.is_empty(), "request_attributes"),
        (!overrides.response_attributes.is_empty(), "response_attributes"),
        (overrides.grpc_service.is_some(), "grpc_service"),
        (overrides.metadata_options.is_some(), "metadata_options"),
        (!overrides.grpc_initial_metadata.is_empty(), "grpc_initial_metadata"),
        (overrides.processing_request_modifier.is_some(), "processing_request_modifier"),
        (overrides.emit_client_span.is_some_and(|b| b.value), "emit_client_span"),
    ];
    let named: Vec<String> = rest
        .iter()
        .filter(|(set, _)| *set)
        .map(|(_, n)| (*n).to_owned())
        .collect();
    if !named.is_empty() {
        return Err(ResourceError::Unsupported {
            at: format!("{at}.overrides"),
            fields: named,
        });
    }
    Ok(RawPerRoute::Settings(RawExtProcRoute {
        processing_mode,
        failure_mode_allow,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use envoy_types::pb::envoy::config::core::v3::{GrpcService, grpc_service};
    use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ExtProcOverrides;
    use envoy_types::pb::google::protobuf::BoolValue;
    use prost::{Message, Name};

    use super::*;

    fn pack<M: Message + Name>(message: &M) -> Any {
        Any {
            type_url: M::type_url(),
            value: message.encode_to_vec(),
        }
    }

    fn service(cluster: &str) -> Option<GrpcService> {
        Some(GrpcService {
            target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
                cluster_name: cluster.into(),
                authority: "processor.default:9000".into(),
                ..Default::default()
            })),
            timeout: Some(envoy_types::pb::google::protobuf::Duration { seconds: 10, nanos: 0 }),
            ..Default::default()
        })
    }

    #[test]
    fn envoy_gateways_filter_is_taken_and_what_is_not_done_is_named() {
        let filter = ExternalProcessor {
            grpc_service: service("processor_cluster"),
            failure_mode_allow: true,
            message_timeout: Some(envoy_types::pb::google::protobuf::Duration { seconds: 5, nanos: 0 }),
            processing_mode: Some(ProcessingMode {
                request_header_mode: HeaderSendMode::Skip as i32,
                request_body_mode: BodySendMode::BufferedPartial as i32,
                request_trailer_mode: HeaderSendMode::Skip as i32,
                response_header_mode: HeaderSendMode::Send as i32,
                response_trailer_mode: HeaderSendMode::Skip as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        let decoded = XdsExtProc::decode(&pack(&filter), "f").unwrap();
        assert_eq!(decoded.cluster(), Some("processor_cluster"));
        assert_eq!(decoded.raw.failure_mode_allow, Some(true));
        assert_eq!(decoded.raw.message_timeout, Some(std::time::Duration::from_secs(5)));
        let mode = decoded.raw.processing_mode.unwrap().checked();
        assert_eq!(mode.request_headers, HeaderMode::Skip);
        assert_eq!(mode.request_body, BodyMode::BufferedPartial);
        assert_eq!(mode.response_headers, HeaderMode::Send);
        assert_eq!(mode.response_body, BodyMode::None);
        let streamed = ProcessingMode {
            response_body_mode: BodySendMode::Streamed as i32,
            ..Default::default()
        };
        let decoded = XdsExtProc::decode(&pack(&ExternalProcessor { processing_mode: Some(streamed), grpc_service: service("c"), ..Default::default() }), "f").unwrap();
        assert_eq!(decoded.raw.processing_mode.unwrap().checked().response_body, BodyMode::Streamed);
        let duplex = ProcessingMode {
            response_body_mode: BodySendMode::FullDuplexStreamed as i32,
            ..Default::default()
        };
        let trailers = ProcessingMode {
            request_trailer_mode: HeaderSendMode::Send as i32,
            ..Default::default()
        };
        for (filter, name) in [
            (ExternalProcessor { processing_mode: Some(duplex), ..Default::default() }, "response_body_mode FULL_DUPLEX_STREAMED"),
            (ExternalProcessor { processing_mode: Some(trailers), ..Default::default() }, "request_trailer_mode SEND"),
            (ExternalProcessor { observability_mode: true, ..Default::default() }, "observability_mode"),
            (ExternalProcessor { request_attributes: vec!["request.path".into()], ..Default::default() }, "request_attributes"),
            (ExternalProcessor { route_cache_action: 1, ..Default::default() }, "route_cache_action CLEAR"),
        ] {
            let filter = ExternalProcessor { grpc_service: service("c"), ..filter };
            let err = XdsExtProc::decode(&pack(&filter), "f").unwrap_err().to_string();
            assert!(err.contains(name), "{name}: {err}");
        }
    }

    #[test]
    fn a_route_turns_the_filter_off_or_overrides_its_modes() {
        let off = ExtProcPerRoute {
            r#override: Some(ext_proc_per_route::Override::Disabled(true)),
        };
        assert!(matches!(per_route(&pack(&off), "r").unwrap(), RawPerRoute::Word(w) if w == "disabled"));
        let overrides = ExtProcPerRoute {
            r#override: Some(ext_proc_per_route::Override::Overrides(ExtProcOverrides {
                processing_mode: Some(ProcessingMode {
                    response_header_mode: HeaderSendMode::Skip as i32,
                    ..Default::default()
                }),
                failure_mode_allow: Some(BoolValue { value: true }),
                ..Default::default()
            })),
        };
        let RawPerRoute::Settings(route) = per_route(&pack(&overrides), "r").unwrap() else {
            panic!("settings");
        };
        assert_eq!(route.failure_mode_allow, Some(true));
        assert_eq!(route.processing_mode.unwrap().response_headers, Some(HeaderMode::Skip));
        let with_service = ExtProcPerRoute {
            r#override: Some(ext_proc_per_route::Override::Overrides(ExtProcOverrides {
                grpc_service: service("other"),
                ..Default::default()
            })),
        };
        let err = per_route(&pack(&with_service), "r").unwrap_err().to_string();
        assert!(err.contains("grpc_service"), "{err}");
    }
}
