//! Rewrites of the replies the proxy makes itself (Envoy's `local_reply_config`): errors
//! (404 no route, 503 no healthy host, 504 timeout), filters' answers (a denial, a 429, a
//! fault), direct responses and redirects. The first mapper whose filter holds for a reply
//! changes its status, body and headers. `xds.rs` maps Envoy's `LocalReplyConfig`.

pub(crate) mod xds;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::access_log::filter::{LogFilter, RawLogFilter, log_filter};
use crate::filters::reply::{ReplyRewrite, reply_rewrite};
use crate::*;

/// A listener's rewrites of its local replies, in order: the first that matches applies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LocalReplyConfig {
    pub mappers: Vec<ReplyMapper>,
}

/// One rewrite: for replies its filter picks (reading the reply's status, flag, duration and
/// the request), a new status, body or headers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplyMapper {
    pub filter: LogFilter,
    #[serde(flatten)]
    pub rewrite: ReplyRewrite,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLocalReply {
    #[serde(default)]
    pub mappers: Vec<RawReplyMapper>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawReplyMapper {
    pub filter: Option<RawLogFilter>,
    pub status: Option<u16>,
    #[serde(default, deserialize_with = "crate::units::de_opt_text_bytes")]
    pub body: Option<Bytes>,
    pub headers: Option<crate::RawHeaderMutations>,
}

/// Checks a listener's `local_reply`.
pub(crate) fn local_reply(raw: RawLocalReply, path: &str) -> Result<LocalReplyConfig, ConfigError> {
    let mappers = raw
        .mappers
        .into_iter()
        .enumerate()
        .map(|(i, m)| mapper(m, &format!("{path}.mappers[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LocalReplyConfig { mappers })
}

fn mapper(raw: RawReplyMapper, path: &str) -> Result<ReplyMapper, ConfigError> {
    let filter = raw.filter.ok_or_else(|| {
        ConfigError::invalid(
            format!("{path}.filter"),
            "expected the filter that picks the replies",
        )
    })?;
    Ok(ReplyMapper {
        filter: log_filter(filter, &format!("{path}.filter"))?,
        rewrite: reply_rewrite(raw.status, raw.body, raw.headers, path)?,
    })
}
