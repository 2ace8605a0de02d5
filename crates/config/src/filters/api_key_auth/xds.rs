//! Envoy's `ApiKeyAuth` (the `envoy.filters.http.api_key_auth` filter) and
//! `ApiKeyAuthPerRoute` as the `api_key_auth` filter's settings: Envoy Gateway's one filter
//! per security policy, its keys on the listener and on the routes.

use envoy_types::pb::envoy::extensions::filters::http::api_key_auth::v3::{
    ApiKeyAuth, ApiKeyAuthPerRoute, Credential, Forwarding, KeySource,
};
use envoy_types::pb::google::protobuf::Any;

use super::{RawApiKeyAuth, RawCredential, RawKeyForwarding, RawKeySource};
use crate::envoy::{ResourceError, decode};
use crate::filters::RawPerRoute;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuthPerRoute";

/// The listener's filter.
pub(crate) fn settings(any: &Any, _at: &str) -> Result<RawApiKeyAuth, ResourceError> {
    let ApiKeyAuth {
        credentials,
        key_sources,
        forwarding,
    } = decode(any, TYPE_URL, "an ApiKeyAuth")?;
    Ok(raw(credentials, key_sources, forwarding, Vec::new()))
}

/// A route's or virtual host's keys, sources, forwarding and allowed clients.
pub(crate) fn per_route(any: &Any, _at: &str) -> Result<RawPerRoute<RawApiKeyAuth>, ResourceError> {
    let ApiKeyAuthPerRoute {
        credentials,
        key_sources,
        allowed_clients,
        forwarding,
    } = decode(any, PER_ROUTE, "an ApiKeyAuthPerRoute")?;
    Ok(RawPerRoute::Settings(raw(credentials, key_sources, forwarding, allowed_clients)))
}

fn raw(
    credentials: Vec<Credential>,
    key_sources: Vec<KeySource>,
    forwarding: Option<Forwarding>,
    allowed_clients: Vec<String>,
) -> RawApiKeyAuth {
    let text = |s: String| Some(s).filter(|s| !s.is_empty());
    RawApiKeyAuth {
        credentials: (credentials.into_iter())
            .map(|c| RawCredential {
                key: c.key,
                client: c.client,
            })
            .collect(),
        // Envoy reads the first of `header`, `query`, `cookie` that is set.
        key_sources: (key_sources.into_iter())
            .map(|s| match (text(s.header), text(s.query), text(s.cookie)) {
                (Some(header), _, _) => RawKeySource {
                    header: Some(header),
                    ..Default::default()
                },
                (None, Some(query), _) => RawKeySource {
                    query: Some(query),
                    ..Default::default()
                },
                (None, None, cookie) => RawKeySource {
                    cookie,
                    ..Default::default()
                },
            })
            .collect(),
        forwarding: forwarding.map(|f| RawKeyForwarding {
            header: text(f.header),
            hide_credentials: Some(f.hide_credentials),
        }),
        allowed_clients,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failure should stop the test loudly

    use super::*;

    #[test]
    fn envoy_gateways_filter_and_route_keys_translate() {
        let filter = ApiKeyAuth {
            credentials: vec![Credential {
                key: "key1".into(),
                client: "client-1".into(),
            }],
            key_sources: vec![
                KeySource {
                    header: "X-API-KEY".into(),
                    ..Default::default()
                },
                KeySource {
                    query: "api-key".into(),
                    cookie: "ignored".into(),
                    ..Default::default()
                },
            ],
            forwarding: Some(Forwarding {
                header: "X-API-KEY-CLIENT-ID".into(),
                hide_credentials: true,
            }),
        };
        let raw = settings(&testbed::xds::any(&filter), "f").unwrap();
        assert_eq!(raw.credentials[0].client, "client-1");
        assert_eq!(raw.key_sources[0].header.as_deref(), Some("X-API-KEY"));
        assert_eq!((raw.key_sources[1].query.as_deref(), raw.key_sources[1].cookie.as_deref()), (Some("api-key"), None));
        assert_eq!(raw.forwarding.unwrap().hide_credentials, Some(true));
        let route = ApiKeyAuthPerRoute {
            allowed_clients: vec!["client-2".into()],
            ..Default::default()
        };
        let RawPerRoute::Settings(own) = per_route(&testbed::xds::any(&route), "r").unwrap() else {
            panic!("settings");
        };
        assert_eq!(own.allowed_clients, ["client-2"]);
        assert!(own.credentials.is_empty());
    }
}
