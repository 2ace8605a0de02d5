//! The `headers` filter's settings.

use http::HeaderValue;
use http::header::{self, HeaderName};

use crate::config::raw::{RawHeaderMutations, RawHeaderRules};
use crate::config::*;

/// Headers that frame, route or upgrade a message: changing them would let a rule break the
/// exchange (or smuggle a request), so rules may not touch them.
const PROTECTED: [HeaderName; 7] = [
    header::HOST,
    header::CONNECTION,
    header::CONTENT_LENGTH,
    header::TRANSFER_ENCODING,
    header::TE,
    header::UPGRADE,
    header::TRAILER,
];

pub(super) fn header_rules(
    raw: RawHeaderRules,
    path: &str,
) -> Result<HeaderRulesConfig, ConfigError> {
    Ok(HeaderRulesConfig {
        request: mutations(
            raw.request.unwrap_or_default(),
            &format!("{path}.request"),
            false,
        )?,
        response: mutations(
            raw.response.unwrap_or_default(),
            &format!("{path}.response"),
            true,
        )?,
    })
}

fn mutations(
    raw: RawHeaderMutations,
    path: &str,
    response: bool,
) -> Result<HeaderMutations, ConfigError> {
    let name = |text: &str, at: String| -> Result<HeaderName, ConfigError> {
        let name = HeaderName::from_bytes(text.as_bytes()).map_err(|_| {
            ConfigError::invalid(&at, format!("expected a header name, found `{text}`"))
        })?;
        if PROTECTED.contains(&name) || name.as_str() == "keep-alive" {
            return Err(ConfigError::invalid(
                at,
                format!("`{name}` frames or routes the message and cannot be changed by a rule"),
            ));
        }
        Ok(name)
    };
    let values = |entries: std::collections::BTreeMap<String, String>, key: &str| {
        let mut out: Vec<(HeaderName, HeaderTemplate)> = Vec::with_capacity(entries.len());
        for (text, value) in entries {
            let at = format!("{path}.{key}.{text}");
            let header = name(&text, at.clone())?;
            if out.iter().any(|(h, _)| *h == header) {
                return Err(ConfigError::invalid(at, "this header is given twice"));
            }
            let template =
                HeaderTemplate::parse(&value).map_err(|e| ConfigError::invalid(&at, e))?;
            if !response && template.uses(&TemplatePart::UpstreamHost) {
                return Err(ConfigError::invalid(
                    at,
                    "%UPSTREAM_HOST% is known only once the upstream answers: use it in `response` rules",
                ));
            }
            // The literal parts must be valid header text on their own.
            for part in &template.0 {
                if let TemplatePart::Literal(literal) = part
                    && HeaderValue::from_str(literal).is_err()
                {
                    return Err(ConfigError::invalid(
                        at,
                        format!("expected a header value of visible ASCII, found `{value}`"),
                    ));
                }
            }
            out.push((header, template));
        }
        Ok::<_, ConfigError>(out)
    };
    let remove = raw
        .remove
        .iter()
        .enumerate()
        .map(|(i, text)| name(text, format!("{path}.remove[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HeaderMutations {
        set: values(raw.set, "set")?,
        add: values(raw.add, "add")?,
        remove,
    })
}
