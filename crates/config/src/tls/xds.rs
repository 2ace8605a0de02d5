//! TLS transport sockets: DownstreamTlsContext -> a listener's `tls`, UpstreamTlsContext -> a
//! cluster's. Certificates, keys and CAs are files (`filename`), inline PEM, or secrets named
//! for SDS (`sds.rs`), filled in once they arrive.

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, TransportSocket, data_source, transport_socket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, UpstreamTlsContext, common_tls_context,
    tls_parameters::TlsProtocol,
};

use super::sds::{SecretRefs, secret_name};
use crate::envoy::{ResourceError, fields, nothing_else};
use crate::{RawCertificate, RawClientCertificate, RawClusterTls, RawKeyPair, RawListenerTls};

const DOWNSTREAM: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// The TLS context inside a transport socket, or an error if it is another kind of socket.
fn context<M: prost::Message + Default>(
    socket: TransportSocket,
    type_url: &str,
    at: &str,
) -> Result<M, ResourceError> {
    match socket.config_type {
        Some(transport_socket::ConfigType::TypedConfig(any)) if any.type_url == type_url => {
            M::decode(any.value.as_slice()).map_err(|e| {
                ResourceError::invalid(at, format!("cannot decode the TLS context: {e}"))
            })
        }
        _ => Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec![format!("transport socket `{}` (TLS only)", socket.name)],
        }),
    }
}

const QUIC_DOWNSTREAM: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.quic.v3.QuicDownstreamTransport";

/// Whether a transport socket is QUIC's (`envoy.transport_sockets.quic`).
pub(crate) fn is_quic(socket: &TransportSocket) -> bool {
    match &socket.config_type {
        Some(transport_socket::ConfigType::TypedConfig(any)) => any.type_url == QUIC_DOWNSTREAM,
        None => socket.name == "envoy.transport_sockets.quic",
    }
}

/// A QUIC listener chain's `QuicDownstreamTransport`: its TLS context, as a TCP chain's, and
/// whether it takes 0-RTT. Envoy's `enable_early_data` is on unless set; here 0-RTT is off
/// unless set (`true`), as early data could be replayed, and then only safe methods are
/// served before the handshake ends (the file's `http3.early_data`).
pub(crate) fn quic_listener_tls(
    socket: TransportSocket,
    at: &str,
) -> Result<(RawListenerTls, SecretRefs, bool), ResourceError> {
    use envoy_types::pb::envoy::extensions::transport_sockets::quic::v3::QuicDownstreamTransport;
    let socket_at = format!("{at}.transport_socket");
    let mut quic: QuicDownstreamTransport = context(socket, QUIC_DOWNSTREAM, &socket_at)?;
    let early_data = quic.enable_early_data.take().is_some_and(|on| on.value);
    let mut tls = quic.downstream_tls_context.take().ok_or_else(|| {
        ResourceError::invalid(
            &socket_at,
            "a QUIC transport socket needs its downstream_tls_context",
        )
    })?;
    nothing_else(&quic, fields::QUIC_DOWNSTREAM_TRANSPORT, &socket_at)?;
    // QUIC here speaks `h3` alone, whatever else the context offers.
    if let Some(common) = &mut tls.common_tls_context {
        let alpn = std::mem::take(&mut common.alpn_protocols);
        if !alpn.is_empty() && !alpn.iter().any(|p| p == "h3") {
            return Err(ResourceError::Unsupported {
                at: format!("{socket_at}.downstream_tls_context.common_tls_context"),
                fields: vec![format!("alpn_protocols {alpn:?} (QUIC serves h3)")],
            });
        }
    }
    let inner = TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(
            envoy_types::pb::google::protobuf::Any {
                type_url: DOWNSTREAM.into(),
                value: prost::Message::encode_to_vec(&tls),
            },
        )),
    };
    let (tls, secrets) = listener_tls(
        inner,
        &format!("{at}.transport_socket.downstream_tls_context"),
    )?;
    Ok((tls, secrets, early_data))
}

/// Whether a transport socket is plain text (`envoy.transport_sockets.raw_buffer`).
pub(crate) fn is_raw_buffer(socket: &TransportSocket) -> bool {
    const RAW_BUFFER: &str =
        "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer";
    match &socket.config_type {
        Some(transport_socket::ConfigType::TypedConfig(any)) => any.type_url == RAW_BUFFER,
        None => socket.name == "envoy.transport_sockets.raw_buffer",
    }
}

/// A listener's TLS, and the secrets it waits for (its certificates and client CA are
/// filled in from them).
pub(crate) fn listener_tls(
    socket: TransportSocket,
    at: &str,
) -> Result<(RawListenerTls, SecretRefs), ResourceError> {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::downstream_tls_context::SessionTicketKeysType;
    let at = format!("{at}.transport_socket");
    let mut tls: DownstreamTlsContext = context(socket, DOWNSTREAM, &at)?;
    let common = tls.common_tls_context.take().unwrap_or_default();
    let required = tls.require_client_certificate.take().map(|v| v.value);
    // Resumption is on unless turned off, as in Envoy: by tickets (stateless) and by the
    // session cache (stateful).
    let tickets = match tls.session_ticket_keys_type.take() {
        None => true,
        Some(SessionTicketKeysType::DisableStatelessSessionResumption(off)) => !off,
        Some(_) => {
            return Err(ResourceError::Unsupported {
                at,
                fields: vec![
                    "session_ticket_keys (tickets are keyed by each proxy, rotating)".into(),
                ],
            });
        }
    };
    let cache = !std::mem::take(&mut tls.disable_stateful_session_resumption);
    nothing_else(&tls, fields::DOWNSTREAM_TLS_CONTEXT, &at)?;
    let parts = common_context(common, &format!("{at}.common_tls_context"))?;
    if !parts.subject_alt_names.is_empty() {
        return Err(ResourceError::Unsupported {
            at,
            fields: vec![
                "match_typed_subject_alt_names (client certificates are checked against the CA alone)"
                    .into(),
            ],
        });
    }
    if required == Some(true) && parts.ca.is_none() && parts.secrets.validation.is_none() {
        return Err(ResourceError::invalid(
            at,
            "require_client_certificate needs a validation_context with trusted_ca",
        ));
    }
    if parts.certificates.is_empty() && parts.secrets.certificates.is_empty() {
        return Err(ResourceError::invalid(
            at,
            "expected at least one tls_certificate",
        ));
    }
    let secrets = SecretRefs {
        client_certificate_required: required,
        ..parts.secrets
    };
    let raw = RawListenerTls {
        certificates: parts
            .certificates
            .into_iter()
            .map(|(cert_chain, private_key)| RawCertificate {
                cert_chain,
                private_key,
                server_names: Vec::new(),
            })
            .collect(),
        unknown_server_name: None,
        min_version: parts.min_version,
        alpn: (!parts.alpn.is_empty()).then_some(parts.alpn),
        session_tickets: Some(tickets),
        session_cache_size: (!cache).then_some(0),
        handshake_timeout: None,
        client_certificate: parts.ca.map(|ca| RawClientCertificate {
            ca,
            required: required.or(Some(false)),
        }),
    };
    Ok((raw, secrets))
}

/// A cluster's TLS, and the secrets it waits for (its client certificate and CA are filled
/// in from them).
pub(crate) fn cluster_tls(
    socket: TransportSocket,
    at: &str,
) -> Result<(RawClusterTls, SecretRefs), ResourceError> {
    let at = format!("{at}.transport_socket");
    let mut tls: UpstreamTlsContext = context(socket, UPSTREAM, &at)?;
    let common = tls.common_tls_context.take().unwrap_or_default();
    let sni = std::mem::take(&mut tls.sni);
    let auto_host_sni = std::mem::take(&mut tls.auto_host_sni);
    let sni_san_validation = std::mem::take(&mut tls.auto_sni_san_validation);
    nothing_else(&tls, fields::UPSTREAM_TLS_CONTEXT, &at)?;
    let mut parts = common_context(common, &format!("{at}.common_tls_context"))?;
    // The name sent is verified here whenever no SAN matchers decide: replacing them with it
    // (`auto_sni_san_validation`) is leaving them out.
    if sni_san_validation {
        parts.subject_alt_names.clear();
    }
    // The protocol offered is the cluster's own (`h2` or `http/1.1`).
    if !parts.alpn.is_empty() {
        return Err(ResourceError::Unsupported {
            at,
            fields: vec![
                "common_tls_context.alpn_protocols (the cluster's protocol decides)".into(),
            ],
        });
    }
    if parts.certificates.len() + parts.secrets.certificates.len() > 1 {
        return Err(ResourceError::invalid(at, "at most one client certificate"));
    }
    let raw = RawClusterTls {
        ca: parts.ca,
        server_name: (!sni.is_empty()).then_some(sni),
        client_certificate: parts
            .certificates
            .pop()
            .map(|(cert_chain, private_key)| RawKeyPair {
                cert_chain,
                private_key,
            }),
        min_version: parts.min_version,
        subject_alt_names: parts.subject_alt_names,
        auto_host_sni: auto_host_sni.then_some(true),
    };
    Ok((raw, parts.secrets))
}

/// A validation context's `match_typed_subject_alt_names`, as the file writes them.
fn san_matchers(
    v: &mut envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::CertificateValidationContext,
    at: &str,
) -> Result<Vec<crate::tls::san::RawSanMatch>, ResourceError> {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::subject_alt_name_matcher::SanType;
    std::mem::take(&mut v.match_typed_subject_alt_names)
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("{at}.match_typed_subject_alt_names[{i}]");
            let kind = match SanType::try_from(m.san_type).unwrap_or(SanType::Unspecified) {
                SanType::Dns => "dns",
                SanType::Uri => "uri",
                SanType::Email => "email",
                SanType::IpAddress => "ip",
                SanType::Unspecified => {
                    return Err(ResourceError::invalid(
                        format!("{at}.san_type"),
                        "expected DNS, URI, EMAIL or IP_ADDRESS",
                    ));
                }
                SanType::OtherName => {
                    return Err(ResourceError::Unsupported {
                        at,
                        fields: vec!["san_type OTHER_NAME".into()],
                    });
                }
            };
            let matcher = m
                .matcher
                .ok_or_else(|| ResourceError::invalid(&at, "expected a matcher"))?;
            let m = crate::envoy::matchers::string_match(
                String::new(),
                matcher,
                &format!("{at}.matcher"),
            )?;
            Ok(crate::tls::san::RawSanMatch {
                kind: kind.to_owned(),
                exact: m.exact,
                prefix: m.prefix,
                suffix: m.suffix,
                contains: m.contains,
                regex: m.regex,
            })
        })
        .collect()
}

#[derive(Default)]
struct CommonParts {
    /// (certificate chain file, private key file).
    certificates: Vec<(String, String)>,
    ca: Option<String>,
    alpn: Vec<String>,
    min_version: Option<String>,
    secrets: SecretRefs,
    /// `match_typed_subject_alt_names` (upstream TLS only).
    subject_alt_names: Vec<crate::tls::san::RawSanMatch>,
}

fn common_context(mut common: CommonTlsContext, at: &str) -> Result<CommonParts, ResourceError> {
    let mut parts = CommonParts::default();
    for (i, mut cert) in std::mem::take(&mut common.tls_certificates)
        .into_iter()
        .enumerate()
    {
        let at = format!("{at}.tls_certificates[{i}]");
        let chain = pem_or_path(
            cert.certificate_chain.take(),
            &format!("{at}.certificate_chain"),
        )?;
        let key = pem_or_path(cert.private_key.take(), &format!("{at}.private_key"))?;
        nothing_else(&cert, fields::TLS_CERTIFICATE, &at)?;
        parts.certificates.push((chain, key));
    }
    for (i, config) in std::mem::take(&mut common.tls_certificate_sds_secret_configs)
        .into_iter()
        .enumerate()
    {
        let at = format!("{at}.tls_certificate_sds_secret_configs[{i}]");
        parts.secrets.certificates.push(secret_name(config, &at)?);
    }
    if !parts.certificates.is_empty() && !parts.secrets.certificates.is_empty() {
        return Err(ResourceError::invalid(
            at,
            "tls_certificates and tls_certificate_sds_secret_configs together (one or the other, as Envoy)",
        ));
    }
    use common_tls_context::ValidationContextType;
    match common.validation_context_type.take() {
        None => {}
        Some(ValidationContextType::ValidationContext(mut v)) => {
            let at = format!("{at}.validation_context");
            parts.ca = Some(pem_or_path(
                v.trusted_ca.take(),
                &format!("{at}.trusted_ca"),
            )?);
            parts.subject_alt_names = san_matchers(&mut v, &at)?;
            nothing_else(&v, fields::CERTIFICATE_VALIDATION_CONTEXT, &at)?;
        }
        Some(ValidationContextType::ValidationContextSdsSecretConfig(config)) => {
            let at = format!("{at}.validation_context_sds_secret_config");
            parts.secrets.validation = Some(secret_name(config, &at)?);
        }
        Some(ValidationContextType::CombinedValidationContext(mut combined)) => {
            let at = format!("{at}.combined_validation_context");
            let config = combined
                .validation_context_sds_secret_config
                .take()
                .ok_or_else(|| {
                    ResourceError::invalid(&at, "expected validation_context_sds_secret_config")
                })?;
            parts.secrets.validation = Some(secret_name(
                config,
                &format!("{at}.validation_context_sds_secret_config"),
            )?);
            // The secret's CA is what is checked; rules beside it would add to the check.
            if let Some(mut default) = combined.default_validation_context.take() {
                parts.subject_alt_names =
                    san_matchers(&mut default, &format!("{at}.default_validation_context"))?;
                nothing_else(
                    &default,
                    fields::CERTIFICATE_VALIDATION_CONTEXT,
                    &format!("{at}.default_validation_context"),
                )?;
            }
            #[allow(deprecated)]
            let provider = combined.validation_context_certificate_provider.take();
            if provider.is_some() || combined != Default::default() {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec!["certificate providers".into()],
                });
            }
        }
        Some(_) => {
            return Err(ResourceError::Unsupported {
                at: at.to_owned(),
                fields: vec![
                    "validation_context_type (a validation_context, inline or by SDS)".into(),
                ],
            });
        }
    }
    parts.alpn = std::mem::take(&mut common.alpn_protocols);
    if let Some(mut params) = common.tls_params.take() {
        let at = format!("{at}.tls_params");
        let min = TlsProtocol::try_from(params.tls_minimum_protocol_version)
            .unwrap_or(TlsProtocol::TlsAuto);
        parts.min_version = match min {
            TlsProtocol::TlsAuto | TlsProtocol::TlSv12 => None,
            TlsProtocol::TlSv13 => Some("1.3".into()),
            _ => {
                return Err(ResourceError::invalid(
                    format!("{at}.tls_minimum_protocol_version"),
                    "TLS 1.0 and 1.1 are not offered: the minimum is 1.2",
                ));
            }
        };
        params.tls_minimum_protocol_version = 0;
        // The maximum is always 1.3 here.
        if matches!(
            TlsProtocol::try_from(params.tls_maximum_protocol_version),
            Ok(TlsProtocol::TlsAuto | TlsProtocol::TlSv13)
        ) {
            params.tls_maximum_protocol_version = 0;
        }
        nothing_else(&params, fields::TLS_PARAMETERS, &at)?;
    }
    nothing_else(&common, fields::COMMON_TLS_CONTEXT, at)?;
    Ok(parts)
}

/// A file name, or inline PEM (from its first `-----BEGIN`: the config takes text that
/// starts so as PEM, not as a path).
pub(super) fn pem_or_path(source: Option<DataSource>, at: &str) -> Result<String, ResourceError> {
    let inline = |text: String| match text.find("-----BEGIN ") {
        Some(start) => Ok(text[start..].to_owned()),
        None => Err(ResourceError::invalid(
            at,
            "inline data without a PEM block",
        )),
    };
    match source.and_then(|s| s.specifier) {
        Some(data_source::Specifier::Filename(path)) if !path.is_empty() => Ok(path),
        Some(data_source::Specifier::InlineString(text)) => inline(text),
        Some(data_source::Specifier::InlineBytes(bytes)) => inline(
            String::from_utf8(bytes)
                .map_err(|_| ResourceError::invalid(at, "PEM that is not text"))?,
        ),
        Some(_) => Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["environment_variable (files or inline PEM)".into()],
        }),
        None => Err(ResourceError::invalid(
            at,
            "expected a `filename` or inline PEM",
        )),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, SubjectAltNameMatcher, UpstreamTlsContext,
        subject_alt_name_matcher::SanType,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};

    use super::*;

    fn socket(context: &UpstreamTlsContext) -> TransportSocket {
        let any = envoy_types::pb::google::protobuf::Any {
            type_url: UPSTREAM.into(),
            value: prost::Message::encode_to_vec(context),
        };
        TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any)),
        }
    }

    /// `auto_host_sni` is kept; `auto_sni_san_validation` leaves the SAN matchers out (the
    /// name sent is what is verified then); a plain-text socket is told apart.
    #[test]
    fn host_names_and_sni_validation_translate() {
        let matcher = SubjectAltNameMatcher {
            san_type: SanType::Dns as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact("a.internal".into())),
                ignore_case: false,
            }),
            oid: String::new(),
        };
        let context = |sni_san_validation: bool| UpstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                validation_context_type: Some(
                    common_tls_context::ValidationContextType::ValidationContext(
                        CertificateValidationContext {
                            trusted_ca: Some(DataSource {
                                specifier: Some(data_source::Specifier::Filename(
                                    "/etc/ca.pem".into(),
                                )),
                                ..Default::default()
                            }),
                            match_typed_subject_alt_names: vec![matcher.clone()],
                            ..Default::default()
                        },
                    ),
                ),
                ..Default::default()
            }),
            auto_host_sni: true,
            auto_sni_san_validation: sni_san_validation,
            ..Default::default()
        };
        let (raw, _) = cluster_tls(socket(&context(false)), "cluster `c`").unwrap();
        assert_eq!(raw.auto_host_sni, Some(true));
        assert_eq!(raw.subject_alt_names.len(), 1);
        let (raw, _) = cluster_tls(socket(&context(true)), "cluster `c`").unwrap();
        assert!(raw.subject_alt_names.is_empty());
        let plain = TransportSocket {
            name: "envoy.transport_sockets.raw_buffer".into(),
            config_type: None,
        };
        assert!(is_raw_buffer(&plain));
        assert!(!is_raw_buffer(&socket(&context(false))));
    }
}
