//! `x-forwarded-client-cert` (Envoy's `forward_client_cert_details` and
//! `set_current_client_cert_details`): what a listener does with the header a client sends,
//! and what it says of the client's own certificate. By default the header is removed, so
//! that no client can claim a certificate it did not present.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// What is done with a request's `x-forwarded-client-cert`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardClientCert {
    /// Removed (Envoy's default).
    #[default]
    Sanitize,
    /// Passed on as it came over mutual TLS; removed otherwise.
    ForwardOnly,
    /// Over mutual TLS, the client certificate's element appended; removed otherwise.
    AppendForward,
    /// Over mutual TLS, replaced by the client certificate's element; removed otherwise.
    SanitizeSet,
    /// Passed on as it came, whatever the connection.
    AlwaysForwardOnly,
}

impl ForwardClientCert {
    pub(crate) fn parse(value: Option<&str>, path: &str) -> Result<Self, ConfigError> {
        Ok(match value {
            None | Some("sanitize") => Self::Sanitize,
            Some("forward_only") => Self::ForwardOnly,
            Some("append_forward") => Self::AppendForward,
            Some("sanitize_set") => Self::SanitizeSet,
            Some("always_forward_only") => Self::AlwaysForwardOnly,
            Some(other) => {
                return Err(ConfigError::invalid(
                    path,
                    format!(
                        "expected sanitize, forward_only, append_forward, sanitize_set or \
                         always_forward_only, found `{other}`"
                    ),
                ));
            }
        })
    }

    /// Whether the client certificate's own element is written.
    pub fn writes_element(self) -> bool {
        matches!(self, Self::AppendForward | Self::SanitizeSet)
    }
}

/// What the element says of the client certificate besides its hash (and the proxy's own
/// URI name, `By`), in Envoy's order: `Cert`, `Chain`, `Subject`, `URI`, `DNS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientCertDetails {
    /// The certificate, URL-encoded PEM.
    pub cert: bool,
    /// The chain the client sent, leaf first, URL-encoded PEM.
    pub chain: bool,
    /// The subject (RFC 2253).
    pub subject: bool,
    /// The first URI name (`URI=` when there is none).
    pub uri: bool,
    /// Each DNS name.
    pub dns: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_read_by_envoy_s_names() {
        assert_eq!(
            ForwardClientCert::parse(None, "p").unwrap(),
            ForwardClientCert::Sanitize
        );
        assert_eq!(
            ForwardClientCert::parse(Some("append_forward"), "p").unwrap(),
            ForwardClientCert::AppendForward
        );
        let error = ForwardClientCert::parse(Some("append"), "l.http.forward_client_cert")
            .unwrap_err()
            .to_string();
        assert!(error.contains("l.http.forward_client_cert"), "{error}");
    }
}
