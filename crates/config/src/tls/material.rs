//! The TLS material a config names, loaded and checked: certificate chains, keys, CA bundles,
//! and the rustls configs built from them. Validation loads everything once to refuse a config
//! whose files are unusable (as a start would); the data plane builds its listeners' and
//! clusters' TLS with the same functions.
//!
//! The whole process uses one crypto provider, chosen at build time: aws-lc-rs by default
//! (about 20% more handshakes and AES-GCM throughput than ring on the machines we measure on,
//! and the post-quantum X25519MLKEM768 key exchange browsers offer), or ring with the `ring`
//! feature for targets where aws-lc's C build is a problem. Configs are always built with
//! this provider explicitly, never with a process default.

use std::sync::Arc;

use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;

use crate::tls::{
    ClientCertificateConfig, ClusterTlsConfig, ListenerTlsConfig, PemSource, TlsVersion,
};

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Pem {
        path: PemSource,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path}: no certificate in it")]
    NoCertificate { path: PemSource },
    #[error("{path}: unusable private key: {source}")]
    Key {
        path: PemSource,
        source: rustls::Error,
    },
    #[error("{key} does not hold the key of {cert}: {source}")]
    KeyMismatch {
        cert: PemSource,
        key: PemSource,
        source: rustls::Error,
    },
    #[error("{path}: unusable CA certificate: {reason}")]
    Ca { path: PemSource, reason: String },
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

/// The crypto provider every TLS config of the process is built with.
pub fn provider() -> Arc<CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    return Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return Arc::new(rustls::crypto::ring::default_provider());
}

pub fn versions(min: TlsVersion) -> &'static [&'static rustls::SupportedProtocolVersion] {
    static FROM_1_2: [&rustls::SupportedProtocolVersion; 2] =
        [&rustls::version::TLS13, &rustls::version::TLS12];
    static ONLY_1_3: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
    match min {
        TlsVersion::Tls12 => &FROM_1_2,
        TlsVersion::Tls13 => &ONLY_1_3,
    }
}

/// A PEM certificate chain, leaf first.
pub fn load_certs(path: &PemSource) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |source| TlsError::Pem {
        path: path.clone(),
        source,
    };
    let certs = match path {
        PemSource::File(file) => CertificateDer::pem_file_iter(file)
            .map_err(pem_error)?
            .collect::<Result<Vec<_>, _>>(),
        PemSource::Inline(text) => {
            CertificateDer::pem_slice_iter(text.as_bytes()).collect::<Result<Vec<_>, _>>()
        }
    }
    .map_err(pem_error)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate { path: path.clone() });
    }
    Ok(certs)
}

pub fn load_key(path: &PemSource) -> Result<PrivateKeyDer<'static>, TlsError> {
    match path {
        PemSource::File(file) => PrivateKeyDer::from_pem_file(file),
        PemSource::Inline(text) => PrivateKeyDer::from_pem_slice(text.as_bytes()),
    }
    .map_err(|source| TlsError::Pem {
        path: path.clone(),
        source,
    })
}

/// A chain and its key, checked to belong together.
pub fn certified_key(
    cert_path: &PemSource,
    key_path: &PemSource,
    provider: &CryptoProvider,
) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let certs = load_certs(cert_path)?;
    let key = load_key(key_path)?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::Key {
            path: key_path.clone(),
            source,
        })?;
    let certified = rustls::sign::CertifiedKey::new(certs, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(source) => Err(TlsError::KeyMismatch {
            cert: cert_path.clone(),
            key: key_path.clone(),
            source,
        }),
    }
}

/// The CA certificates of a PEM bundle.
pub fn load_roots(path: &PemSource) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::Ca {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}

/// The verifier of a listener's client certificates, over the roots of its CA bundle.
pub fn client_verifier(
    client: &ClientCertificateConfig,
    roots: rustls::RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(provider),
    );
    let verifier = if client.required {
        verifier
    } else {
        verifier.allow_unauthenticated()
    };
    verifier.build().map_err(|e| TlsError::Ca {
        path: client.ca.clone(),
        reason: e.to_string(),
    })
}

/// A cluster's rustls client config over `roots`, with its client certificate if it has one.
pub fn client_config(
    spec: &ClusterTlsConfig,
    roots: rustls::RootCertStore,
) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions(spec.min_version))?;
    let builder = if spec.subject_alt_names.is_empty() {
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(crate::tls::san::SanVerifier::new(
                roots,
                spec.subject_alt_names.clone(),
                provider,
            )))
    };
    Ok(match &spec.client_certificate {
        None => builder.with_no_client_auth(),
        Some(pair) => builder
            .with_client_auth_cert(load_certs(&pair.cert_chain)?, load_key(&pair.private_key)?)?,
    })
}

/// Loads everything a listener's TLS names, as a start would, and drops it: each certificate
/// with its key (checked to belong together) and the client CA with its verifier.
pub fn check_listener(spec: &ListenerTlsConfig) -> Result<(), TlsError> {
    let provider = provider();
    for cert in &spec.certificates {
        certified_key(&cert.cert_chain, &cert.private_key, &provider)?;
    }
    if let Some(client) = &spec.client_certificate {
        client_verifier(client, load_roots(&client.ca)?, &provider)?;
    }
    Ok(())
}

/// Loads the files a cluster's TLS names, as a start would (the system's roots are read at
/// start, not here).
pub fn check_cluster(spec: &ClusterTlsConfig) -> Result<(), TlsError> {
    let roots = match &spec.ca {
        Some(ca) => load_roots(ca)?,
        None => rustls::RootCertStore::empty(),
    };
    client_config(spec, roots).map(drop)
}
