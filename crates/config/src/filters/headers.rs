//! Settings of the `headers` filter: header changes with a few variables, validated.

use http::HeaderName;
use http::HeaderValue;
use http::header;
use serde::{Deserialize, Serialize, Serializer};

use crate::serialize as ser;
use crate::*;

/// Header changes to requests (before they are forwarded) and responses (before the client
/// gets them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeaderRulesConfig {
    pub request: HeaderMutations,
    pub response: HeaderMutations,
    /// The listener's rules, then the virtual host's, then the route's, so the most specific
    /// `set` wins (the default); `false`: the other way round, the listener's last (Envoy's
    /// default for a route configuration's header mutations). Set on the listener's entry.
    #[serde(skip_serializing_if = "is_true")]
    pub most_specific_wins: bool,
}

impl Default for HeaderRulesConfig {
    fn default() -> Self {
        Self {
            request: HeaderMutations::default(),
            response: HeaderMutations::default(),
            most_specific_wins: true,
        }
    }
}

fn is_true(value: &bool) -> bool {
    *value
}

/// Applied in this order: remove, set, add, add_if_absent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeaderMutations {
    /// Replaces every value of the header.
    #[serde(serialize_with = "header_map")]
    pub set: Vec<(HeaderName, HeaderTemplate)>,
    /// Appends a value, keeping those there.
    #[serde(serialize_with = "header_map")]
    pub add: Vec<(HeaderName, HeaderTemplate)>,
    /// Adds the header only where the message has none.
    #[serde(serialize_with = "header_map", skip_serializing_if = "Vec::is_empty")]
    pub add_if_absent: Vec<(HeaderName, HeaderTemplate)>,
    #[serde(serialize_with = "ser::header_names")]
    pub remove: Vec<HeaderName>,
    /// Removes every header whose name matches (never one of the [`PROTECTED`] ones), after
    /// `remove`.
    #[serde(serialize_with = "ser::string_matches", skip_serializing_if = "Vec::is_empty")]
    pub remove_matching: Vec<StringMatch>,
}

/// Whether a header may be changed by a rule: not one that frames or routes the message.
pub fn changeable(name: &HeaderName) -> bool {
    !PROTECTED.contains(name) && name.as_str() != "keep-alive"
}


impl HeaderMutations {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
            && self.add.is_empty()
            && self.add_if_absent.is_empty()
            && self.remove.is_empty()
            && self.remove_matching.is_empty()
    }
}

/// A header value as written, with `%VARIABLE%`s filled in per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTemplate(pub Vec<TemplatePart>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    Literal(String),
    /// `%DOWNSTREAM_REMOTE_ADDRESS%`: the client's `IP:port`.
    ClientAddress,
    /// `%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%`: the client's IP.
    ClientIp,
    /// `%REQ_ID%`: the request's `x-request-id`.
    RequestId,
    /// `%UPSTREAM_HOST%`: the host that answered (responses only).
    UpstreamHost,
}

/// Each variable's name, as written between `%`s.
pub const TEMPLATE_VARIABLES: [(&str, TemplatePart); 4] = [
    ("DOWNSTREAM_REMOTE_ADDRESS", TemplatePart::ClientAddress),
    (
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT",
        TemplatePart::ClientIp,
    ),
    ("REQ_ID", TemplatePart::RequestId),
    ("UPSTREAM_HOST", TemplatePart::UpstreamHost),
];

impl HeaderTemplate {
    /// Parses `%VARIABLE%`s; `%%` is a literal `%`.
    pub fn parse(text: &str) -> Result<HeaderTemplate, String> {
        crate::template::parse(text, &TEMPLATE_VARIABLES, TemplatePart::Literal, "variable")
            .map(HeaderTemplate)
    }

    /// The text it was parsed from.
    pub fn text(&self) -> String {
        crate::template::write(&self.0, &TEMPLATE_VARIABLES, |part| match part {
            TemplatePart::Literal(literal) => Some(literal),
            _ => None,
        })
    }

    pub fn uses(&self, variable: &TemplatePart) -> bool {
        self.0.contains(variable)
    }
}

fn header_map<S: Serializer>(
    entries: &[(HeaderName, HeaderTemplate)],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(
        entries
            .iter()
            .map(|(name, value)| (name.as_str(), value.text())),
    )
}

per_route_settings!(HeaderRulesConfig, RawHeaderRules, header_rules);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_parse_and_write_back() {
        let t =
            HeaderTemplate::parse("ip=%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%; 100%%").unwrap();
        assert_eq!(
            t.0,
            vec![
                TemplatePart::Literal("ip=".into()),
                TemplatePart::ClientIp,
                TemplatePart::Literal("; 100%".into()),
            ]
        );
        assert_eq!(
            t.text(),
            "ip=%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%; 100%%"
        );
        assert!(
            HeaderTemplate::parse("%NOPE%")
                .unwrap_err()
                .contains("unknown variable")
        );
        assert!(
            HeaderTemplate::parse("50%")
                .unwrap_err()
                .contains("unterminated")
        );
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderRules {
    pub request: Option<RawHeaderMutations>,
    pub response: Option<RawHeaderMutations>,
    pub most_specific_wins: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHeaderMutations {
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub add: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub add_if_absent: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
    /// Names matched by `{ exact | prefix | suffix | contains | regex: ... }`.
    #[serde(default)]
    pub remove_matching: Vec<RawStringMatch>,
}


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

pub(crate) fn header_rules(
    raw: RawHeaderRules,
    path: &str,
    on_route: bool,
) -> Result<HeaderRulesConfig, ConfigError> {
    if on_route && raw.most_specific_wins.is_some() {
        return Err(ConfigError::invalid(
            format!("{path}.most_specific_wins"),
            "the order of the levels is the listener's to say",
        ));
    }
    let (request, response) = both_ways(raw.request, raw.response, path)?;
    Ok(HeaderRulesConfig {
        most_specific_wins: raw.most_specific_wins.unwrap_or(true),
        request,
        response,
    })
}

/// A `request` and a `response` set of changes, checked (each may be absent).
pub(crate) fn both_ways(
    request: Option<RawHeaderMutations>,
    response: Option<RawHeaderMutations>,
    path: &str,
) -> Result<(HeaderMutations, HeaderMutations), ConfigError> {
    Ok((
        mutations(
            request.unwrap_or_default(),
            &format!("{path}.request"),
            false,
        )?,
        mutations(
            response.unwrap_or_default(),
            &format!("{path}.response"),
            true,
        )?,
    ))
}

pub(crate) fn mutations(
    raw: RawHeaderMutations,
    path: &str,
    response: bool,
) -> Result<HeaderMutations, ConfigError> {
    let name = |text: &str, at: String| -> Result<HeaderName, ConfigError> {
        let name = HeaderName::from_bytes(text.as_bytes()).map_err(|_| {
            ConfigError::invalid(&at, format!("expected a header name, found `{text}`"))
        })?;
        if !changeable(&name) {
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
    let remove_matching = crate::matchers::string_patterns(
        raw.remove_matching,
        &format!("{path}.remove_matching"),
    )?;
    Ok(HeaderMutations {
        remove_matching,
        set: values(raw.set, "set")?,
        add: values(raw.add, "add")?,
        add_if_absent: values(raw.add_if_absent, "add_if_absent")?,
        remove,
    })
}
