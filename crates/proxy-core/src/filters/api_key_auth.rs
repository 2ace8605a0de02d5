//! The `api_key_auth` filter (Envoy's): the request's API key is looked for in the key
//! sources, in order (a header's value after `Bearer `, a query parameter, a cookie); a key
//! that is not listed, or none, is answered 401, and a client the route does not allow 403,
//! with Envoy's texts. The client's name may go upstream in a header, and the key be removed
//! from every source. A route's settings replace the listener's where it gives them.

use bytes::Bytes;
use http::header::COOKIE;
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri};

use super::{BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings};
use crate::catalog::ApiKeyAuthStats;
use crate::context::RequestBody;
use crate::error::ProxyError;
use config::{ApiKeyAuthConfig, KeySource};

/// The filter on one worker.
pub(crate) struct ApiKeyAuth {
    /// The settings by route: a route's over the listener's.
    settings: PerRouteSettings<ApiKeyAuthConfig>,
    stats: ApiKeyAuthStats,
}

impl HttpFilter for ApiKeyAuth {
    type Config = ApiKeyAuthConfig;
    type Shared = ();
    type State = ();

    fn new(config: &ApiKeyAuthConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self {
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.api_key_auth, |c| c.over(config)),
            stats: ctx.catalog.api_key_auth(ctx.shard, &ctx.listener.name),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        let Some(config) = self.settings.get(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        let client = match client(config, req) {
            Ok(client) => client,
            Err(status) => {
                let body: &'static [u8] = if status == StatusCode::FORBIDDEN {
                    self.stats.forbidden.inc();
                    b"Client is forbidden."
                } else {
                    self.stats.unauthorized.inc();
                    b"Client authentication failed."
                };
                let reply = LocalReply::new(status, Bytes::from_static(body));
                return Ok(HeadersFlow::Flow(Flow::Respond(Box::new(reply))));
            }
        };
        if let Some(forwarding) = &config.forwarding {
            if let Some(header) = &forwarding.header {
                match HeaderValue::from_str(&client) {
                    Ok(value) => {
                        req.headers_mut().insert(header.clone(), value);
                    }
                    Err(_) => {
                        req.headers_mut().remove(header);
                    }
                }
            }
            if forwarding.hide_credentials {
                for source in &config.key_sources {
                    hide(source, req);
                }
            }
        }
        self.stats.allowed.inc();
        Ok(HeadersFlow::Flow(Flow::Continue))
    }
}

/// The client whose key the request carries, or the status that refuses it.
fn client(config: &ApiKeyAuthConfig, req: &Request<RequestBody>) -> Result<String, StatusCode> {
    // Envoy's order of checks: sources, then credentials, then the key.
    let (false, Some(credentials)) = (config.key_sources.is_empty(), &config.credentials) else {
        return Err(StatusCode::UNAUTHORIZED);
    };
    let key = (config.key_sources.iter())
        .find_map(|source| key(source, req.headers(), req.uri()))
        .ok_or(StatusCode::UNAUTHORIZED)?;
    let client = credentials.get(key.as_str()).ok_or(StatusCode::UNAUTHORIZED)?;
    if !config.allowed_clients.is_empty() && !config.allowed_clients.contains(client) {
        return Err(StatusCode::FORBIDDEN);
    }
    Ok(client.clone())
}

/// The key a source holds; `None` where it holds none (or an empty one).
fn key(source: &KeySource, headers: &HeaderMap, uri: &Uri) -> Option<String> {
    let key = match source {
        KeySource::Header(name) => {
            let value = headers.get(name)?.to_str().ok()?;
            value.strip_prefix("Bearer ").unwrap_or(value).to_owned()
        }
        KeySource::Query(name) => {
            let value = crate::router::query_value(uri.query()?, name)?;
            String::from_utf8(value.into_owned()).ok()?
        }
        KeySource::Cookie(name) => String::from_utf8(config::cookie_value(headers, name)?.to_vec()).ok()?,
    };
    (!key.is_empty()).then_some(key)
}

/// Removes what a source holds: the header, every value of the parameter, the cookie.
fn hide(source: &KeySource, req: &mut Request<RequestBody>) {
    match source {
        KeySource::Header(name) => {
            req.headers_mut().remove(name);
        }
        KeySource::Query(name) => {
            let Some(query) = req.uri().query() else {
                return;
            };
            let kept: Vec<&str> = (query.split('&'))
                .filter(|pair| {
                    let key = pair.split_once('=').map_or(*pair, |(k, _)| k);
                    percent_encoding::percent_decode_str(key).decode_utf8_lossy() != name.as_str()
                })
                .collect();
            let path = req.uri().path();
            let path_and_query = if kept.is_empty() {
                path.to_owned()
            } else {
                format!("{path}?{}", kept.join("&"))
            };
            let mut parts = req.uri().clone().into_parts();
            if let Ok(value) = path_and_query.parse() {
                parts.path_and_query = Some(value);
                if let Ok(uri) = Uri::from_parts(parts) {
                    *req.uri_mut() = uri;
                }
            }
        }
        KeySource::Cookie(name) => {
            let headers = req.headers_mut();
            let kept: Vec<HeaderValue> = (headers.get_all(COOKIE).iter())
                .filter_map(|value| {
                    let text = value.to_str().ok()?;
                    let rest: Vec<&str> = (text.split(';'))
                        .map(str::trim)
                        .filter(|c| !c.is_empty() && c.split_once('=').map_or(*c, |(k, _)| k) != name)
                        .collect();
                    (!rest.is_empty()).then(|| HeaderValue::from_str(&rest.join("; ")).ok())?
                })
                .collect();
            headers.remove(COOKIE);
            for value in kept {
                headers.append(COOKIE, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn request(uri: &str, headers: &[(&str, &str)]) -> Request<RequestBody> {
        let mut req = Request::get(uri);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(RequestBody::empty()).unwrap()
    }

    #[test]
    fn keys_are_found_in_order_and_hidden_from_every_source() {
        let sources = [
            KeySource::Header(http::HeaderName::from_static("x-api-key")),
            KeySource::Query("key".into()),
            KeySource::Cookie("key".into()),
        ];
        let found = |req: &Request<RequestBody>| sources.iter().find_map(|s| key(s, req.headers(), req.uri()));
        assert_eq!(found(&request("/", &[("x-api-key", "Bearer abc")])).as_deref(), Some("abc"));
        assert_eq!(found(&request("/?a=1&key=q%20k", &[])).as_deref(), Some("q k"));
        assert_eq!(found(&request("/", &[("cookie", "x=1; key=c")])).as_deref(), Some("c"));
        assert_eq!(found(&request("/?key=", &[("x-api-key", "")])), None);
        let mut req = request("/p?a=1&key=q&b=2&key=r", &[("x-api-key", "h"), ("cookie", "x=1; key=c"), ("cookie", "key=d")]);
        for source in &sources {
            hide(source, &mut req);
        }
        assert_eq!(req.uri().to_string(), "/p?a=1&b=2");
        assert!(req.headers().get("x-api-key").is_none());
        let cookies: Vec<&HeaderValue> = req.headers().get_all(COOKIE).iter().collect();
        assert_eq!(cookies, [&HeaderValue::from_static("x=1")]);
        let mut only = request("/p?key=q", &[]);
        hide(&sources[1], &mut only);
        assert_eq!(only.uri().to_string(), "/p");
    }
}
