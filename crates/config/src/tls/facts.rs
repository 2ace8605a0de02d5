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

/// What `x-forwarded-client-cert` says of a certificate: its subject (RFC 2253), and its URI
/// and DNS names in the order it lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertificateNames {
    pub subject: String,
    pub uris: Vec<String>,
    pub dns_names: Vec<String>,
}

/// Reads `der`'s names.
pub fn certificate_names(der: &[u8]) -> Result<CertificateNames, String> {
    use x509_parser::extensions::GeneralName;
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| format!("cannot parse the certificate: {e}"))?;
    let mut names = CertificateNames {
        subject: rfc2253(cert.subject()),
        ..Default::default()
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for general in &san.value.general_names {
            match general {
                GeneralName::URI(uri) => names.uris.push((*uri).to_owned()),
                GeneralName::DNSName(dns) => names.dns_names.push((*dns).to_owned()),
                _ => {}
            }
        }
    }
    Ok(names)
}

/// A distinguished name as RFC 2253 writes it (as OpenSSL's `XN_FLAG_RFC2253`): the last
/// relative name first, `,` between them and `+` within one, specials escaped.
fn rfc2253(name: &x509_parser::x509::X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let mut rdns: Vec<String> = name
        .iter()
        .map(|rdn| {
            rdn.iter()
                .map(|attr| {
                    let key = short_name(attr.attr_type())
                        .map(str::to_owned)
                        .or_else(|| {
                            x509_parser::objects::oid2abbrev(attr.attr_type(), registry)
                                .ok()
                                .map(str::to_owned)
                        })
                        .unwrap_or_else(|| attr.attr_type().to_id_string());
                    let value = attr.as_str().map(escape_rfc2253).unwrap_or_else(|_| {
                        // Not a string: `#` and the value's DER in hex, as RFC 2253 says.
                        let hex: String = attr
                            .attr_value()
                            .data
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect();
                        format!("#{hex}")
                    });
                    format!("{key}={value}")
                })
                .collect::<Vec<_>>()
                .join("+")
        })
        .collect();
    rdns.reverse();
    rdns.join(",")
}

fn escape_rfc2253(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let bytes = value.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let special = matches!(b, b',' | b'+' | b'"' | b'\\' | b'<' | b'>' | b';')
            || (i == 0 && (b == b'#' || b == b' '))
            || (i + 1 == bytes.len() && b == b' ');
        if !(0x20..0x7f).contains(&b) {
            // Control and non-ASCII bytes as `\XX`, as OpenSSL writes them.
            out.push_str(&format!("\\{b:02X}"));
        } else {
            if special {
                out.push('\\');
            }
            out.push(char::from(b));
        }
    }
    out
}

/// OpenSSL's short names where the registry's differ.
fn short_name(oid: &x509_parser::der_parser::oid::Oid<'_>) -> Option<&'static str> {
    Some(match oid.to_id_string().as_str() {
        "1.2.840.113549.1.9.1" => "emailAddress",
        "0.9.2342.19200300.100.1.1" => "UID",
        "0.9.2342.19200300.100.1.25" => "DC",
        "2.5.4.4" => "SN",
        "2.5.4.42" => "GN",
        "2.5.4.5" => "serialNumber",
        _ => return None,
    })
}

#[cfg(test)]
mod names_tests {
    use super::*;

    #[test]
    fn names_are_read_with_the_subject_as_rfc_2253() {
        let mut params = rcgen::CertificateParams::new(vec![
            "a.example.com".to_string(),
            "b.example.com".to_string(),
        ])
        .expect("params");
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://cluster.local/ns/a/sa/b".try_into().unwrap(),
        ));
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::OrganizationName, "Acme, Inc");
        dn.push(rcgen::DnType::CommonName, "cli\u{7}ent \u{e9}");
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let names = certificate_names(cert.der()).expect("names");
        // Escaped as OpenSSL's RFC 2253: specials with `\`, control and non-ASCII bytes as
        // `\XX`.
        assert_eq!(names.subject, "CN=cli\\07ent \\C3\\A9,O=Acme\\, Inc");
        assert_eq!(names.uris, ["spiffe://cluster.local/ns/a/sa/b"]);
        assert_eq!(names.dns_names, ["a.example.com", "b.example.com"]);
    }
}
