//! A QUIC-only listener's filter chains. QUIC takes one TLS server config per connection,
//! before anything of the client is known: here its certificate is the one of the chain the
//! client's SNI picks, and once the handshake is done the connection is served by that chain
//! (picked again, with its addresses, by the same rules: config refuses QUIC chains picked by
//! address, so the two picks agree).

use std::net::SocketAddr;
use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::chains::{ChainSelector, Shown};
use super::client_hello::Hello;

/// What a QUIC connection's handshake shows a chain: TLS, its SNI, and `h3`, the only
/// protocol offered here.
pub(crate) fn quic_hello(server_name: Option<&str>) -> Hello {
    Hello {
        tls: true,
        server_name: server_name.map(str::to_ascii_lowercase),
        alpn: vec![b"h3".to_vec()],
    }
}

/// The TLS server config for all of a listener's chains: `base`'s settings (one chain's or
/// the listener's own; config makes their client-certificate checks the same) with a
/// certificate resolver that asks the chain the SNI picks. `chains`: each chain's config in
/// the chains' order (`None` for a chain without TLS); `own`: the listener's, where its
/// settings serve connections no chain fits. `None` when no chain has TLS.
pub(crate) fn server_config(
    selector: Arc<ChainSelector>,
    chains: &[Option<Arc<rustls::ServerConfig>>],
    own: Option<&Arc<rustls::ServerConfig>>,
    destination: SocketAddr,
) -> Option<rustls::ServerConfig> {
    let base = own.or_else(|| chains.iter().flatten().next())?;
    let mut config = (**base).clone();
    config.cert_resolver = Arc::new(ChainCertificates {
        selector,
        chains: (chains.iter())
            .map(|c| c.as_ref().map(|c| Arc::clone(&c.cert_resolver)))
            .collect(),
        own: own.map(|c| Arc::clone(&c.cert_resolver)),
        destination,
    });
    Some(config)
}

/// Picks a certificate as the chain the SNI picks would.
struct ChainCertificates {
    selector: Arc<ChainSelector>,
    chains: Vec<Option<Arc<dyn ResolvesServerCert>>>,
    own: Option<Arc<dyn ResolvesServerCert>>,
    /// The listener's address: what a chain's `destination_port` is matched against.
    destination: SocketAddr,
}

impl std::fmt::Debug for ChainCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainCertificates")
            .field("chains", &self.chains.len())
            .field("own", &self.own.is_some())
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for ChainCertificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let shown_hello = quic_hello(hello.server_name());
        let shown = Shown {
            destination: self.destination,
            // No QUIC chain is picked by the client's address (refused in config).
            source: SocketAddr::from(([0, 0, 0, 0], 0)),
            hello: &shown_hello,
            quic: true,
        };
        match self.selector.select(&shown) {
            Some(i) => self.chains.get(i)?.as_ref()?.resolve(hello),
            None => self.own.as_ref()?.resolve(hello),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use config::ChainMatch;

    #[test]
    fn quic_connections_show_their_sni_in_lower_case_and_h3() {
        let hello = quic_hello(Some("WWW.Example.com"));
        assert!(hello.tls);
        assert_eq!(hello.server_name.as_deref(), Some("www.example.com"));
        assert_eq!(hello.alpn, [b"h3".to_vec()]);
        let selector = ChainSelector::new(
            vec![
                ChainMatch {
                    server_names: vec!["www.example.com".into()],
                    ..ChainMatch::default()
                },
                ChainMatch {
                    transport_protocol: Some(config::TransportProtocol::Quic),
                    ..ChainMatch::default()
                },
            ],
            false,
        );
        let pick = |name: Option<&str>| {
            let hello = quic_hello(name);
            selector.select(&Shown {
                destination: "127.0.0.1:443".parse().expect("addr"),
                source: "10.0.0.1:5000".parse().expect("addr"),
                hello: &hello,
                quic: true,
            })
        };
        assert_eq!(pick(Some("WWW.EXAMPLE.COM")), Some(0));
        // Any other name: the chain asking for QUIC connections.
        assert_eq!(pick(Some("other.example.com")), Some(1));
        assert_eq!(pick(None), Some(1));
    }
}
