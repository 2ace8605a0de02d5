//! Test certificates: a certificate authority of the test's own and the leaves it signs.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::ScratchDir;

/// A test certificate authority.
pub struct Ca {
    pub issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and key, as PEM and as the DER a client sees.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    pub fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        roots
    }

    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.issue(names, false)
    }

    pub fn issue(&self, names: &[&str], expired: bool) -> Leaf {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

impl Leaf {
    /// Writes `NAME.pem` and `NAME.key`; returns their paths as YAML-ready strings.
    pub fn write(&self, dir: &ScratchDir, name: &str) -> (String, String) {
        let cert = dir.write(&format!("{name}.pem"), &self.cert_pem);
        let key = dir.write(&format!("{name}.key"), &self.key_pem);
        (cert.display().to_string(), key.display().to_string())
    }

    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        use rustls::pki_types::pem::PemObject;
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap()
    }
}
