//! A response's new status, body or headers, as a local reply mapper (`local_reply`) or the
//! `custom_response` filter gives them: one form, checked once.

use bytes::Bytes;
use http::StatusCode;
use serde::Serialize;

use super::headers::{HeaderMutations, mutations};
use crate::serialize as ser;
use crate::*;

/// A response's new status, body or headers (a local reply mapper's, the `custom_response`
/// filter's); what it does not set stays.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplyRewrite {
    #[serde(
        serialize_with = "ser::opt_status",
        skip_serializing_if = "Option::is_none"
    )]
    pub status: Option<StatusCode>,
    /// Sent as `text/plain` unless the headers set another type.
    #[serde(
        serialize_with = "ser::opt_bytes_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub body: Option<Bytes>,
    /// Response header changes (`set`, `add`, `add_if_absent`; values may use the header
    /// operators).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headers: Option<HeaderMutations>,
}

/// The `status`, `body` and `headers` keys of a rewrite at `path`.
pub(crate) fn reply_rewrite(
    status: Option<u16>,
    body: Option<Bytes>,
    headers: Option<crate::RawHeaderMutations>,
    path: &str,
) -> Result<ReplyRewrite, ConfigError> {
    let status = status
        .map(|code| {
            StatusCode::from_u16(code)
                .ok()
                .filter(|_| (200..600).contains(&code))
                .ok_or_else(|| {
                    ConfigError::invalid(
                        format!("{path}.status"),
                        format!("expected a status from 200 to 599, found {code}"),
                    )
                })
        })
        .transpose()?;
    let headers = headers
        .map(|h| mutations(h, &format!("{path}.headers"), true))
        .transpose()?;
    if let Some(h) = &headers
        && (!h.remove.is_empty() || !h.remove_matching.is_empty())
    {
        return Err(ConfigError::invalid(
            format!("{path}.headers"),
            "a reply's headers are set or added (`set`, `add`, `add_if_absent`), not removed",
        ));
    }
    Ok(ReplyRewrite {
        status,
        body,
        headers,
    })
}
