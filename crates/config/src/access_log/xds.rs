//! Envoy's access logs as a listener's `access_log`: the connection manager's file logger
//! (text or flat JSON, Envoy's default line when it gives none), and the listener's own logs
//! where they can never write.

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
use envoy_types::pb::google::protobuf::{Struct, value};

use crate::RawAccessLog;
use crate::envoy::{ResourceError, decode};

const FILE_LOG: &str = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog";

/// Envoy's line when a file logger gives no format, in the operators it uses.
pub const ENVOY_DEFAULT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"\n";

/// The connection manager's `access_log`: at most one file logger, without a filter.
pub(crate) fn connection_manager_log(
    logs: Vec<AccessLog>,
    at: &str,
) -> Result<Option<RawAccessLog>, ResourceError> {
    let mut found = None;
    for (i, log) in logs.into_iter().enumerate() {
        let at = format!("{at}.access_log[{i}]");
        if found.is_some() {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec!["a second access log (one per listener)".into()],
            });
        }
        if log.filter.is_some() {
            return Err(ResourceError::Unsupported {
                at: format!("{at}.filter"),
                fields: vec!["access log filters on the connection manager's log".into()],
            });
        }
        let any = match log.config_type {
            Some(access_log::ConfigType::TypedConfig(any)) if any.type_url == FILE_LOG => any,
            _ => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!("access logger `{}` (file only)", log.name)],
                });
            }
        };
        let file: FileAccessLog = decode(&any, FILE_LOG, "a FileAccessLog")?;
        found = Some(file_log(file, &at)?);
    }
    Ok(found)
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
        path,
        format,
        json_format,
    })
}

fn substitution_format(
    mut format: SubstitutionFormatString,
    at: &str,
) -> Result<(Option<String>, Option<serde_yaml::Mapping>), ResourceError> {
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
    let mut refused = Vec::new();
    if format.omit_empty_values {
        refused.push("omit_empty_values".to_owned());
    }
    if !format.formatters.is_empty() {
        refused.push("formatters".to_owned());
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
    Ok((text, None))
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
    for (i, log) in logs.iter().enumerate() {
        let only_no_route = |f: &AccessLogFilter| match &f.filter_specifier {
            Some(access_log_filter::FilterSpecifier::ResponseFlagFilter(flags)) => {
                !flags.flags.is_empty() && flags.flags.iter().all(|f| f == "NR")
            }
            _ => false,
        };
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
