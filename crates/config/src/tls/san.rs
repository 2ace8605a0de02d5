//! Upstream certificates verified by their subject alternative names (Envoy's
//! `match_typed_subject_alt_names`): the chain is verified against the CA as always, and then
//! one of the leaf's names of a matcher's kind must match it, in place of the check of the
//! name the connection asked for (SNI), as Envoy verifies.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::StringMatch;
use crate::{ConfigError, RawHeaderMatch};

/// The kind of name a matcher is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SanKind {
    Dns,
    Uri,
    Email,
    Ip,
}

/// One matcher: a name of `kind` that `pattern` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SanMatch {
    pub kind: SanKind,
    /// For DNS names, `exact` follows DNS rules: case-insensitive, and a wildcard name in the
    /// certificate (`*.example.com`) takes one label in its place.
    pub pattern: StringMatch,
}

impl std::hash::Hash for SanMatch {
    /// By its written form (a regex pattern has no hash of its own).
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        serde_json::to_string(self).unwrap_or_default().hash(state);
    }
}

impl Serialize for SanMatch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(2))?;
        map.serialize_entry("type", &self.kind)?;
        self.pattern.write(&mut map)?;
        map.end()
    }
}

/// `{ type: dns | uri | email | ip, exact | prefix | suffix | contains | regex: VALUE }`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSanMatch {
    #[serde(rename = "type")]
    pub kind: String,
    pub exact: Option<String>,
    pub prefix: Option<String>,
    pub suffix: Option<String>,
    pub contains: Option<String>,
    pub regex: Option<String>,
}

pub(crate) fn check(raw: &[RawSanMatch], path: &str) -> Result<Vec<SanMatch>, ConfigError> {
    raw.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("{path}[{i}]");
            let kind = match m.kind.as_str() {
                "dns" => SanKind::Dns,
                "uri" => SanKind::Uri,
                "email" => SanKind::Email,
                "ip" => SanKind::Ip,
                other => {
                    return Err(ConfigError::invalid(
                        format!("{at}.type"),
                        format!("expected dns, uri, email or ip, found `{other}`"),
                    ));
                }
            };
            let as_header = RawHeaderMatch {
                exact: m.exact.clone(),
                prefix: m.prefix.clone(),
                suffix: m.suffix.clone(),
                contains: m.contains.clone(),
                regex: m.regex.clone(),
                ..Default::default()
            };
            // An empty prefix, suffix or substring takes every name: verification by the
            // chain alone, which is not what a matcher is written for (Envoy refuses them).
            for (key, value) in [
                ("prefix", &m.prefix),
                ("suffix", &m.suffix),
                ("contains", &m.contains),
            ] {
                if value.as_deref() == Some("") {
                    return Err(ConfigError::invalid(
                        format!("{at}.{key}"),
                        "expected a non-empty value",
                    ));
                }
            }
            let pattern = crate::matchers::string_match(&as_header, &at)?.ok_or_else(|| {
                ConfigError::invalid(
                    &at,
                    "expected one of `exact`, `prefix`, `suffix`, `contains` or `regex`",
                )
            })?;
            Ok(SanMatch { kind, pattern })
        })
        .collect()
}

/// Whether the certificate `der` has a name that one of `matchers` takes; `false` for one
/// that cannot be read.
pub fn certificate_matches(matchers: &[SanMatch], der: &[u8]) -> bool {
    use x509_parser::extensions::GeneralName;
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return false;
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return false;
    };
    san.value.general_names.iter().any(|name| {
        let (kind, text) = match name {
            GeneralName::DNSName(n) => (SanKind::Dns, (*n).to_owned()),
            GeneralName::URI(u) => (SanKind::Uri, (*u).to_owned()),
            GeneralName::RFC822Name(e) => (SanKind::Email, (*e).to_owned()),
            GeneralName::IPAddress(bytes) => match ip_text(bytes) {
                Some(ip) => (SanKind::Ip, ip),
                None => return false,
            },
            _ => return false,
        };
        matchers
            .iter()
            .any(|m| m.kind == kind && name_matches(m, &text))
    })
}

fn ip_text(bytes: &[u8]) -> Option<String> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .ok()
            .map(|b| std::net::Ipv4Addr::from(b).to_string()),
        16 => <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| std::net::Ipv6Addr::from(b).to_string()),
        _ => None,
    }
}

fn name_matches(m: &SanMatch, name: &str) -> bool {
    match (&m.pattern, m.kind) {
        (StringMatch::Exact(wanted), SanKind::Dns) => dns_name_match(wanted, name),
        (pattern, _) => pattern.matches(name.as_bytes()),
    }
}

/// `name` taken by a certificate's DNS name `pattern`: equal ignoring case, or `*.rest`
/// standing for one label before `rest`.
fn dns_name_match(name: &str, pattern: &str) -> bool {
    let (name, pattern) = (name.to_ascii_lowercase(), pattern.to_ascii_lowercase());
    if name == pattern {
        return true;
    }
    match pattern.strip_prefix('*') {
        Some(rest) if rest.starts_with('.') && name.len() > rest.len() => name
            .strip_suffix(rest)
            .is_some_and(|label| !label.is_empty() && !label.contains('.')),
        _ => false,
    }
}

/// Verifies the chain against `roots`, then the leaf's names against the matchers.
#[derive(Debug)]
pub(crate) struct SanVerifier {
    roots: Arc<RootCertStore>,
    matchers: Vec<SanMatch>,
    provider: Arc<CryptoProvider>,
}

impl SanVerifier {
    pub(crate) fn new(
        roots: RootCertStore,
        matchers: Vec<SanMatch>,
        provider: Arc<CryptoProvider>,
    ) -> Self {
        Self {
            roots: Arc::new(roots),
            matchers,
            provider,
        }
    }
}

impl ServerCertVerifier for SanVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        if certificate_matches(&self.matchers, end_entity) {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dns(pattern: StringMatch) -> SanMatch {
        SanMatch {
            kind: SanKind::Dns,
            pattern,
        }
    }

    fn cert(names: &[&str]) -> Vec<u8> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        rcgen::generate_simple_self_signed(names)
            .expect("certificate")
            .cert
            .der()
            .to_vec()
    }

    #[test]
    fn dns_names_match_exactly_ignoring_case_with_one_label_for_a_wildcard() {
        assert!(dns_name_match("api.example.com", "API.example.com"));
        assert!(dns_name_match("api.example.com", "*.example.com"));
        assert!(!dns_name_match("a.api.example.com", "*.example.com"));
        assert!(!dns_name_match("example.com", "*.example.com"));
        assert!(!dns_name_match("api.example.org", "*.example.com"));
        assert!(!dns_name_match("api.example.com", "*example.com"));
    }

    #[test]
    fn a_certificate_matches_by_a_name_of_the_matchers_kind() {
        let der = cert(&["backend.internal", "*.pods.internal", "10.0.0.7"]);
        let exact = |n: &str| dns(StringMatch::Exact(n.into()));
        assert!(certificate_matches(&[exact("backend.internal")], &der));
        assert!(certificate_matches(&[exact("web-1.pods.internal")], &der));
        assert!(!certificate_matches(&[exact("other.internal")], &der));
        // A suffix matcher compares the name as written (no wildcard rules).
        assert!(certificate_matches(
            &[dns(StringMatch::Suffix(".pods.internal".into()))],
            &der
        ));
        let ip = |p: &str| SanMatch {
            kind: SanKind::Ip,
            pattern: StringMatch::Exact(p.into()),
        };
        assert!(certificate_matches(&[ip("10.0.0.7")], &der));
        // The name's kind counts: a DNS name is not an IP address.
        assert!(!certificate_matches(&[ip("backend.internal")], &der));
        assert!(!certificate_matches(&[], &der));
    }

    #[test]
    fn the_file_form_is_checked() {
        let raw = |kind: &str| RawSanMatch {
            kind: kind.into(),
            exact: Some("x".into()),
            ..Default::default()
        };
        assert_eq!(check(&[raw("dns"), raw("uri")], "p").unwrap().len(), 2);
        let error = check(&[raw("other_name")], "p").unwrap_err();
        assert!(error.to_string().contains("p[0].type"), "{error}");
        let none = RawSanMatch {
            kind: "dns".into(),
            ..Default::default()
        };
        assert!(check(&[none], "p").is_err());
        let empty = RawSanMatch {
            kind: "dns".into(),
            suffix: Some(String::new()),
            ..Default::default()
        };
        let error = check(&[empty], "p").unwrap_err();
        assert!(error.to_string().contains("p[0].suffix"), "{error}");
    }

    /// The names are checked only after the chain: a certificate with a matching name from
    /// another CA is refused, one from the CA is taken.
    #[test]
    fn a_matching_name_from_an_untrusted_ca_is_refused() {
        let issue = |ca_name: &str| {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("ca");
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, ca_name);
            let issuer = rcgen::CertifiedIssuer::self_signed(
                params,
                rcgen::KeyPair::generate().expect("key"),
            )
            .expect("ca");
            let key = rcgen::KeyPair::generate().expect("key");
            let leaf = rcgen::CertificateParams::new(vec!["backend.internal".to_string()])
                .expect("leaf")
                .signed_by(&key, &issuer)
                .expect("leaf");
            (issuer.der().clone(), leaf.der().clone())
        };
        let (trusted_ca, trusted_leaf) = issue("trusted");
        let (_, stranger_leaf) = issue("stranger");
        let mut roots = RootCertStore::empty();
        roots.add(trusted_ca).expect("root");
        let verifier = SanVerifier::new(
            roots,
            vec![dns(StringMatch::Exact("backend.internal".into()))],
            crate::tls::material::provider(),
        );
        let name = ServerName::try_from("not-checked.example").expect("name");
        let verify = |leaf: &CertificateDer<'_>| {
            verifier.verify_server_cert(leaf, &[], &name, &[], UnixTime::now())
        };
        assert!(verify(&trusted_leaf).is_ok());
        assert!(verify(&stranger_leaf).is_err());
    }
}
