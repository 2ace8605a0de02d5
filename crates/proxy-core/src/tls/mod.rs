//! TLS with rustls: termination on listeners ([`ServerTls`]) and origination to clusters
//! ([`UpstreamTls`]).
//!
//! The whole process uses one crypto provider, chosen at build time: aws-lc-rs by default
//! (about 20% more handshakes and AES-GCM throughput than ring on the machines we measure on,
//! and the post-quantum X25519MLKEM768 key exchange browsers offer), or ring with the `ring`
//! feature for targets where aws-lc's C build is a problem. Configs are always built with
//! this provider explicitly, never with a process default.

mod client;
mod server;
pub mod settings;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use settings::TlsVersion;

pub(crate) use client::{UpstreamIo, UpstreamTls};
pub(crate) use server::{Handshake, ServerTls, TlsListeners};

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Pem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{}: no certificate in the file", path.display())]
    NoCertificate { path: PathBuf },
    #[error("{}: unusable private key: {source}", path.display())]
    Key {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{} does not hold the key of {}: {source}", key.display(), cert.display())]
    KeyMismatch {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("{}: unusable CA certificate: {reason}", path.display())]
    Ca { path: PathBuf, reason: String },
    #[error("{0}")]
    Rustls(#[from] rustls::Error),
}

/// The crypto provider every TLS config of the process is built with.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    return Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return Arc::new(rustls::crypto::ring::default_provider());
}

/// Session-ticket encryption with keys that rotate (every 6 hours), from the provider.
fn ticketer() -> Result<Arc<dyn rustls::server::ProducesTickets>, rustls::Error> {
    #[cfg(feature = "aws-lc-rs")]
    return rustls::crypto::aws_lc_rs::Ticketer::new();
    #[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
    return rustls::crypto::ring::Ticketer::new();
}

fn versions(min: TlsVersion) -> &'static [&'static rustls::SupportedProtocolVersion] {
    static FROM_1_2: [&rustls::SupportedProtocolVersion; 2] =
        [&rustls::version::TLS13, &rustls::version::TLS12];
    static ONLY_1_3: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
    match min {
        TlsVersion::Tls12 => &FROM_1_2,
        TlsVersion::Tls13 => &ONLY_1_3,
    }
}

/// A PEM certificate chain, leaf first.
fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |source| TlsError::Pem {
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_owned(),
        });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        path: path.to_owned(),
        source,
    })
}

/// A chain and its key, checked to belong together.
fn certified_key(
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<rustls::sign::CertifiedKey, TlsError> {
    let certs = load_certs(cert_path)?;
    let key = load_key(key_path)?;
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|source| TlsError::Key {
            path: key_path.to_owned(),
            source,
        })?;
    let certified = rustls::sign::CertifiedKey::new(certs, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(source) => Err(TlsError::KeyMismatch {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
            source,
        }),
    }
}

/// The CA certificates of a PEM bundle.
fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(path)? {
        roots.add(cert).map_err(|e| TlsError::Ca {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
    }
    Ok(roots)
}
