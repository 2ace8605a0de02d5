//! `x-forwarded-client-cert` (Envoy's XFCC): removed from a request unless the listener says
//! otherwise; over mutual TLS, passed on, or given the client certificate's element
//! (`By=...;Hash=...;Cert="...";Chain="...";Subject="...";URI=...;DNS=...`), made once per
//! connection.

use http::{HeaderMap, HeaderName, HeaderValue};
use rustls::pki_types::CertificateDer;
use sha2::Digest;

use crate::context::ClientCertificate;
use config::listener::client_cert::{ClientCertDetails, ForwardClientCert};

pub(crate) static X_FORWARDED_CLIENT_CERT: HeaderName =
    HeaderName::from_static("x-forwarded-client-cert");

/// The client's certificate, when it presented one. Its chain, and the proxy's own leaf served
/// on the connection, are kept only when `keep` (the listener writes an element): a reload
/// that starts writing one applies to connections made after it.
pub(crate) fn of_connection(
    peer: Option<&[CertificateDer<'_>]>,
    local: impl FnOnce() -> Option<CertificateDer<'static>>,
    keep: bool,
) -> Option<Box<ClientCertificate>> {
    let chain = peer.filter(|chain| !chain.is_empty())?;
    let leaf = chain.first()?.clone().into_owned();
    let (chain, local) = match keep {
        true => (
            chain.iter().map(|c| c.clone().into_owned()).collect(),
            local(),
        ),
        false => (Vec::new(), None),
    };
    Some(Box::new(ClientCertificate {
        leaf,
        names: std::cell::OnceCell::new(),
        chain,
        local,
        element: std::cell::RefCell::new(None),
    }))
}

/// The certificate's header element with `details`, made once per connection (again only if
/// the details change); `None` when its chain was not kept.
fn element_of(cert: &ClientCertificate, details: ClientCertDetails) -> Option<HeaderValue> {
    if let Some((made_with, element)) = &*cert.element.borrow()
        && *made_with == details
    {
        return Some(element.clone());
    }
    let text = element(&cert.chain, cert.local.as_ref(), details)?;
    // Each part is header text by construction (see `element`); should the whole still not
    // be, the hash alone stands.
    let value = HeaderValue::from_str(&text).or_else(|_| {
        let hash = text.split(';').find(|p| p.starts_with("Hash="));
        HeaderValue::from_str(hash.unwrap_or_default())
    });
    let value = value.ok().filter(|v| !v.is_empty())?;
    *cert.element.borrow_mut() = Some((details, value.clone()));
    Some(value)
}

/// The element, in Envoy's order: `By` (each URI name of the proxy's certificate), `Hash`
/// (SHA-256 of the client's certificate, hex), then the details asked for. A name that is
/// not header text (a control character) is left out. `None` without a chain.
fn element(
    chain: &[CertificateDer<'_>],
    local: Option<&CertificateDer<'_>>,
    details: ClientCertDetails,
) -> Option<String> {
    let leaf = chain.first()?;
    let mut parts: Vec<String> = Vec::new();
    let names = |der: &[u8]| config::tls::facts::certificate_names(der).unwrap_or_default();
    let text = |s: &str| !s.bytes().any(|b| b < 0x20 || b == 0x7f);
    if let Some(local) = local {
        let uris = names(local).uris;
        parts.extend(
            uris.iter()
                .filter(|u| text(u))
                .map(|uri| format!("By={uri}")),
        );
    }
    let hash: String = sha2::Sha256::digest(leaf.as_ref())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    parts.push(format!("Hash={hash}"));
    if details.cert {
        parts.push(format!(
            "Cert=\"{}\"",
            url_encoded_pem(std::slice::from_ref(leaf))
        ));
    }
    if details.chain {
        parts.push(format!("Chain=\"{}\"", url_encoded_pem(chain)));
    }
    let peer = names(leaf.as_ref());
    if details.subject {
        // Present even when the subject is empty, as Envoy's; escaped as RFC 2253 text.
        parts.push(format!("Subject=\"{}\"", peer.subject));
    }
    if details.uri {
        let uris: Vec<&String> = peer.uris.iter().filter(|u| text(u)).collect();
        if uris.is_empty() {
            // Present even without a URI name, as Envoy's.
            parts.push("URI=".to_owned());
        }
        parts.extend(uris.iter().map(|uri| format!("URI={uri}")));
    }
    if details.dns {
        let dns = peer.dns_names.iter().filter(|d| text(d));
        parts.extend(dns.map(|dns| format!("DNS={dns}")));
    }
    Some(parts.join(";"))
}

/// Certificates as PEM (64 base64 characters a line), with the characters Envoy encodes
/// (newline, space, `+`, `/`, `=`) percent-encoded.
fn url_encoded_pem(certs: &[CertificateDer<'_>]) -> String {
    use base64::Engine;
    let mut pem = String::new();
    for cert in certs {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    let mut out = String::with_capacity(pem.len() * 11 / 10);
    for c in pem.chars() {
        match c {
            '\n' => out.push_str("%0A"),
            ' ' => out.push_str("%20"),
            '+' => out.push_str("%2B"),
            '/' => out.push_str("%2F"),
            '=' => out.push_str("%3D"),
            c => out.push(c),
        }
    }
    out
}

/// Sets a request's header as `mode` says, for a connection with `client_cert`.
pub(crate) fn apply(
    headers: &mut HeaderMap,
    mode: ForwardClientCert,
    details: ClientCertDetails,
    client_cert: Option<&ClientCertificate>,
) {
    let element = match (mode, client_cert) {
        (ForwardClientCert::AlwaysForwardOnly, _) => return,
        (ForwardClientCert::Sanitize, _) | (_, None) => {
            // Seldom sent: a pass over the few names costs less than hashing this long one
            // for a removal (211 instructions), on every request.
            if headers.keys().any(|name| *name == X_FORWARDED_CLIENT_CERT) {
                headers.remove(&X_FORWARDED_CLIENT_CERT);
            }
            return;
        }
        (ForwardClientCert::ForwardOnly, Some(_)) => return,
        (_, Some(cert)) => match element_of(cert, details) {
            Some(element) => element,
            // Nothing to say of it: the client's header does not stand in.
            None => {
                headers.remove(&X_FORWARDED_CLIENT_CERT);
                return;
            }
        },
    };
    set(headers, mode, element);
}

/// Writes our element: in place of the client's, or after its values.
fn set(headers: &mut HeaderMap, mode: ForwardClientCert, element: HeaderValue) {
    if mode != ForwardClientCert::AppendForward {
        headers.insert(X_FORWARDED_CLIENT_CERT.clone(), element);
        return;
    }
    // The client's values, however many lines, then ours, as one list.
    let mut joined: Vec<u8> = Vec::new();
    for value in headers.get_all(&X_FORWARDED_CLIENT_CERT) {
        if !value.is_empty() {
            joined.extend_from_slice(value.as_bytes());
            joined.push(b',');
        }
    }
    joined.extend_from_slice(element.as_bytes());
    if let Ok(value) = HeaderValue::from_bytes(&joined) {
        headers.insert(X_FORWARDED_CLIENT_CERT.clone(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(values: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for v in values {
            map.append(
                X_FORWARDED_CLIENT_CERT.clone(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn xfcc(map: &HeaderMap) -> Vec<&str> {
        map.get_all(&X_FORWARDED_CLIENT_CERT)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    }

    #[test]
    fn each_mode_with_and_without_a_client_certificate() {
        use ForwardClientCert::*;
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["c".to_string()]).expect("params");
        let der = params.self_signed(&key).expect("cert").der().clone();
        let cert = of_connection(Some(&[der]), || None, true).unwrap();
        let ours = element_of(&cert, ClientCertDetails::default()).unwrap();
        let ours = ours.to_str().unwrap();
        assert!(ours.starts_with("Hash="), "{ours}");
        let appended = format!("By=x,Hash=cd,{ours}");
        let cases: [(ForwardClientCert, bool, Vec<&str>); 10] = [
            (Sanitize, true, vec![]),
            (Sanitize, false, vec![]),
            (ForwardOnly, true, vec!["By=x", "Hash=cd"]),
            (ForwardOnly, false, vec![]),
            (AppendForward, true, vec![appended.as_str()]),
            (AppendForward, false, vec![]),
            (SanitizeSet, true, vec![ours]),
            (SanitizeSet, false, vec![]),
            (AlwaysForwardOnly, true, vec!["By=x", "Hash=cd"]),
            (AlwaysForwardOnly, false, vec!["By=x", "Hash=cd"]),
        ];
        for (mode, mtls, expected) in cases {
            let mut map = headers(&["By=x", "Hash=cd"]);
            let client = mtls.then_some(&*cert);
            apply(&mut map, mode, ClientCertDetails::default(), client);
            assert_eq!(xfcc(&map), expected, "{mode:?} {mtls}");
        }
        // Appended to nothing: ours alone.
        let mut map = HeaderMap::new();
        apply(
            &mut map,
            AppendForward,
            ClientCertDetails::default(),
            Some(&cert),
        );
        assert_eq!(xfcc(&map), [ours]);
        // Other details make another element.
        let subject = ClientCertDetails {
            subject: true,
            ..Default::default()
        };
        let mut map = HeaderMap::new();
        apply(&mut map, SanitizeSet, subject, Some(&cert));
        assert_eq!(
            xfcc(&map),
            [format!("{ours};Subject=\"CN=rcgen self signed cert\"")]
        );
        // An empty value of the client's is no element of the list.
        let mut map = headers(&[""]);
        apply(
            &mut map,
            AppendForward,
            ClientCertDetails::default(),
            Some(&cert),
        );
        assert_eq!(xfcc(&map), [ours]);
        // A chain not kept (the listener wrote no element when the client came): the
        // client's header is removed rather than passed on.
        let unkept = of_connection(Some(&[cert.chain[0].clone()]), || None, false).unwrap();
        let mut map = headers(&["Hash=forged"]);
        apply(
            &mut map,
            SanitizeSet,
            ClientCertDetails::default(),
            Some(&unkept),
        );
        assert!(xfcc(&map).is_empty());
        // No client certificate: nothing to say.
        assert!(of_connection(Some(&[]), || None, true).is_none());
        assert!(of_connection(None, || None, true).is_none());
    }

    #[test]
    fn the_element_has_envoy_s_parts_in_envoy_s_order() {
        let mut params =
            rcgen::CertificateParams::new(vec!["client.example.com".to_string()]).expect("params");
        params.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://edge/client".try_into().unwrap(),
        ));
        let mut dn = rcgen::DistinguishedName::new();
        dn.push(rcgen::DnType::CommonName, "client");
        params.distinguished_name = dn;
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let leaf = cert.der().clone();
        let mut local = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        local.subject_alt_names.push(rcgen::SanType::URI(
            "spiffe://edge/proxy".try_into().unwrap(),
        ));
        let local = local.self_signed(&key).expect("cert").der().clone();
        let all = ClientCertDetails {
            cert: true,
            chain: true,
            subject: true,
            uri: true,
            dns: true,
        };
        let text = element(std::slice::from_ref(&leaf), Some(&local), all).unwrap();
        let keys: Vec<&str> = text
            .split(';')
            .map(|part| part.split_once('=').unwrap().0)
            .collect();
        assert_eq!(
            keys,
            ["By", "Hash", "Cert", "Chain", "Subject", "URI", "DNS"]
        );
        assert!(text.starts_with("By=spiffe://edge/proxy;Hash="), "{text}");
        assert!(
            text.contains("Cert=\"-----BEGIN%20CERTIFICATE-----%0A"),
            "{text}"
        );
        assert!(
            text.ends_with(
                ";Subject=\"CN=client\";URI=spiffe://edge/client;DNS=client.example.com"
            ),
            "{text}"
        );
        let hash = text.split(';').nth(1).unwrap().trim_start_matches("Hash=");
        assert_eq!(hash.len(), 64);
        // The PEM decodes back to the certificate.
        let cert_part = text.split(';').nth(2).unwrap();
        let pem = cert_part
            .trim_start_matches("Cert=\"")
            .trim_end_matches('"')
            .replace("%0A", "\n")
            .replace("%20", " ")
            .replace("%2B", "+")
            .replace("%2F", "/")
            .replace("%3D", "=");
        use rustls::pki_types::pem::PemObject;
        let parsed = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes());
        assert_eq!(parsed.unwrap(), leaf);
        // Nothing asked for: the hash alone (no local URI name either).
        assert_eq!(
            element(&[leaf], None, ClientCertDetails::default()),
            Some(format!("Hash={hash}"))
        );
    }
}
