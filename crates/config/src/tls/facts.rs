//! What a certificate says about itself, read from its DER: its names, serial number and
//! validity. For picking certificates by SNI (SDS) and for `/certs`.

use serde::Serialize;

/// One certificate's facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CertificateFacts {
    /// Hexadecimal, as Envoy's `/certs`.
    pub serial_number: String,
    pub subject: String,
    /// Its DNS names (lower case), or its common name when it has none (as Envoy matches).
    pub dns_names: Vec<String>,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

impl CertificateFacts {
    /// Whole days from `now` (Unix seconds) until it expires; negative once it has.
    pub fn days_until_expiration(&self, now: i64) -> i64 {
        (self.not_after - now).div_euclid(86_400)
    }
}

/// Reads `der`'s facts.
pub fn certificate_facts(der: &[u8]) -> Result<CertificateFacts, String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("cannot parse the certificate: {e}"))?;
    let mut names: Vec<String> = Vec::new();
    let san = cert
        .subject_alternative_name()
        .map_err(|e| format!("the certificate's subject alternative names: {e}"))?;
    if let Some(san) = san {
        for general in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(name) = general {
                names.push(name.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        names.extend(
            cert.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    Ok(CertificateFacts {
        serial_number: cert.raw_serial_as_string().replace(':', ""),
        subject: cert.subject().to_string(),
        dns_names: names,
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
    })
}
