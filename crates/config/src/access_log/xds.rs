//! Envoy's access logs as a listener's `access_log`: the connection manager's or TCP relay's loggers (files,
//! text or flat JSON, Envoy's default line when it gives none; OpenTelemetry collectors, a
//! cluster's single host), and the listener's own logs where they can never write.

// Control planes still send the deprecated format fields; they are read, not ignored.
#![allow(deprecated)]

use envoy_types::pb::envoy::config::accesslog::v3::{
    AccessLog, AccessLogFilter, access_log, access_log_filter,
};
use envoy_types::pb::envoy::config::core::v3::{
    SubstitutionFormatString, data_source, substitution_format_string,
};
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::{
    FileAccessLog, file_access_log,
};
use envoy_types::pb::envoy::extensions::access_loggers::open_telemetry::v3::OpenTelemetryAccessLogConfig;
use envoy_types::pb::google::protobuf::{Struct, value};
use opentelemetry_kinds::{any_text, key_values};

use envoy_types::pb::envoy::extensions::access_loggers::filters::cel::v3::ExpressionFilter;

use super::filter::{RawComparison, RawLogFilter};
use super::{RawAccessLog, RawOtlpLog};
use crate::envoy::{ResourceError, decode, nothing_else};

const FILE_LOG: &str = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog";
const OTEL_LOG: &str = "type.googleapis.com/envoy.extensions.access_loggers.open_telemetry.v3.OpenTelemetryAccessLogConfig";

/// Field numbers of `OpenTelemetryAccessLogConfig`, to name what is refused.
const OTEL_FIELDS: &[(u32, &str)] = &[
    (1, "common_config"),
    (2, "body"),
    (3, "attributes"),
    (4, "resource_attributes"),
    (5, "disable_builtin_labels"),
    (6, "stat_prefix"),
    (7, "formatters"),
    (8, "http_service"),
    (9, "grpc_service"),
    (10, "log_name"),
    (11, "buffer_flush_interval"),
    (12, "buffer_size_bytes"),
    (13, "filter_state_objects_to_log"),
    (14, "custom_tags"),
    (15, "resource_detectors"),
];

/// Envoy's line when a file logger gives no format, in the operators it uses.
pub const ENVOY_DEFAULT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"\n";

/// One of a connection manager's loggers.
#[derive(Debug, Clone)]
pub(crate) enum XdsAccessLog {
    Settled(RawAccessLog),
    /// An OpenTelemetry logger: its collector is the cluster's single host.
    Collector {
        cluster: String,
        log: RawAccessLog,
    },
}

impl XdsAccessLog {
    /// The cluster its collector is found in, if any.
    pub(crate) fn cluster(&self) -> Option<&str> {
        match self {
            XdsAccessLog::Settled(_) => None,
            XdsAccessLog::Collector { cluster, .. } => Some(cluster),
        }
    }

    /// As the config file writes it; `None` while its collector's cluster has no single host.
    pub(crate) fn section(
        &self,
        clusters: &dyn crate::cluster::xds::ReadyClusters,
    ) -> Option<RawAccessLog> {
        match self {
            XdsAccessLog::Settled(log) => Some(log.clone()),
            XdsAccessLog::Collector { cluster, log } => {
                let host = clusters.single_host(cluster.as_str())?;
                let mut log = log.clone();
                if let Some(otlp) = &mut log.otlp {
                    // Over TLS when the cluster speaks it.
                    let scheme = if host.tls.is_some() { "https" } else { "http" };
                    otlp.endpoint = format!("{scheme}://{}", host.address);
                    otlp.tls = host.tls.cloned();
                }
                Some(log)
            }
        }
    }
}

/// The connection manager's or TCP relay's `access_log`: file and OpenTelemetry loggers,
/// with the filters [`log_filter`] maps.
pub(crate) fn connection_manager_logs(
    logs: Vec<AccessLog>,
    at: &str,
) -> Result<Vec<XdsAccessLog>, ResourceError> {
    let mut found = Vec::with_capacity(logs.len());
    for (i, mut log) in logs.into_iter().enumerate() {
        let at = format!("{at}.access_log[{i}]");
        let filter = log
            .filter
            .take()
            .map(|f| log_filter(f, &format!("{at}.filter")))
            .transpose()?;
        let any = match log.config_type {
            Some(access_log::ConfigType::TypedConfig(any))
                if any.type_url == FILE_LOG || any.type_url == OTEL_LOG =>
            {
                any
            }
            _ => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!(
                        "access logger `{}` (file and open_telemetry only)",
                        log.name
                    )],
                });
            }
        };
        let mut logger = if any.type_url == FILE_LOG {
            let file: FileAccessLog = decode(&any, FILE_LOG, "a FileAccessLog")?;
            XdsAccessLog::Settled(file_log(file, &at)?)
        } else {
            let otel: OpenTelemetryAccessLogConfig =
                decode(&any, OTEL_LOG, "an OpenTelemetryAccessLogConfig")?;
            otel_log(otel, &at)?
        };
        match &mut logger {
            XdsAccessLog::Settled(log) | XdsAccessLog::Collector { log, .. } => log.filter = filter,
        }
        found.push(logger);
    }
    Ok(found)
}

const CEL_FILTER: &str =
    "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter";

/// A logger's `filter`: status code, duration, response flags, a request header, a CEL
/// expression (the part `crate::cel` evaluates), and `and`/`or` of those. Runtime keys name
/// overrides of a runtime this proxy does not have: their default values stand, as in an
/// Envoy whose runtime does not set them.
pub(crate) fn log_filter(filter: AccessLogFilter, at: &str) -> Result<RawLogFilter, ResourceError> {
    use access_log_filter::FilterSpecifier as F;
    use envoy_types::pb::envoy::config::accesslog::v3::comparison_filter::Op;
    use envoy_types::pb::envoy::config::accesslog::v3::{ComparisonFilter, extension_filter};
    let comparison =
        |c: Option<ComparisonFilter>, at: &str| -> Result<RawComparison, ResourceError> {
            let c = c.ok_or_else(|| ResourceError::invalid(at, "expected a comparison"))?;
            let value = c.value.map_or(0, |v| v.default_value).into();
            let mut raw = RawComparison::default();
            match Op::try_from(c.op) {
                Ok(Op::Eq) => raw.eq = Some(value),
                Ok(Op::Ne) => raw.ne = Some(value),
                Ok(Op::Ge) => raw.ge = Some(value),
                Ok(Op::Le) => raw.le = Some(value),
                Err(_) => return Err(ResourceError::invalid(at, "an unknown comparison")),
            }
            Ok(raw)
        };
    let list = |filters: Vec<AccessLogFilter>, key: &str| {
        (filters.into_iter().enumerate())
            .map(|(i, f)| log_filter(f, &format!("{at}.{key}.filters[{i}]")))
            .collect::<Result<Vec<_>, _>>()
    };
    let refused = |what: &str| ResourceError::Unsupported {
        at: at.to_owned(),
        fields: vec![format!(
            "{what} (status_code, duration, header, response_flag, and, or and CEL filters only)"
        )],
    };
    Ok(match filter.filter_specifier {
        Some(F::StatusCodeFilter(f)) => RawLogFilter {
            status_code: Some(comparison(
                f.comparison,
                &format!("{at}.status_code_filter"),
            )?),
            ..Default::default()
        },
        Some(F::DurationFilter(f)) => RawLogFilter {
            duration: Some(comparison(f.comparison, &format!("{at}.duration_filter"))?),
            ..Default::default()
        },
        Some(F::ResponseFlagFilter(f)) => RawLogFilter {
            response_flags: Some(f.flags),
            ..Default::default()
        },
        Some(F::HeaderFilter(f)) => {
            let header = f
                .header
                .ok_or_else(|| ResourceError::invalid(at, "a header_filter without a header"))?;
            RawLogFilter {
                header: Some(crate::envoy::matchers::header(
                    header,
                    &format!("{at}.header_filter.header"),
                )?),
                ..Default::default()
            }
        }
        Some(F::AndFilter(f)) => RawLogFilter {
            and: Some(list(f.filters, "and_filter")?),
            ..Default::default()
        },
        Some(F::OrFilter(f)) => RawLogFilter {
            or: Some(list(f.filters, "or_filter")?),
            ..Default::default()
        },
        Some(F::ExtensionFilter(f)) => match f.config_type {
            Some(extension_filter::ConfigType::TypedConfig(any)) if any.type_url == CEL_FILTER => {
                let mut cel: ExpressionFilter = decode(&any, CEL_FILTER, "an ExpressionFilter")?;
                if cel.cel_config.take().is_some() {
                    return Err(refused("a CEL filter's cel_config"));
                }
                // Checked now, so that an expression outside what is evaluated here is
                // refused with the resource's name.
                if let Err(e) = crate::cel::Expr::parse(&cel.expression) {
                    return Err(refused(&format!(
                        "the CEL expression `{}`: {e}",
                        cel.expression
                    )));
                }
                RawLogFilter {
                    expression: Some(cel.expression),
                    ..Default::default()
                }
            }
            _ => return Err(refused(&format!("the extension filter `{}`", f.name))),
        },
        Some(F::NotHealthCheckFilter(_)) => return Err(refused("not_health_check_filter")),
        Some(F::TraceableFilter(_)) => return Err(refused("traceable_filter")),
        Some(F::RuntimeFilter(_)) => return Err(refused("runtime_filter")),
        Some(F::GrpcStatusFilter(_)) => return Err(refused("grpc_status_filter")),
        Some(F::MetadataFilter(_)) => return Err(refused("metadata_filter")),
        Some(F::LogTypeFilter(_)) => return Err(refused("log_type_filter")),
        None => return Err(ResourceError::invalid(at, "a filter that says nothing")),
    })
}

/// An OpenTelemetry logger: its body and attributes (format strings), its resource
/// attributes (`log_name` first, as Envoy's built-in label) and its collector.
fn otel_log(
    mut otel: OpenTelemetryAccessLogConfig,
    at: &str,
) -> Result<XdsAccessLog, ResourceError> {
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.to_owned(),
        fields: vec![what.to_owned()],
    };
    // The collector: the new top-level `grpc_service`, or the common config's.
    let mut common = otel.common_config.take().unwrap_or_default();
    let service = match (otel.grpc_service.take(), common.grpc_service.take()) {
        (Some(service), _) => service,
        (None, Some(service)) => service,
        (None, None) => return Err(unsupported("http_service (a gRPC collector only)")),
    };
    let target = crate::envoy::grpc_service::grpc_target(service, &format!("{at}.grpc_service"))?;
    let log_name = [
        std::mem::take(&mut otel.log_name),
        std::mem::take(&mut common.log_name),
    ]
    .into_iter()
    .find(|n| !n.is_empty());
    // V3 is the only version there is; batching settings are the proxy's own.
    common.transport_api_version = 0;
    if common != Default::default() {
        return Err(unsupported(
            "common_config besides log_name, grpc_service and transport_api_version",
        ));
    }
    let format = match otel.body.take() {
        None => String::new(),
        Some(body) => {
            any_text(body).ok_or_else(|| unsupported("body other than a string_value"))?
        }
    };
    let attributes = key_values(otel.attributes.take())
        .ok_or_else(|| unsupported("attributes other than string values"))?;
    let resource = key_values(otel.resource_attributes.take())
        .ok_or_else(|| unsupported("resource_attributes other than string values"))?;
    // The built-in labels Envoy adds unless told not to: `log_name` (zone, cluster and node
    // names are the node's, which a collector gets from the resource attributes here).
    let log_name = if std::mem::take(&mut otel.disable_builtin_labels) {
        None
    } else {
        log_name
    };
    formatters(&std::mem::take(&mut otel.formatters), at)?;
    nothing_else(&otel, OTEL_FIELDS, at)?;
    let mapping = |pairs: Vec<(String, String)>| {
        let mut map = serde_yaml::Mapping::new();
        for (key, value) in pairs {
            map.insert(key.into(), value.into());
        }
        map
    };
    Ok(XdsAccessLog::Collector {
        cluster: target.cluster,
        log: RawAccessLog {
            path: None,
            otlp: Some(RawOtlpLog {
                // Filled in once the cluster has a single host.
                endpoint: String::new(),
                authority: target.authority,
                headers: target.headers,
                log_name,
                resource_attributes: (!resource.is_empty()).then(|| mapping(resource)),
                timeout: target.timeout,
                tls: None,
            }),
            format: Some(format),
            json_format: None,
            attributes: (!attributes.is_empty()).then(|| mapping(attributes)),
            filter: None,
        },
    })
}

/// OpenTelemetry's `AnyValue` and `KeyValueList` as text.
mod opentelemetry_kinds {
    use envoy_types::pb::opentelemetry::proto::common::v1::{AnyValue, KeyValueList, any_value};

    /// A `string_value`; `None` for any other kind.
    pub(super) fn any_text(value: AnyValue) -> Option<String> {
        match value.value {
            Some(any_value::Value::StringValue(text)) => Some(text),
            None => Some(String::new()),
            _ => None,
        }
    }

    /// Keys and their string values, in order; `None` if a value is of another kind.
    pub(super) fn key_values(list: Option<KeyValueList>) -> Option<Vec<(String, String)>> {
        list.unwrap_or_default()
            .values
            .into_iter()
            .map(|kv| Some((kv.key, any_text(kv.value.unwrap_or_default())?)))
            .collect()
    }
}

fn file_log(file: FileAccessLog, at: &str) -> Result<RawAccessLog, ResourceError> {
    let path = match file.path.as_str() {
        "/dev/stdout" => "stdout".to_owned(),
        "" => {
            return Err(ResourceError::invalid(
                format!("{at}.path"),
                "expected a path",
            ));
        }
        path => path.to_owned(),
    };
    let (format, json_format) = match file.access_log_format {
        None => (Some(ENVOY_DEFAULT_FORMAT.to_owned()), None),
        Some(file_access_log::AccessLogFormat::Format(text)) => (Some(text), None),
        Some(file_access_log::AccessLogFormat::JsonFormat(json)) => {
            (None, Some(json_keys(json, &format!("{at}.json_format"))?))
        }
        Some(file_access_log::AccessLogFormat::TypedJsonFormat(_)) => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec!["typed_json_format".into()],
            });
        }
        Some(file_access_log::AccessLogFormat::LogFormat(format)) => {
            substitution_format(format, &format!("{at}.log_format"))?
        }
    };
    Ok(RawAccessLog {
        path: Some(path),
        format,
        json_format,
        ..RawAccessLog::default()
    })
}

fn substitution_format(
    mut format: SubstitutionFormatString,
    at: &str,
) -> Result<(Option<String>, Option<serde_yaml::Mapping>), ResourceError> {
    formatters(&std::mem::take(&mut format.formatters), at)?;
    // Checked for text and JSON formats alike.
    let mut refused = Vec::new();
    if format.omit_empty_values {
        refused.push("omit_empty_values".to_owned());
    }
    if !format.content_type.is_empty() {
        refused.push("content_type".to_owned());
    }
    if format.json_format_options.is_some() {
        refused.push("json_format_options".to_owned());
    }
    if !refused.is_empty() {
        return Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: refused,
        });
    }
    let text = match format.format.take() {
        Some(substitution_format_string::Format::TextFormat(text)) => Some(text),
        Some(substitution_format_string::Format::TextFormatSource(source)) => {
            match source.specifier {
                Some(data_source::Specifier::InlineString(text)) => Some(text),
                Some(data_source::Specifier::InlineBytes(bytes)) => {
                    Some(String::from_utf8(bytes).map_err(|_| {
                        ResourceError::invalid(format!("{at}.text_format_source"), "not UTF-8")
                    })?)
                }
                _ => {
                    return Err(ResourceError::Unsupported {
                        at: format!("{at}.text_format_source"),
                        fields: vec!["filename / environment_variable (inline only)".into()],
                    });
                }
            }
        }
        Some(substitution_format_string::Format::JsonFormat(json)) => {
            return Ok((None, Some(json_keys(json, &format!("{at}.json_format"))?)));
        }
        None => Some(ENVOY_DEFAULT_FORMAT.to_owned()),
    };
    Ok((text, None))
}

/// A format's `formatters`: `req_without_query` is taken (`%REQ_WITHOUT_QUERY(...)%` is
/// always understood here); the others add commands Legate does not have.
fn formatters(
    formatters: &[envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig],
    at: &str,
) -> Result<(), ResourceError> {
    const REQ_WITHOUT_QUERY: &str =
        "type.googleapis.com/envoy.extensions.formatter.req_without_query.v3.ReqWithoutQuery";
    let refused: Vec<String> = formatters
        .iter()
        .filter(|f| f.typed_config.as_ref().map(|c| c.type_url.as_str()) != Some(REQ_WITHOUT_QUERY))
        .map(|f| format!("formatters (`{}`: req_without_query only)", f.name))
        .collect();
    if refused.is_empty() {
        return Ok(());
    }
    Err(ResourceError::Unsupported {
        at: at.to_owned(),
        fields: refused,
    })
}

/// A flat JSON format: keys whose values are format strings, in key order.
fn json_keys(json: Struct, at: &str) -> Result<serde_yaml::Mapping, ResourceError> {
    let mut keys: Vec<_> = json.fields.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = serde_yaml::Mapping::new();
    for (key, value) in keys {
        match value.kind {
            Some(value::Kind::StringValue(text)) => {
                out.insert(key.into(), text.into());
            }
            _ => {
                return Err(ResourceError::Unsupported {
                    at: format!("{at}.{key}"),
                    fields: vec!["a value other than a format string (nested or constant)".into()],
                });
            }
        }
    }
    Ok(out)
}

/// A listener's own `access_log` (connections that no filter chain takes): accepted when
/// every entry logs only `NR` connections, as control planes write it. With the one chain
/// a listener has here, matching every connection, such an entry never writes.
pub(crate) fn listener_logs(logs: &[AccessLog], at: &str) -> Result<(), ResourceError> {
    /// Whether a filter lets only `NR` entries through: the flag filter itself, or an `and`
    /// with it among its terms (the others can only narrow it).
    fn only_no_route(f: &AccessLogFilter) -> bool {
        match &f.filter_specifier {
            Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(flags)) => {
                !flags.flags.is_empty() && flags.flags.iter().all(|f| f == "NR")
            }
            Some(access_log_filter::FilterSpecifier::AndFilter(and)) => {
                and.filters.iter().any(only_no_route)
            }
            _ => false,
        }
    }
    for (i, log) in logs.iter().enumerate() {
        if !log.filter.as_ref().is_some_and(only_no_route) {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.access_log[{i}]"),
                fields: vec![
                    "a listener access log for other connections than those no chain takes (filter: response_flag_filter NR)"
                        .into(),
                ],
            });
        }
    }
    Ok(())
}
