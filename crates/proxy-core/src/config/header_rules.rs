//! Settings of the `headers` filter: header changes with a few variables, validated.

use http::HeaderName;
use serde::{Serialize, Serializer};

use super::serialize as ser;

/// Header changes to requests (before they are forwarded) and responses (before the client
/// gets them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeaderRulesConfig {
    pub request: HeaderMutations,
    pub response: HeaderMutations,
}

/// Applied in this order: remove, set, add.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeaderMutations {
    /// Replaces every value of the header.
    #[serde(serialize_with = "header_map")]
    pub set: Vec<(HeaderName, HeaderTemplate)>,
    /// Appends a value, keeping those there.
    #[serde(serialize_with = "header_map")]
    pub add: Vec<(HeaderName, HeaderTemplate)>,
    #[serde(serialize_with = "ser::header_names")]
    pub remove: Vec<HeaderName>,
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
