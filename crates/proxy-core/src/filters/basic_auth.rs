//! The `basic_auth` filter (Envoy's): a request must carry `Basic` credentials (in
//! `authorization`, or the configured header) of a user of the list whose password's SHA-1
//! is the one listed; else it is answered 401 with Envoy's reason and `www-authenticate:
//! Basic`. A route's own users replace the listener's.

use base64::Engine;
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use sha1::{Digest, Sha1};

use super::{BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings};
use crate::catalog::BasicAuthStats;
use crate::context::RequestBody;
use crate::error::ProxyError;
use config::BasicAuthConfig;

/// The filter on one worker.
pub(crate) struct BasicAuth {
    /// The listener's settings: the header read, the one written, `allow_missing`.
    listener: BasicAuthConfig,
    /// The users, by route.
    settings: PerRouteSettings<BasicAuthConfig>,
    stats: BasicAuthStats,
}

impl HttpFilter for BasicAuth {
    type Config = BasicAuthConfig;
    type Shared = ();
    type State = ();

    fn new(config: &BasicAuthConfig, _: Option<&()>, ctx: &BuildCtx<'_>) -> Self {
        Self {
            listener: config.clone(),
            settings: PerRouteSettings::new(config, ctx.table, ctx.filter, |f| &f.basic_auth, Clone::clone),
            stats: ctx.catalog.basic_auth(ctx.shard, &ctx.listener.name),
        }
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        _: &mut (),
    ) -> Result<HeadersFlow, ProxyError> {
        let Some(level) = self.settings.get(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        let config = &self.listener;
        let credentials = req.headers().get(&config.authentication_header);
        if credentials.is_none() && config.allow_missing {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        match user(credentials, &level.users) {
            Ok(name) => {
                self.stats.allowed.inc();
                if let Some(header) = &config.forward_username_header {
                    match HeaderValue::from_str(&name) {
                        Ok(value) => {
                            req.headers_mut().insert(header.clone(), value);
                        }
                        Err(_) => {
                            req.headers_mut().remove(header);
                        }
                    }
                }
                Ok(HeadersFlow::Flow(Flow::Continue))
            }
            Err(reason) => {
                self.stats.denied.inc();
                let mut reply = LocalReply::new(StatusCode::UNAUTHORIZED, Bytes::from_static(reason.as_bytes()));
                let realm = format!("Basic realm=\"{}\"", exchange.realm(req.uri()));
                if let Ok(value) = HeaderValue::from_str(&realm) {
                    reply.headers.insert(http::header::WWW_AUTHENTICATE, value);
                }
                Ok(HeadersFlow::Flow(Flow::Respond(Box::new(reply))))
            }
        }
    }
}

/// The user the credentials name, if its password is right; else Envoy's reason.
fn user(
    credentials: Option<&HeaderValue>,
    users: &std::collections::BTreeMap<String, [u8; 20]>,
) -> Result<String, &'static str> {
    let Some(value) = credentials else {
        return Err("User authentication failed. Missing username and password.");
    };
    let Some(token) = value.as_bytes().strip_prefix(b"Basic ") else {
        return Err("User authentication failed. Expected 'Basic' authentication scheme.");
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim_ascii())
        .map_err(|_| "User authentication failed. Invalid basic credential format.")?;
    let Some(colon) = decoded.iter().position(|&b| b == b':') else {
        return Err("User authentication failed. Invalid basic credential format.");
    };
    let (name, password) = (&decoded[..colon], &decoded[colon + 1..]);
    let invalid = "User authentication failed. Invalid username/password combination.";
    let name = std::str::from_utf8(name).map_err(|_| invalid)?;
    let Some(expected) = users.get(name) else {
        return Err(invalid);
    };
    let digest: [u8; 20] = Sha1::digest(password).into();
    // Compared in constant time: how much of the digest matched does not show.
    let differs = digest.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b));
    if differs != 0 {
        return Err(invalid);
    }
    Ok(name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_checked_as_envoy_checks_them() {
        let digest: [u8; 20] = Sha1::digest(b"secret").into();
        let users = std::collections::BTreeMap::from([("alice".to_owned(), digest)]);
        let header = |text: &str| HeaderValue::from_str(text).unwrap();
        let basic = |pair: &str| header(&format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair)));
        assert_eq!(user(Some(&basic("alice:secret")), &users), Ok("alice".into()));
        assert_eq!(user(Some(&basic("alice:wrong")), &users).unwrap_err(), "User authentication failed. Invalid username/password combination.");
        assert_eq!(user(Some(&basic("bob:secret")), &users).unwrap_err(), "User authentication failed. Invalid username/password combination.");
        assert_eq!(user(Some(&basic("alice")), &users).unwrap_err(), "User authentication failed. Invalid basic credential format.");
        assert_eq!(user(Some(&header("Basic !!")), &users).unwrap_err(), "User authentication failed. Invalid basic credential format.");
        assert_eq!(user(Some(&header("Bearer x")), &users).unwrap_err(), "User authentication failed. Expected 'Basic' authentication scheme.");
        assert_eq!(user(None, &users).unwrap_err(), "User authentication failed. Missing username and password.");
        // A password may hold a colon.
        let digest: [u8; 20] = Sha1::digest(b"a:b").into();
        let users = std::collections::BTreeMap::from([("c".to_owned(), digest)]);
        assert_eq!(user(Some(&basic("c:a:b")), &users), Ok("c".into()));
    }
}
