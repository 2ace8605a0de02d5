//! Envoy's `local_reply_config` of a connection manager: its mappers, with the access-log
//! filters the access logs take; `body_format` (formatted bodies) is refused by name.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::data_source;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::LocalReplyConfig;

use super::{RawLocalReply, RawReplyMapper};
use crate::envoy::{ResourceError, fields, nothing_else};

pub(crate) fn local_reply(
    mut config: LocalReplyConfig,
    at: &str,
) -> Result<RawLocalReply, ResourceError> {
    let mut mappers = Vec::with_capacity(config.mappers.len());
    for (i, mut mapper) in std::mem::take(&mut config.mappers).into_iter().enumerate() {
        let at = format!("{at}.mappers[{i}]");
        let filter = mapper
            .filter
            .take()
            .map(|f| crate::access_log::xds::log_filter(f, &format!("{at}.filter")))
            .transpose()?;
        let status = mapper
            .status_code
            .take()
            .map(|code| {
                u16::try_from(code.value).map_err(|_| {
                    ResourceError::invalid(
                        format!("{at}.status_code"),
                        format!("{} is not a status", code.value),
                    )
                })
            })
            .transpose()?;
        let body = match mapper.body.take().and_then(|b| b.specifier) {
            None => None,
            Some(data_source::Specifier::InlineString(s)) => Some(Bytes::from(s)),
            Some(data_source::Specifier::InlineBytes(b)) => Some(Bytes::from(b)),
            Some(_) => {
                return Err(ResourceError::Unsupported {
                    at: format!("{at}.body"),
                    fields: vec!["filename / environment_variable (inline bodies only)".into()],
                });
            }
        };
        let headers = crate::envoy::headers::mutations(
            std::mem::take(&mut mapper.headers_to_add),
            Vec::new(),
            &format!("{at}.headers_to_add"),
        )?;
        nothing_else(&mapper, fields::RESPONSE_MAPPER, &at)?;
        mappers.push(RawReplyMapper {
            filter,
            status,
            body,
            headers,
        });
    }
    nothing_else(&config, fields::LOCAL_REPLY_CONFIG, at)?;
    Ok(RawLocalReply { mappers })
}
