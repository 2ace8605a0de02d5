//! Picking a connection's filter chain, with Envoy's `filter_chain_match` order: destination
//! port, destination address, server name, transport, application protocol, source address,
//! source port. At each step the most specific chains that fit go on, else those that ask
//! nothing of it; there is no going back. The first three are maps built once per config,
//! so a listener with a thousand SNI names picks as fast as one with ten.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;

use config::{ChainMatch, TransportProtocol};
use ipnet::IpNet;

use super::ConnSettings;
use super::client_hello::Hello;
use crate::context::ListenerCtx;
use crate::http::HttpSlot;

/// A listener's chains, as a lookup; built once per config, shared by the workers.
pub(crate) struct ChainSelector {
    ports: HashMap<u16, ByAddress>,
    any_port: ByAddress,
    matches: Vec<ChainMatch>,
    /// Some chain picks by SNI, ALPN or transport: the ClientHello is read first.
    inspects: bool,
    /// Some chain asks plain-text connections for their protocol, and the listener has the
    /// HTTP inspector: a connection that is not TLS is read for its HTTP version too.
    inspects_http: bool,
}

#[derive(Default)]
struct ByAddress {
    /// Longest prefix first.
    ranges: Vec<(IpNet, ByName)>,
    any: ByName,
}

#[derive(Default)]
struct ByName {
    exact: HashMap<String, Vec<usize>>,
    /// `*.example.com` as `.example.com`.
    wildcard: HashMap<String, Vec<usize>>,
    any: Vec<usize>,
}

/// What a connection shows its chain by.
pub(crate) struct Shown<'a> {
    pub(crate) destination: SocketAddr,
    pub(crate) source: SocketAddr,
    pub(crate) hello: &'a Hello,
    /// A QUIC connection (transport `quic`), whose handshake showed `hello`.
    pub(crate) quic: bool,
}

impl ChainSelector {
    /// `http_inspector`: the listener's (plain text shows its HTTP version as its protocol).
    pub(crate) fn new(matches: Vec<ChainMatch>, http_inspector: bool) -> Self {
        let mut selector = Self {
            ports: HashMap::new(),
            any_port: ByAddress::default(),
            inspects: matches.iter().any(ChainMatch::inspects),
            inspects_http: http_inspector
                && matches.iter().any(|m| {
                    !m.application_protocols.is_empty()
                        && m.transport_protocol != Some(TransportProtocol::Tls)
                }),
            matches: Vec::new(),
        };
        for (i, m) in matches.iter().enumerate() {
            let by_address = match m.destination_port {
                Some(port) => selector.ports.entry(port).or_default(),
                None => &mut selector.any_port,
            };
            let mut by_names: Vec<&mut ByName> = Vec::new();
            if m.prefix_ranges.is_empty() {
                by_names.push(&mut by_address.any);
            } else {
                for net in &m.prefix_ranges {
                    if !by_address.ranges.iter().any(|(n, _)| n == net) {
                        by_address.ranges.push((*net, ByName::default()));
                    }
                }
                by_names.extend(
                    by_address
                        .ranges
                        .iter_mut()
                        .filter(|(n, _)| m.prefix_ranges.contains(n))
                        .map(|(_, by_name)| by_name),
                );
            }
            for by_name in by_names {
                if m.server_names.is_empty() {
                    by_name.any.push(i);
                }
                for name in &m.server_names {
                    match name.strip_prefix('*') {
                        Some(suffix) => by_name.wildcard.entry(suffix.to_owned()),
                        None => by_name.exact.entry(name.clone()),
                    }
                    .or_default()
                    .push(i);
                }
            }
        }
        for by_address in selector.ports.values_mut().chain([&mut selector.any_port]) {
            by_address
                .ranges
                .sort_by_key(|(net, _)| std::cmp::Reverse(net.prefix_len()));
        }
        selector.matches = matches;
        selector
    }

    /// Whether the connection's ClientHello is read before picking.
    pub(crate) fn inspects(&self) -> bool {
        self.inspects
    }

    /// Whether a plain-text connection's first bytes are read for its HTTP version.
    pub(crate) fn inspects_http(&self) -> bool {
        self.inspects_http
    }

    /// The chain serving a connection that shows `shown`, by its place in the listener's
    /// `filter_chains`; `None`: no chain fits.
    pub(crate) fn select(&self, shown: &Shown<'_>) -> Option<usize> {
        let by_address = self
            .ports
            .get(&shown.destination.port())
            .unwrap_or(&self.any_port);
        let ip = shown.destination.ip();
        let by_name = by_address
            .ranges
            .iter()
            .find(|(net, _)| contains(net, ip))
            .map_or(&by_address.any, |(_, by_name)| by_name);
        let candidates = by_name.find(shown.hello.server_name.as_deref())?;
        self.narrow(candidates, shown)
    }

    /// The steps after the server name, over the few chains left.
    fn narrow(&self, candidates: &[usize], shown: &Shown<'_>) -> Option<usize> {
        let transport = if shown.quic {
            TransportProtocol::Quic
        } else if shown.hello.tls {
            TransportProtocol::Tls
        } else {
            TransportProtocol::RawBuffer
        };
        let left = most_specific(candidates, |i| {
            let want = self.matches[i].transport_protocol?;
            Some(want == transport)
        });
        let left = {
            let offered = &shown.hello.alpn;
            let fits = |i: usize, protocol: &[u8]| {
                (self.matches[i].application_protocols.iter()).any(|p| p.as_bytes() == protocol)
            };
            // The client's first protocol any chain asks for decides, as Envoy's.
            match offered.iter().find(|p| left.iter().any(|&i| fits(i, p))) {
                Some(protocol) => left
                    .iter()
                    .copied()
                    .filter(|&i| fits(i, protocol))
                    .collect(),
                None => (left.iter().copied())
                    .filter(|&i| self.matches[i].application_protocols.is_empty())
                    .collect::<Vec<_>>(),
            }
        };
        let source = shown.source.ip();
        let longest = (left.iter())
            .flat_map(|&i| self.matches[i].source_prefix_ranges.iter())
            .filter(|net| contains(net, source))
            .map(IpNet::prefix_len)
            .max();
        let left: Vec<usize> = match longest {
            Some(len) => (left.iter().copied())
                .filter(|&i| {
                    (self.matches[i].source_prefix_ranges.iter())
                        .any(|net| net.prefix_len() == len && contains(net, source))
                })
                .collect(),
            None => (left.iter().copied())
                .filter(|&i| self.matches[i].source_prefix_ranges.is_empty())
                .collect(),
        };
        let port = shown.source.port();
        let left = most_specific(&left, |i| {
            let ports = &self.matches[i].source_ports;
            (!ports.is_empty()).then(|| ports.contains(&port))
        });
        left.first().copied()
    }
}

impl ByName {
    /// Exact name, then the longest wildcard, then the chains that name none.
    fn find(&self, name: Option<&str>) -> Option<&[usize]> {
        if let Some(name) = name {
            if let Some(found) = self.exact.get(name) {
                return Some(found);
            }
            let mut from = 1;
            while let Some(dot) = name.get(from..).and_then(|rest| rest.find('.')) {
                let suffix = &name[from + dot..];
                if suffix.len() < 2 {
                    break;
                }
                if let Some(found) = self.wildcard.get(suffix) {
                    return Some(found);
                }
                from += dot + 1;
            }
        }
        (!self.any.is_empty()).then_some(self.any.as_slice())
    }
}

/// Those of `chains` that ask for what the connection shows (`Some(true)`), or, if none
/// does, those that ask nothing (`None`).
fn most_specific(chains: &[usize], asks: impl Fn(usize) -> Option<bool>) -> Vec<usize> {
    let fit: Vec<usize> = chains
        .iter()
        .copied()
        .filter(|&i| asks(i) == Some(true))
        .collect();
    if !fit.is_empty() {
        return fit;
    }
    chains
        .iter()
        .copied()
        .filter(|&i| asks(i).is_none())
        .collect()
}

/// A v4-mapped v6 address is its v4 address (a dual-stack socket's peers).
fn contains(net: &IpNet, ip: IpAddr) -> bool {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    net.contains(&ip)
}

/// A listener's chains on one worker: how each chain's connections are served.
pub(crate) struct Chains {
    pub(crate) selector: std::sync::Arc<ChainSelector>,
    pub(crate) entries: Box<[ChainEntry]>,
    /// The listener's own settings serve a connection no chain fits; otherwise it is closed.
    pub(crate) default: bool,
    pub(crate) inspect_timeout: Option<std::time::Duration>,
    pub(crate) continue_on_timeout: bool,
}

/// One chain on one worker. Its context carries the chain's drain and close flags.
pub(crate) struct ChainEntry {
    pub(crate) ctx: Rc<ListenerCtx>,
    pub(crate) conn: Rc<ConnSettings>,
    pub(crate) http: Rc<HttpSlot>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(f: impl FnOnce(&mut ChainMatch)) -> ChainMatch {
        let mut m = ChainMatch::default();
        f(&mut m);
        m
    }

    fn pick(
        selector: &ChainSelector,
        sni: Option<&str>,
        tls: bool,
        alpn: &[&str],
    ) -> Option<usize> {
        let hello = Hello {
            tls,
            server_name: sni.map(str::to_owned),
            alpn: alpn.iter().map(|p| p.as_bytes().to_vec()).collect(),
        };
        selector.select(&Shown {
            destination: "127.0.0.1:443".parse().expect("addr"),
            source: "10.1.2.3:5000".parse().expect("addr"),
            hello: &hello,
            quic: false,
        })
    }

    #[test]
    fn names_pick_exact_then_longest_wildcard_then_nameless() {
        let selector = ChainSelector::new(
            vec![
                chain(|m| m.server_names = vec!["www.example.com".into()]),
                chain(|m| m.server_names = vec!["*.example.com".into()]),
                chain(|m| m.server_names = vec!["*.b.example.com".into()]),
                chain(|_| {}),
            ],
            false,
        );
        assert!(selector.inspects());
        assert_eq!(pick(&selector, Some("www.example.com"), true, &[]), Some(0));
        assert_eq!(pick(&selector, Some("api.example.com"), true, &[]), Some(1));
        assert_eq!(pick(&selector, Some("x.b.example.com"), true, &[]), Some(2));
        // A wildcard is for names under it, not the name itself.
        assert_eq!(pick(&selector, Some("example.com"), true, &[]), Some(3));
        assert_eq!(pick(&selector, None, false, &[]), Some(3));
    }

    #[test]
    fn no_going_back_after_a_step_and_later_steps_narrow() {
        let selector = ChainSelector::new(
            vec![
                chain(|m| {
                    m.server_names = vec!["a.example.com".into()];
                    m.transport_protocol = Some(TransportProtocol::Tls);
                }),
                chain(|m| m.transport_protocol = Some(TransportProtocol::RawBuffer)),
                chain(|m| m.application_protocols = vec!["h2".into()]),
                chain(|m| m.source_prefix_ranges = vec!["10.1.0.0/16".parse().expect("net")]),
                chain(|m| {
                    m.source_prefix_ranges = vec!["10.0.0.0/8".parse().expect("net")];
                    m.source_ports = vec![5000];
                }),
            ],
            false,
        );
        assert_eq!(pick(&selector, Some("a.example.com"), true, &[]), Some(0));
        assert_eq!(pick(&selector, None, false, &[]), Some(1));
        assert_eq!(pick(&selector, None, true, &["http/1.1", "h2"]), Some(2));
        // The longest source range wins over a port the shorter one names.
        assert_eq!(pick(&selector, None, true, &["http/1.1"]), Some(3));
        let only_named = ChainSelector::new(
            vec![chain(|m| {
                m.server_names = vec!["a.example.com".into()];
            })],
            false,
        );
        assert_eq!(pick(&only_named, Some("b.example.com"), true, &[]), None);
        assert_eq!(pick(&only_named, None, false, &[]), None);
    }

    #[test]
    fn destination_port_and_address_come_first() {
        let selector = ChainSelector::new(
            vec![
                chain(|m| m.destination_port = Some(443)),
                chain(|m| m.server_names = vec!["a.example.com".into()]),
                chain(|m| {
                    m.destination_port = Some(8443);
                    m.prefix_ranges = vec!["127.0.0.0/8".parse().expect("net")];
                }),
            ],
            false,
        );
        // Port 443 has a chain of its own: the named chain on any port is not reached.
        assert_eq!(pick(&selector, Some("a.example.com"), true, &[]), Some(0));
        assert!(
            !ChainSelector::new(vec![chain(|m| m.destination_port = Some(1))], false).inspects()
        );
    }
}
