//! How a request is described for rate limits, local and global (Envoy's rate limit
//! actions): each rule's actions, in order, make one list of key/value entries, or none when
//! an action does not apply.

use std::borrow::Cow;
use std::net::IpAddr;

use http::Request;
use ipnet::IpNet;

use super::Exchange;
use crate::context::RequestBody;
use crate::router::query_value;
use config::{RateLimitAction, RateLimitRule, RequestField, RequestHeaderMatch, ValuePart};

/// One request's entries: `(key, value)` in the rule's order.
pub(crate) type Entries = Vec<(String, String)>;

/// What the actions read of a request.
pub(crate) struct Described<'a> {
    pub(crate) req: &'a Request<RequestBody>,
    pub(crate) exchange: &'a Exchange<'a>,
}

impl Described<'_> {
    /// The rule's list for this request; `None` when one of its actions does not apply.
    pub(crate) fn entries(&self, rule: &RateLimitRule) -> Option<Entries> {
        let mut entries = Vec::with_capacity(rule.actions.len());
        for action in &rule.actions {
            match action {
                RateLimitAction::HeaderValueMatch {
                    descriptor_key,
                    descriptor_value,
                    expect_match,
                    headers,
                } => {
                    let matched = headers.iter().all(|h| self.header_matches(h));
                    if matched != *expect_match {
                        return None;
                    }
                    entries.push((descriptor_key.clone(), descriptor_value.clone()));
                }
                RateLimitAction::QueryParameterValueMatch {
                    descriptor_key,
                    descriptor_value,
                    expect_match,
                    query_parameters,
                } => {
                    let query = self.req.uri().query().unwrap_or("");
                    let matched =
                        query_parameters
                            .iter()
                            .all(|q| match query_value(query, &q.name) {
                                None => false,
                                Some(value) => q.value.as_ref().is_none_or(|v| v.matches(&value)),
                            });
                    if matched != *expect_match {
                        return None;
                    }
                    entries.push((descriptor_key.clone(), descriptor_value.clone()));
                }
                RateLimitAction::RequestHeaders {
                    header_name,
                    descriptor_key,
                    skip_if_absent,
                } => match self.field(header_name).filter(|v| !v.is_empty()) {
                    Some(value) => entries.push((descriptor_key.clone(), text(&value))),
                    None if *skip_if_absent => {}
                    None => return None,
                },
                RateLimitAction::QueryParameters {
                    query_parameter_name,
                    descriptor_key,
                    skip_if_absent,
                } => {
                    let query = self.req.uri().query().unwrap_or("");
                    match query_value(query, query_parameter_name).filter(|v| !v.is_empty()) {
                        Some(value) => entries.push((descriptor_key.clone(), text(&value))),
                        None if *skip_if_absent => {}
                        None => return None,
                    }
                }
                RateLimitAction::RemoteAddress => {
                    entries.push(("remote_address".into(), self.client().to_string()));
                }
                RateLimitAction::MaskedRemoteAddress {
                    v4_prefix_mask_len,
                    v6_prefix_mask_len,
                } => {
                    let ip = self.client();
                    let len = match ip {
                        IpAddr::V4(_) => *v4_prefix_mask_len,
                        IpAddr::V6(_) => *v6_prefix_mask_len,
                    };
                    // The lengths were checked at load: never out of range.
                    let net = IpNet::new(ip, len).ok()?.trunc();
                    entries.push(("masked_remote_address".into(), net.to_string()));
                }
                RateLimitAction::GenericKey {
                    descriptor_key,
                    descriptor_value,
                } => entries.push((descriptor_key.clone(), descriptor_value.clone())),
                RateLimitAction::RemoteAddressMatch {
                    descriptor_key,
                    descriptor_value,
                    ranges,
                    invert,
                } => {
                    let ip = self.client();
                    if ranges.iter().any(|net| net.contains(&ip)) == *invert {
                        return None;
                    }
                    let value = descriptor_value
                        .0
                        .iter()
                        .map(|part| match part {
                            ValuePart::Literal(text) => Cow::Borrowed(text.as_str()),
                            ValuePart::ClientIp => Cow::Owned(ip.to_string()),
                        })
                        .collect();
                    entries.push((descriptor_key.clone(), value));
                }
            }
        }
        Some(entries)
    }

    /// The client's address, after trusted proxies; an IPv4 client on an IPv6 socket as the
    /// IPv4 address it is.
    fn client(&self) -> IpAddr {
        self.exchange.client.ip(self.exchange.conn).to_canonical()
    }

    /// A header's first value, or a pseudo-header's; `None` when absent.
    fn field(&self, field: &RequestField) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(match field {
            RequestField::Header(name) => self.req.headers().get(name)?.as_bytes(),
            RequestField::Method => self.req.method().as_str().as_bytes(),
            RequestField::Path => self
                .req
                .uri()
                .path_and_query()
                .map_or(self.req.uri().path(), |p| p.as_str())
                .as_bytes(),
            RequestField::Authority => self.exchange.host?.as_bytes(),
        }))
    }

    fn header_matches(&self, m: &RequestHeaderMatch) -> bool {
        match &m.name {
            RequestField::Header(name) => m.value.matches_values(
                self.req
                    .headers()
                    .get_all(name)
                    .iter()
                    .map(|v| v.as_bytes()),
            ),
            pseudo => m
                .value
                .matches_values(self.field(pseudo).as_deref().into_iter()),
        }
    }
}

fn text(value: &[u8]) -> String {
    String::from_utf8_lossy(value).into_owned()
}
