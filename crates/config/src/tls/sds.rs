//! SDS (Envoy's secret discovery service): certificates and CA bundles that listeners and
//! clusters name instead of carrying, sent over the same ADS stream.
//!
//! A `Secret` is decoded and its material loaded and checked when it arrives (a chain with a
//! key that is not its own, a CA bundle without a certificate: NACKed, the secret held before
//! stays). A listener or cluster that names secrets keeps their names ([`SecretRefs`]) and is
//! left out (warming) until every one has arrived; it is then written as the config file
//! would, with the PEM in place of paths. A secret that changes is a new config whose TLS
//! serves new handshakes; the connections already open are kept (inline PEM is not part of
//! what a connection is served with).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    SdsSecretConfig, Secret, secret,
};
use envoy_types::pb::google::protobuf::Any;
use serde::Serialize;

use crate::envoy::{Held, ResourceError, decode, fields, nothing_else, type_url};
use crate::tls::PemSource;
use crate::tls::material::{self, TlsError};
use crate::{RawCertificate, RawClientCertificate, RawClusterTls, RawKeyPair, RawListenerTls};

/// The secrets accepted, by name.
pub type Secrets = BTreeMap<String, Held<XdsSecret>>;

/// A secret from the management server, its material checked.
#[derive(Debug, Clone)]
pub struct XdsSecret {
    pub name: String,
    pub material: SecretMaterial,
}

#[derive(Debug, Clone)]
pub enum SecretMaterial {
    /// A certificate chain and its key (`tls_certificate`).
    Certificate {
        /// A path, or PEM text.
        cert_chain: String,
        private_key: String,
        /// The DNS names of its leaf (subject alternative names, else the common name): what
        /// a listener with several certificates serves it for.
        names: Vec<String>,
        /// When its leaf expires, in seconds since the Unix epoch.
        not_after: i64,
    },
    /// A CA bundle that peers' certificates must chain to (`validation_context`).
    Validation { trusted_ca: String },
}

/// What `/config_dump` shows of a secret: never the material itself.
#[derive(Debug, Clone, Serialize)]
pub struct SecretSummary {
    pub name: String,
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_after_unix: Option<i64>,
}

impl XdsSecret {
    /// The name of the secret in `value`, without checking the rest (to count an update of
    /// a secret that is then refused).
    pub fn name_of(value: &Any) -> Option<String> {
        decode::<Secret>(value, type_url::SECRET, "a Secret")
            .ok()
            .map(|s| s.name)
    }

    pub fn decode(value: &Any) -> Result<Self, ResourceError> {
        let mut secret: Secret = decode(value, type_url::SECRET, "a Secret")?;
        let name = std::mem::take(&mut secret.name);
        let at = format!("secret `{name}`");
        let material = match secret.r#type.take() {
            Some(secret::Type::TlsCertificate(mut cert)) => {
                let cert_chain = super::xds::pem_or_path(
                    cert.certificate_chain.take(),
                    &format!("{at}.tls_certificate.certificate_chain"),
                )?;
                let private_key = super::xds::pem_or_path(
                    cert.private_key.take(),
                    &format!("{at}.tls_certificate.private_key"),
                )?;
                nothing_else(
                    &cert,
                    fields::TLS_CERTIFICATE,
                    &format!("{at}.tls_certificate"),
                )?;
                let invalid = |e: TlsError| ResourceError::invalid(&at, e.to_string());
                let key = material::certified_key(
                    &pem_source(&cert_chain),
                    &pem_source(&private_key),
                    &material::provider(),
                )
                .map_err(invalid)?;
                let leaf = key.end_entity_cert().map_err(|e| invalid(e.into()))?;
                let (names, not_after) =
                    leaf_facts(leaf).map_err(|reason| ResourceError::invalid(&at, reason))?;
                SecretMaterial::Certificate {
                    cert_chain,
                    private_key,
                    names,
                    not_after,
                }
            }
            Some(secret::Type::ValidationContext(mut v)) => {
                let at = format!("{at}.validation_context");
                let trusted_ca =
                    super::xds::pem_or_path(v.trusted_ca.take(), &format!("{at}.trusted_ca"))?;
                nothing_else(&v, fields::CERTIFICATE_VALIDATION_CONTEXT, &at)?;
                material::load_roots(&pem_source(&trusted_ca))
                    .map_err(|e| ResourceError::invalid(&at, e.to_string()))?;
                SecretMaterial::Validation { trusted_ca }
            }
            Some(secret::Type::SessionTicketKeys(_)) => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![
                        "session_ticket_keys (tickets are keyed by each proxy, rotating)".into(),
                    ],
                });
            }
            Some(secret::Type::GenericSecret(_)) => {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec!["generic_secret".into()],
                });
            }
            None => {
                return Err(ResourceError::invalid(
                    at,
                    "expected a tls_certificate or a validation_context",
                ));
            }
        };
        Ok(XdsSecret { name, material })
    }

    pub fn summary(&self) -> SecretSummary {
        match &self.material {
            SecretMaterial::Certificate {
                names, not_after, ..
            } => SecretSummary {
                name: self.name.clone(),
                kind: "tls_certificate",
                names: names.clone(),
                not_after_unix: Some(*not_after),
            },
            SecretMaterial::Validation { .. } => SecretSummary {
                name: self.name.clone(),
                kind: "validation_context",
                names: Vec::new(),
                not_after_unix: None,
            },
        }
    }
}

/// A path, or PEM text (which starts with `-----BEGIN`), as the file's `tls` takes either.
fn pem_source(value: &str) -> PemSource {
    if value.starts_with("-----BEGIN ") {
        PemSource::Inline(value.into())
    } else {
        PemSource::File(value.into())
    }
}

/// The DNS names and the expiry of a leaf certificate.
fn leaf_facts(der: &[u8]) -> Result<(Vec<String>, i64), String> {
    let mut facts = super::facts::certificate_facts(der)?;
    facts.dns_names.retain(|n| super::is_host_name(n));
    Ok((facts.dns_names, facts.not_after))
}

/// The secrets a listener's or cluster's TLS names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretRefs {
    /// `tls_certificate_sds_secret_configs`, in order.
    pub certificates: Vec<String>,
    /// `validation_context_sds_secret_config` (alone or in a combined validation context).
    pub validation: Option<String>,
    /// A listener's `require_client_certificate`, applied with its validation secret.
    pub client_certificate_required: Option<bool>,
}

impl SecretRefs {
    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty() && self.validation.is_none()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.certificates
            .iter()
            .chain(&self.validation)
            .map(String::as_str)
    }

    /// Whether every secret named has arrived, each of the kind it is named for.
    pub fn ready(&self, secrets: &Secrets) -> bool {
        self.certificates
            .iter()
            .all(|n| certificate(secrets, n).is_some())
            && self
                .validation
                .as_ref()
                .is_none_or(|n| validation(secrets, n).is_some())
    }

    /// A listener's TLS with its secrets' material in place; `None` while one is missing.
    pub(crate) fn fill_listener(&self, tls: &mut RawListenerTls, secrets: &Secrets) -> Option<()> {
        // Several certificates are picked by SNI against their names, the first for a name
        // none has (Envoy's selection). A name two have is the first one's; a certificate
        // left with no name of its own could only be picked by key type, which is not done
        // here: it is not served.
        let mut taken = std::collections::HashSet::new();
        for (i, name) in self.certificates.iter().enumerate() {
            let (cert_chain, private_key, names) = certificate(secrets, name)?;
            let own: Vec<String> = (names.iter())
                .filter(|n| taken.insert(n.as_str()))
                .cloned()
                .collect();
            if i > 0 && own.is_empty() {
                continue;
            }
            tls.certificates.push(RawCertificate {
                cert_chain: cert_chain.to_owned(),
                private_key: private_key.to_owned(),
                server_names: own,
            });
        }
        // One certificate serves every name.
        if tls.certificates.len() == 1 {
            tls.certificates[0].server_names.clear();
        }
        if let Some(name) = &self.validation {
            tls.client_certificate = Some(RawClientCertificate {
                ca: validation(secrets, name)?.to_owned(),
                required: self.client_certificate_required.or(Some(false)),
            });
        }
        Some(())
    }

    /// A cluster's TLS with its secrets' material in place; `None` while one is missing.
    pub(crate) fn fill_cluster(&self, tls: &mut RawClusterTls, secrets: &Secrets) -> Option<()> {
        if let Some(name) = self.certificates.first() {
            let (cert_chain, private_key, _) = certificate(secrets, name)?;
            tls.client_certificate = Some(RawKeyPair {
                cert_chain: cert_chain.to_owned(),
                private_key: private_key.to_owned(),
            });
        }
        if let Some(name) = &self.validation {
            tls.ca = Some(validation(secrets, name)?.to_owned());
        }
        Some(())
    }
}

fn certificate<'a>(secrets: &'a Secrets, name: &str) -> Option<(&'a str, &'a str, &'a [String])> {
    match &secrets.get(name)?.value.material {
        SecretMaterial::Certificate {
            cert_chain,
            private_key,
            names,
            ..
        } => Some((cert_chain, private_key, names)),
        SecretMaterial::Validation { .. } => None,
    }
}

fn validation<'a>(secrets: &'a Secrets, name: &str) -> Option<&'a str> {
    match &secrets.get(name)?.value.material {
        SecretMaterial::Validation { trusted_ca } => Some(trusted_ca),
        SecretMaterial::Certificate { .. } => None,
    }
}

/// A secret named by a TLS context: its name, from the same ADS stream; or, read from a
/// file (`path_config_source`), its key ([`super::sds_file::key`]).
pub(crate) fn secret_name(mut config: SdsSecretConfig, at: &str) -> Result<String, ResourceError> {
    if config.name.is_empty() {
        return Err(ResourceError::invalid(at, "expected a secret name"));
    }
    #[allow(deprecated)]
    match config
        .sds_config
        .take()
        .and_then(|s| s.config_source_specifier)
    {
        // Such a name is held for a file's secret: the server's could never take its place.
        Some(ConfigSourceSpecifier::Ads(_) | ConfigSourceSpecifier::Self_(_))
            if super::sds_file::is_file_secret(&config.name) =>
        {
            Err(ResourceError::invalid(
                format!("{at}.name"),
                "a name of the form of a secret read from a file (`file://PATH#NAME`)",
            ))
        }
        Some(ConfigSourceSpecifier::Ads(_) | ConfigSourceSpecifier::Self_(_)) => Ok(config.name),
        // Its key joins the path and the name with `#`.
        Some(ConfigSourceSpecifier::PathConfigSource(_) | ConfigSourceSpecifier::Path(_))
            if config.name.contains('#') =>
        {
            Err(ResourceError::invalid(
                format!("{at}.name"),
                "a secret read from a file with `#` in its name",
            ))
        }
        // The file is polled for changes, which covers a watched directory's renames too.
        Some(ConfigSourceSpecifier::PathConfigSource(source)) if !source.path.is_empty() => {
            Ok(super::sds_file::key(&source.path, &config.name))
        }
        Some(ConfigSourceSpecifier::Path(path)) if !path.is_empty() => {
            Ok(super::sds_file::key(&path, &config.name))
        }
        Some(ConfigSourceSpecifier::PathConfigSource(_) | ConfigSourceSpecifier::Path(_)) => Err(
            ResourceError::invalid(format!("{at}.sds_config"), "expected a path"),
        ),
        Some(_) => Err(ResourceError::Unsupported {
            at: format!("{at}.sds_config"),
            fields: vec![
                "config_source_specifier (ads or path_config_source: secrets come over the \
                 ADS stream or from files)"
                    .into(),
            ],
        }),
        None => Err(ResourceError::Unsupported {
            at: at.to_owned(),
            fields: vec!["a secret without sds_config (static secrets)".into()],
        }),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        CertificateValidationContext, TlsCertificate, TlsSessionTicketKeys,
    };
    use prost::Name;

    use super::*;

    fn inline(text: &str) -> Option<DataSource> {
        Some(DataSource {
            specifier: Some(data_source::Specifier::InlineString(text.into())),
            ..Default::default()
        })
    }

    fn pack(secret: &Secret) -> Any {
        Any {
            type_url: Secret::type_url(),
            value: prost::Message::encode_to_vec(secret),
        }
    }

    fn certificate(name: &str, chain: &str, key: &str) -> Any {
        pack(&Secret {
            name: name.into(),
            r#type: Some(secret::Type::TlsCertificate(TlsCertificate {
                certificate_chain: inline(chain),
                private_key: inline(key),
                ..Default::default()
            })),
        })
    }

    #[test]
    fn a_certificate_secret_is_checked_and_known_by_its_leafs_names() {
        let pair = rcgen::generate_simple_self_signed(vec![
            "API.example.com".to_string(),
            "*.example.com".to_string(),
            "127.0.0.1".to_string(),
        ])
        .expect("certificate");
        let (chain, key) = (pair.cert.pem(), pair.signing_key.serialize_pem());
        let secret = XdsSecret::decode(&certificate("edge", &chain, &key)).expect("valid");
        let SecretMaterial::Certificate {
            names, not_after, ..
        } = &secret.material
        else {
            panic!("a certificate: {secret:?}");
        };
        assert_eq!(names, &["api.example.com", "*.example.com"]);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs() as i64;
        assert!(*not_after > now, "rcgen's certificates are valid for years");

        let other = rcgen::generate_simple_self_signed(vec!["other".to_string()]).expect("other");
        let error = XdsSecret::decode(&certificate(
            "edge",
            &chain,
            &other.signing_key.serialize_pem(),
        ))
        .expect_err("a key of another certificate")
        .to_string();
        assert!(
            error.starts_with("secret `edge`") && error.contains("does not hold the key"),
            "{error}"
        );
        let error = XdsSecret::decode(&certificate("edge", "cert-data", "key-data"))
            .expect_err("no PEM")
            .to_string();
        assert!(error.contains("without a PEM block"), "{error}");
    }

    #[test]
    fn a_validation_secret_needs_a_ca_and_ticket_keys_are_refused() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca".to_string()]).expect("ca");
        let validation = |pem: &str, spki: Vec<String>| {
            pack(&Secret {
                name: "ca".into(),
                r#type: Some(secret::Type::ValidationContext(
                    CertificateValidationContext {
                        trusted_ca: inline(pem),
                        verify_certificate_spki: spki,
                        ..Default::default()
                    },
                )),
            })
        };
        let secret = XdsSecret::decode(&validation(&ca.cert.pem(), vec![])).expect("a CA");
        assert_eq!(secret.summary().kind, "validation_context");
        let error = XdsSecret::decode(&validation(&ca.cert.pem(), vec!["x".into()]))
            .expect_err("SPKI pins are not checked")
            .to_string();
        assert!(error.contains("verify_certificate_spki"), "{error}");
        let tickets = pack(&Secret {
            name: "keys".into(),
            r#type: Some(secret::Type::SessionTicketKeys(
                TlsSessionTicketKeys::default(),
            )),
        });
        let error = XdsSecret::decode(&tickets)
            .expect_err("refused")
            .to_string();
        assert!(error.contains("session_ticket_keys"), "{error}");
    }
}
