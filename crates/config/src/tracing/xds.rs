//! A connection manager's `tracing` as the listener's `tracing`, and its OpenTelemetry
//! provider as the process's collector: the provider's cluster, once it has a single host,
//! is the OTLP/gRPC endpoint; without a provider, the file's `tracing` is the collector (as
//! Envoy falls back to the bootstrap's). Without `tracing`, the listener is not traced.

use std::collections::BTreeMap;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::trace::v3::OpenTelemetryConfig;
use envoy_types::pb::envoy::extensions::tracers::opentelemetry::samplers::v3::{
    AlwaysOnSamplerConfig, ParentBasedSamplerConfig, TraceIdRatioBasedSamplerConfig,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use envoy_types::pb::envoy::r#type::tracing::v3::{CustomTag, custom_tag};
use envoy_types::pb::envoy::r#type::v3::Percent;

use super::{
    RawCustomTag, RawListenerTracing, RawOtlp, RawRouteTracing, RawTagSource, RawTracing, Sampler,
};
use crate::envoy::{ResourceError, decode, nothing_else};

const OPEN_TELEMETRY: &str = "type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig";
const ALWAYS_ON: &str =
    "type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3.AlwaysOnSamplerConfig";
const PARENT_BASED: &str = "type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3.ParentBasedSamplerConfig";
const TRACE_ID_RATIO: &str = "type.googleapis.com/envoy.extensions.tracers.opentelemetry.samplers.v3.TraceIdRatioBasedSamplerConfig";

/// Field numbers of the messages read here, to name what is refused.
const TRACING: &[(u32, &str)] = &[
    (3, "client_sampling"),
    (4, "random_sampling"),
    (5, "overall_sampling"),
    (6, "verbose"),
    (7, "max_path_tag_length"),
    (8, "custom_tags"),
    (9, "provider"),
    (10, "spawn_upstream_span"),
    (11, "operation"),
    (12, "upstream_operation"),
    (13, "no_context_propagation"),
];

const OPEN_TELEMETRY_FIELDS: &[(u32, &str)] = &[
    (1, "grpc_service"),
    (2, "service_name"),
    (3, "http_service"),
    (4, "resource_detectors"),
    (5, "sampler"),
    (6, "max_cache_size"),
    (7, "set_telemetry_sdk_resource_attributes"),
    (8, "set_service_name_resource_attribute"),
    (9, "set_instrumentation_scope"),
    (10, "exporter"),
];

/// The collector a listener names: its cluster's single host, called by `authority`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct XdsCollector {
    pub(crate) cluster: String,
    authority: Option<String>,
    headers: BTreeMap<String, String>,
    service_name: Option<String>,
    resource_attributes: BTreeMap<String, String>,
    timeout: Option<Duration>,
}

impl XdsCollector {
    /// The process's `tracing` for it; `None` while its cluster has no single host.
    pub(crate) fn section(
        &self,
        clusters: &dyn crate::cluster::xds::ReadyClusters,
    ) -> Option<RawTracing> {
        let host = clusters.single_host(self.cluster.as_str())?;
        // Over TLS when the cluster speaks it.
        let scheme = if host.tls.is_some() { "https" } else { "http" };
        Some(RawTracing {
            otlp: RawOtlp {
                endpoint: format!("{scheme}://{}", host.address),
                protocol: Some("grpc".into()),
                authority: self.authority.clone(),
                headers: self.headers.clone(),
                timeout: self.timeout,
                tls: host.tls.cloned(),
            },
            service_name: self.service_name.clone(),
            resource_attributes: self.resource_attributes.clone(),
            // Sampling is the listeners' to say; a collector from a management server
            // brings nothing else.
            random_sampling: None,
            force_trace_header: None,
            max_queued_spans: None,
            max_export_batch: None,
        })
    }
}

/// The listener's tracing and the collector it names; `None` (no tracing): not traced.
pub(crate) fn tracing(
    value: Option<Tracing>,
    at: &str,
) -> Result<(RawListenerTracing, Option<XdsCollector>), ResourceError> {
    let Some(mut t) = value else {
        return Ok((
            RawListenerTracing {
                enabled: Some(false),
                ..Default::default()
            },
            None,
        ));
    };
    let at = format!("{at}.tracing");
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.clone(),
        fields: vec![what.to_owned()],
    };
    // Envoy's three shares default to 100%.
    let percent = |p: Option<Percent>| p.map_or(100.0, |p| p.value);
    let listener = RawListenerTracing {
        enabled: Some(true),
        random_sampling: Some(percent(t.random_sampling.take())),
        client_sampling: Some(percent(t.client_sampling.take())),
        overall_sampling: Some(percent(t.overall_sampling.take())),
        custom_tags: custom_tags(std::mem::take(&mut t.custom_tags), &at)?,
        operation: Some(std::mem::take(&mut t.operation)).filter(|o| !o.is_empty()),
        upstream_operation: Some(std::mem::take(&mut t.upstream_operation))
            .filter(|o| !o.is_empty()),
        sampler: None,
    };
    // Spans for each upstream try are made here always: `false` would ask for none.
    if t.spawn_upstream_span.take().is_some_and(|b| !b.value) {
        return Err(unsupported("spawn_upstream_span: false"));
    }
    // Without a provider, Envoy traces with the bootstrap's: here, the file's `tracing`.
    let Some(provider) = t.provider.take() else {
        nothing_else(&t, TRACING, &at)?;
        return Ok((listener, None));
    };
    let Some(envoy_types::pb::envoy::config::trace::v3::tracing::http::ConfigType::TypedConfig(
        any,
    )) = provider.config_type
    else {
        return Err(unsupported("provider without settings"));
    };
    if any.type_url != OPEN_TELEMETRY {
        return Err(unsupported(&format!(
            "provider `{}` (envoy.tracers.opentelemetry only)",
            provider.name
        )));
    }
    let mut otel: OpenTelemetryConfig = decode(&any, OPEN_TELEMETRY, "an OpenTelemetryConfig")?;
    let mut listener = listener;
    listener.sampler = otel
        .sampler
        .take()
        .map(|s| sampler(s, &format!("{at}.provider.sampler")))
        .transpose()?;
    let collector = collector(otel, &at)?;
    nothing_else(&t, TRACING, &at)?;
    Ok((listener, Some(collector)))
}

/// Custom tags Envoy's way: literal, request header or environment variable.
fn custom_tags(tags: Vec<CustomTag>, at: &str) -> Result<Vec<RawCustomTag>, ResourceError> {
    tags.into_iter()
        .map(|tag| {
            let mut raw = RawCustomTag {
                tag: tag.tag,
                ..Default::default()
            };
            match tag.r#type {
                Some(custom_tag::Type::Literal(l)) => raw.literal = Some(l.value),
                Some(custom_tag::Type::RequestHeader(h)) => {
                    raw.request_header = Some(source(h.name, h.default_value));
                }
                Some(custom_tag::Type::Environment(e)) => {
                    raw.environment = Some(source(e.name, e.default_value));
                }
                _ => {
                    return Err(ResourceError::Unsupported {
                        at: at.to_owned(),
                        fields: vec![
                            "custom_tags (literal, request_header and environment only)".into(),
                        ],
                    });
                }
            }
            Ok(raw)
        })
        .collect()
}

/// A route's `tracing`: its shares (100% where not given, as Envoy's), tags and span names.
pub(crate) fn route_tracing(
    mut t: envoy_types::pb::envoy::config::route::v3::Tracing,
    at: &str,
) -> Result<RawRouteTracing, ResourceError> {
    let at = format!("{at}.tracing");
    let share = |p: Option<envoy_types::pb::envoy::r#type::v3::FractionalPercent>, key: &str| {
        p.map(|p| crate::envoy::fractional_percent(&p, &format!("{at}.{key}")).map(|(p, _)| p))
            .transpose()
    };
    Ok(RawRouteTracing {
        client_sampling: share(t.client_sampling.take(), "client_sampling")?,
        random_sampling: share(t.random_sampling.take(), "random_sampling")?,
        overall_sampling: share(t.overall_sampling.take(), "overall_sampling")?,
        custom_tags: custom_tags(std::mem::take(&mut t.custom_tags), &at)?,
        operation: Some(std::mem::take(&mut t.operation)).filter(|o| !o.is_empty()),
        upstream_operation: Some(std::mem::take(&mut t.upstream_operation))
            .filter(|o| !o.is_empty()),
    })
}

/// An OpenTelemetry sampler extension: always on, trace id ratio, or parent based over one
/// of them; others (Dynatrace's, CEL) are refused by name.
fn sampler(config: TypedExtensionConfig, at: &str) -> Result<Sampler, ResourceError> {
    let Some(any) = config.typed_config else {
        return Err(ResourceError::invalid(at, "expected a typed_config"));
    };
    match any.type_url.as_str() {
        ALWAYS_ON => {
            decode::<AlwaysOnSamplerConfig>(&any, ALWAYS_ON, "an AlwaysOnSamplerConfig")?;
            Ok(Sampler::AlwaysOn)
        }
        TRACE_ID_RATIO => {
            let ratio: TraceIdRatioBasedSamplerConfig =
                decode(&any, TRACE_ID_RATIO, "a TraceIdRatioBasedSamplerConfig")?;
            let percent = match ratio.sampling_percentage {
                None => 0.0,
                Some(f) => {
                    crate::envoy::fractional_percent(&f, &format!("{at}.sampling_percentage"))?.0
                }
            };
            Ok(Sampler::TraceIdRatio(percent))
        }
        PARENT_BASED => {
            let parent: ParentBasedSamplerConfig =
                decode(&any, PARENT_BASED, "a ParentBasedSamplerConfig")?;
            let wrapped = parent
                .wrapped_sampler
                .ok_or_else(|| ResourceError::invalid(at, "expected a wrapped_sampler"))?;
            Ok(Sampler::ParentBased(Box::new(sampler(
                wrapped,
                &format!("{at}.wrapped_sampler"),
            )?)))
        }
        _ => Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec![format!(
                "sampler `{}` (always_on, trace_id_ratio_based and parent_based only)",
                config.name
            )],
        }),
    }
}

fn source(name: String, default_value: String) -> RawTagSource {
    RawTagSource {
        name,
        default_value: (!default_value.is_empty()).then_some(default_value),
    }
}

fn collector(mut otel: OpenTelemetryConfig, at: &str) -> Result<XdsCollector, ResourceError> {
    let at = format!("{at}.provider");
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.clone(),
        fields: vec![what.to_owned()],
    };
    let Some(service) = otel.grpc_service.take() else {
        return Err(unsupported("http_service (the gRPC service only)"));
    };
    let target = crate::envoy::grpc_service::grpc_target(service, &format!("{at}.grpc_service"))?;
    let service_name = Some(std::mem::take(&mut otel.service_name)).filter(|s| !s.is_empty());
    let resource_attributes = resource_detectors(
        std::mem::take(&mut otel.resource_detectors),
        &format!("{at}.resource_detectors"),
    )?;
    nothing_else(&otel, OPEN_TELEMETRY_FIELDS, &at)?;
    Ok(XdsCollector {
        cluster: target.cluster,
        authority: target.authority,
        headers: target.headers,
        service_name,
        resource_attributes,
        timeout: target.timeout,
    })
}

/// The resource attributes detectors give, later ones over earlier ones (and over the
/// service name), as Envoy merges them: `static_config`'s attributes, and `environment`'s
/// `OTEL_RESOURCE_ATTRIBUTES` (`key=value,...`) read at load. Other detectors are refused.
fn resource_detectors(
    detectors: Vec<envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig>,
    at: &str,
) -> Result<BTreeMap<String, String>, ResourceError> {
    use envoy_types::pb::envoy::extensions::tracers::opentelemetry::resource_detectors::v3::StaticConfigResourceDetectorConfig;
    const STATIC: &str = "type.googleapis.com/envoy.extensions.tracers.opentelemetry.resource_detectors.v3.StaticConfigResourceDetectorConfig";
    const ENVIRONMENT: &str = "type.googleapis.com/envoy.extensions.tracers.opentelemetry.resource_detectors.v3.EnvironmentResourceDetectorConfig";
    let mut attributes = BTreeMap::new();
    for (i, detector) in detectors.into_iter().enumerate() {
        let at = format!("{at}[{i}]");
        match detector.typed_config.as_ref().map(|a| a.type_url.as_str()) {
            Some(STATIC) => {
                let any = detector.typed_config.unwrap_or_default();
                let config: StaticConfigResourceDetectorConfig =
                    decode(&any, STATIC, "a StaticConfigResourceDetectorConfig")?;
                attributes.extend(config.attributes);
            }
            Some(ENVIRONMENT) => {
                let text = std::env::var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default();
                for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
                    let Some((key, value)) = pair.split_once('=') else {
                        return Err(ResourceError::invalid(
                            at,
                            format!("OTEL_RESOURCE_ATTRIBUTES: expected key=value, found `{pair}`"),
                        ));
                    };
                    attributes.insert(key.trim().to_owned(), value.trim().to_owned());
                }
            }
            _ => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!(
                        "resource detector `{}` (static_config and environment only)",
                        detector.name
                    )],
                });
            }
        }
    }
    Ok(attributes)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use super::*;

    #[test]
    fn without_tracing_no_trace_and_without_a_provider_the_files_collector() {
        let (listener, collector) = tracing(None, "at").unwrap();
        assert_eq!(listener.enabled, Some(false));
        assert!(collector.is_none());
        let (listener, collector) = tracing(Some(Tracing::default()), "at").unwrap();
        assert_eq!(listener.enabled, Some(true));
        // Envoy's three shares: 100% unless given.
        assert_eq!(
            (
                listener.random_sampling,
                listener.client_sampling,
                listener.overall_sampling
            ),
            (Some(100.0), Some(100.0), Some(100.0))
        );
        assert!(collector.is_none());
        let verbose = Tracing {
            verbose: true,
            ..Default::default()
        };
        let err = tracing(Some(verbose), "at").unwrap_err().to_string();
        assert!(
            err.contains("at.tracing") && err.contains("verbose"),
            "{err}"
        );
    }
}
