//! Secrets read from files (Envoy's SDS `path_config_source`, as Envoy Gateway's bootstrap and
//! certificate agents write them): a file holding a discovery response in JSON or YAML with one
//! `Secret`, whose certificate, key or CA are inline or name files of their own.
//!
//! The files are read when a listener or cluster names the secret and again whenever their
//! contents change (the xDS side polls them); what the secret's own `filename`s hold is read
//! in with it, so a certificate replaced in place counts as a change. A file that cannot be
//! read or checked leaves the secret held before in force.

use base64::Engine as _;
use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use envoy_types::pb::google::protobuf::Any;
use serde::Deserialize;

use crate::envoy::{ResourceError, type_url};

/// Where a file's secrets are held: apart from the ADS stream's, so that no secret from the
/// management server can stand in for one read from a file.
const PREFIX: &str = "file://";

/// The key a file's secret is held (and counted) under: the file's path and the secret's name.
pub fn key(path: &str, name: &str) -> String {
    format!("{PREFIX}{path}#{name}")
}

/// The file and secret name of a key from [`key`]; `None` for a secret of the ADS stream.
pub fn source(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(PREFIX)?.rsplit_once('#')
}

/// Whether `name` is a file's secret (not one to ask the management server for).
pub fn is_file_secret(name: &str) -> bool {
    source(name).is_some()
}

/// The secret `key` names, read from its file (and the files it names) as a `Secret`
/// resource with its material inline: equal bytes, equal material.
pub fn read(key: &str) -> Result<Any, ResourceError> {
    let (path, name) =
        source(key).ok_or_else(|| ResourceError::invalid(key, "not a secret read from a file"))?;
    let at = format!("secret `{name}` in {path}");
    let text = String::from_utf8(
        read_limited(path)
            .map_err(|e| ResourceError::invalid(&at, format!("cannot be read: {e}")))?,
    )
    .map_err(|_| ResourceError::invalid(&at, "not UTF-8 text"))?;
    let response: FileResponse = if path.ends_with(".json") {
        serde_json::from_str(&text).map_err(|e| ResourceError::invalid(&at, e.to_string()))?
    } else if path.ends_with(".yaml") || path.ends_with(".yml") {
        serde_yaml::from_str(&text).map_err(|e| ResourceError::invalid(&at, e.to_string()))?
    } else {
        return Err(ResourceError::Unsupported {
            at,
            fields: vec!["a file other than .json, .yaml or .yml".into()],
        });
    };
    // As Envoy's: exactly the one secret asked for.
    let [secret] = <[FileSecret; 1]>::try_from(response.resources).map_err(|all| {
        ResourceError::invalid(&at, format!("expected one secret, found {}", all.len()))
    })?;
    if secret.type_url != type_url::SECRET {
        return Err(ResourceError::invalid(
            &at,
            format!(
                "expected a {}, found `{}`",
                type_url::SECRET,
                secret.type_url
            ),
        ));
    }
    if secret.name != name {
        return Err(ResourceError::invalid(
            &at,
            format!("the file holds secret `{}`", secret.name),
        ));
    }
    let data =
        |source: Option<FileData>, field: &str| -> Result<Option<DataSource>, ResourceError> {
            source
                .map(|s| s.inline(&format!("{at}.{field}")))
                .transpose()
        };
    let r#type = match (secret.tls_certificate, secret.validation_context) {
        (Some(cert), None) => secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: data(cert.certificate_chain, "tls_certificate.certificate_chain")?,
            private_key: data(cert.private_key, "tls_certificate.private_key")?,
            ..Default::default()
        }),
        (None, Some(validation)) => secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: data(validation.trusted_ca, "validation_context.trusted_ca")?,
            ..Default::default()
        }),
        _ => {
            return Err(ResourceError::invalid(
                &at,
                "expected a tls_certificate or a validation_context, one of them",
            ));
        }
    };
    let secret = Secret {
        name: key.to_owned(),
        r#type: Some(r#type),
    };
    Ok(Any {
        type_url: type_url::SECRET.to_owned(),
        value: prost::Message::encode_to_vec(&secret),
    })
}

/// The most a secret's file, or a file it names, may hold: certificates and keys are a few
/// KiB, bundles of CAs rarely 1 MiB.
const MAX_FILE: u64 = 4 << 20;

/// A regular file's bytes, up to [`MAX_FILE`]: the files are read again every second on the
/// xDS thread, which a pipe or a huge file must not hold up.
fn read_limited(path: &str) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    // Looked at before it is opened: opening a pipe would wait for a writer.
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    if meta.len() > MAX_FILE {
        return Err(std::io::Error::other(format!(
            "over {} MiB",
            MAX_FILE >> 20
        )));
    }
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(MAX_FILE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(std::io::Error::other("grew past the limit while read"));
    }
    Ok(bytes)
}

/// A discovery response as a file holds it. Field names as protobuf's JSON writes them, or
/// as the `.proto` spells them; any other field is refused by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileResponse {
    #[serde(default, alias = "versionInfo")]
    #[allow(dead_code)]
    version_info: Option<String>,
    #[serde(default, alias = "typeUrl")]
    #[allow(dead_code)]
    type_url: Option<String>,
    resources: Vec<FileSecret>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSecret {
    #[serde(rename = "@type")]
    type_url: String,
    name: String,
    #[serde(default, alias = "tlsCertificate")]
    tls_certificate: Option<FileCertificate>,
    #[serde(default, alias = "validationContext")]
    validation_context: Option<FileValidation>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileCertificate {
    #[serde(default, alias = "certificateChain")]
    certificate_chain: Option<FileData>,
    #[serde(default, alias = "privateKey")]
    private_key: Option<FileData>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileValidation {
    #[serde(default, alias = "trustedCa")]
    trusted_ca: Option<FileData>,
}

/// A `DataSource`: a file, or the bytes themselves.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileData {
    #[serde(default)]
    filename: Option<String>,
    #[serde(default, alias = "inlineString")]
    inline_string: Option<String>,
    /// Base64, as protobuf's JSON writes bytes.
    #[serde(default, alias = "inlineBytes")]
    inline_bytes: Option<String>,
}

impl FileData {
    /// The bytes, read from the file it names if it names one (a relative path is the
    /// process's working directory's, as Envoy reads it).
    fn inline(self, at: &str) -> Result<DataSource, ResourceError> {
        let bytes = match (self.filename, self.inline_string, self.inline_bytes) {
            (Some(file), None, None) => read_limited(&file)
                .map_err(|e| ResourceError::invalid(at, format!("{file} cannot be read: {e}")))?,
            (None, Some(text), None) => text.into_bytes(),
            (None, None, Some(base64)) => base64::engine::general_purpose::STANDARD
                .decode(base64.trim())
                .map_err(|e| ResourceError::invalid(at, format!("inline_bytes: {e}")))?,
            _ => {
                return Err(ResourceError::invalid(
                    at,
                    "expected one of filename, inline_string and inline_bytes",
                ));
            }
        };
        Ok(DataSource {
            specifier: Some(data_source::Specifier::InlineBytes(bytes)),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::sds::{SecretMaterial, XdsSecret};

    struct Dir(std::path::PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir() -> Dir {
        let path = std::env::temp_dir().join(format!(
            "legate-sds-file-{}-{}",
            std::process::id(),
            crate::envoy::digest(format!("{:?}", std::time::Instant::now()).as_bytes())
        ));
        std::fs::create_dir_all(&path).expect("dir");
        Dir(path)
    }

    #[test]
    fn a_json_secret_naming_its_files_is_read_with_their_contents() {
        let dir = dir();
        let pair = rcgen::generate_simple_self_signed(vec!["xds.example.com".to_string()])
            .expect("certificate");
        std::fs::write(dir.0.join("tls.crt"), pair.cert.pem()).expect("cert");
        std::fs::write(dir.0.join("tls.key"), pair.signing_key.serialize_pem()).expect("key");
        let file = dir.0.join("xds-certificate.json");
        std::fs::write(
            &file,
            format!(
                r#"{{"resources":[{{"@type":"{}","name":"xds_certificate","tls_certificate":{{"certificate_chain":{{"filename":"{}"}},"privateKey":{{"filename":"{}"}}}}}}]}}"#,
                type_url::SECRET,
                dir.0.join("tls.crt").display(),
                dir.0.join("tls.key").display()
            ),
        )
        .expect("json");
        let key = key(&file.display().to_string(), "xds_certificate");
        assert!(is_file_secret(&key));
        let any = read(&key).expect("read");
        let secret = XdsSecret::decode(&any).expect("checked");
        assert_eq!(secret.name, key);
        let SecretMaterial::Certificate { names, .. } = &secret.material else {
            panic!("a certificate");
        };
        assert_eq!(names, &["xds.example.com"]);

        // Another certificate in the same file name: other bytes.
        let other = rcgen::generate_simple_self_signed(vec!["b.example.com".to_string()])
            .expect("certificate");
        std::fs::write(dir.0.join("tls.crt"), other.cert.pem()).expect("cert");
        let changed = read(&key).expect("read again");
        assert_ne!(changed.value, any.value);
    }

    #[test]
    fn a_yaml_ca_is_read_and_bad_files_are_refused_by_what_is_wrong() {
        let dir = dir();
        let ca = rcgen::generate_simple_self_signed(vec!["ca".to_string()]).expect("ca");
        let file = dir.0.join("ca.yaml");
        let pem = ca.cert.pem().replace('\n', "\n          ");
        std::fs::write(
            &file,
            format!(
                "resources:\n  - \"@type\": {}\n    name: trusted\n    validation_context:\n      trusted_ca:\n        inline_string: |\n          {pem}\n",
                type_url::SECRET
            ),
        )
        .expect("yaml");
        let path = file.display().to_string();
        let secret = XdsSecret::decode(&read(&key(&path, "trusted")).expect("read")).expect("a CA");
        assert!(matches!(secret.material, SecretMaterial::Validation { .. }));

        let error = read(&key(&path, "other"))
            .expect_err("another name")
            .to_string();
        assert!(error.contains("holds secret `trusted`"), "{error}");
        std::fs::write(
            &file,
            format!(
                "resources:\n  - \"@type\": {}\n    name: trusted\n    validation_context:\n      match_subject_alt_names: []\n",
                type_url::SECRET
            ),
        )
        .expect("yaml");
        let error = read(&key(&path, "trusted"))
            .expect_err("a field not read")
            .to_string();
        assert!(error.contains("match_subject_alt_names"), "{error}");
        let error = read(&key(&format!("{path}.missing"), "trusted"))
            .expect_err("no file")
            .to_string();
        assert!(error.contains("cannot be read"), "{error}");
    }
}
