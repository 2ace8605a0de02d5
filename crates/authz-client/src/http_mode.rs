//! HTTP mode: the request's method and path (behind a prefix) and its allowed headers go to the
//! service; a 200 allows, anything else is the answer for the client. HTTP/1.1 with a small
//! keep-alive pool, since plain HTTP authorization services rarely speak cleartext HTTP/2.

use std::sync::Mutex;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HOST, LOCATION, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderName, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::decision::{Allowed, Decision, Denied, HeaderAction, HeaderMutation, is_protected};
use grpc_channel::{Backoff, connect};

use crate::retry::Failed;
use crate::{AuthzError, CheckInput, Endpoint, HttpOptions};

/// Idle connections kept for reuse.
const MAX_IDLE: usize = 64;
/// Largest answer body read from the service.
const MAX_ANSWER: usize = 64 * 1024;

type Sender = SendRequest<Full<Bytes>>;

pub(crate) struct HttpChannel {
    endpoint: Endpoint,
    options: HttpOptions,
    idle: Mutex<Vec<Sender>>,
    backoff: Backoff,
    tls: Option<crate::Tls>,
}

impl HttpChannel {
    pub(crate) fn new(endpoint: Endpoint, options: HttpOptions) -> Self {
        Self {
            endpoint,
            options,
            idle: Mutex::new(Vec::new()),
            backoff: Backoff::default(),
            tls: None,
        }
    }

    pub(crate) fn set_tls(&mut self, tls: crate::Tls) {
        self.tls = Some(tls);
    }

    async fn sender(&self) -> Result<Sender, AuthzError> {
        loop {
            let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match pooled {
                Some(mut sender) => {
                    if !sender.is_closed() && sender.ready().await.is_ok() {
                        return Ok(sender);
                    }
                }
                None => break,
            }
        }
        self.backoff
            .check()
            .map_err(|retry_in| AuthzError::Backoff {
                endpoint: self.endpoint.clone(),
                retry_in,
            })?;
        let connected = async {
            let stream = connect(&self.endpoint, self.tls.as_ref()).await?;
            hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)
        }
        .await;
        match connected {
            Ok((sender, conn)) => {
                self.backoff.succeeded();
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(sender)
            }
            Err(source) => {
                self.backoff.failed();
                Err(AuthzError::Connect {
                    endpoint: self.endpoint.clone(),
                    source,
                })
            }
        }
    }

    /// One try, then retries as the policy allows (the caller's timeout bounds them all).
    pub(crate) async fn check(&self, input: &CheckInput<'_>) -> Result<Decision, AuthzError> {
        let answer = crate::retry::tries(
            self.options.retry.as_deref(),
            &self.backoff,
            |(head, _): &(http::response::Parts, Bytes)| (head.status, &head.headers),
            async || self.try_once(input).await,
        )
        .await?;
        decide(&self.options, &answer.0, answer.1)
    }

    /// One request to the service: its answer's head and body, or how it failed.
    async fn try_once(
        &self,
        input: &CheckInput<'_>,
    ) -> Result<(http::response::Parts, Bytes), Failed> {
        let request = self.request(input).map_err(Failed::Reset)?;
        let mut sender = self.sender().await.map_err(Failed::Connect)?;
        let reset = |e: hyper::Error| Failed::Reset(AuthzError::Transport(e.to_string()));
        let response = sender.send_request(request).await.map_err(reset)?;
        let (head, body) = response.into_parts();
        let body = Limited::new(body, MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| Failed::Reset(AuthzError::Transport(e.to_string())))?
            .to_bytes();
        if !sender.is_closed() {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(sender);
            }
        }
        Ok((head, body))
    }

    fn request(&self, input: &CheckInput<'_>) -> Result<Request<Full<Bytes>>, AuthzError> {
        let path = match &self.options.path_override {
            Some(path) => path.clone(),
            None => format!("{}{}", self.options.path_prefix, input.path),
        };
        let mut request = Request::builder()
            .method(input.method.clone())
            .uri(path)
            .body(Full::new(input.body.cloned().unwrap_or_default()))
            .map_err(|e| AuthzError::Transport(format!("cannot build the check request: {e}")))?;
        let headers = request.headers_mut();
        if let Ok(host) = http::HeaderValue::from_str(input.host) {
            headers.insert(HOST, host);
        }
        for name in std::iter::once(&AUTHORIZATION).chain(&self.options.allowed_headers) {
            for value in input.headers.get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        for (name, value) in &self.options.headers_to_add {
            headers.insert(name.clone(), value.clone());
        }
        input.put_trace_context(headers);
        Ok(request)
    }
}

/// A 200 allows, with the allowed upstream headers; a 5xx is an error (the service failed,
/// and the caller's failure mode decides, as Envoy's); anything else, another 2xx included
/// as in Envoy, is the denial for the client (a 1xx becomes 403).
pub(crate) fn decide(
    options: &HttpOptions,
    head: &http::response::Parts,
    body: Bytes,
) -> Result<Decision, AuthzError> {
    if head.status.is_server_error() {
        return Err(AuthzError::ErrorResponse {
            status: head.status,
        });
    }
    Ok(decide_answer(options, head, body))
}

fn decide_answer(options: &HttpOptions, head: &http::response::Parts, body: Bytes) -> Decision {
    // The answer's values of the names listed, as mutations of one action.
    let taken = |names: &[HeaderName], action: HeaderAction| -> Vec<HeaderMutation> {
        (names.iter())
            .filter(|name| !is_protected(name))
            .flat_map(|name| {
                head.headers
                    .get_all(name)
                    .iter()
                    .map(move |value| HeaderMutation {
                        name: name.clone(),
                        value: value.clone(),
                        action,
                    })
            })
            .collect()
    };
    if head.status == StatusCode::OK {
        let mut upstream_headers = taken(&options.allowed_upstream_headers, HeaderAction::Set);
        upstream_headers.extend(taken(
            &options.allowed_upstream_headers_to_append,
            HeaderAction::Append,
        ));
        return Decision::Allow(Allowed {
            upstream_headers,
            response_headers: taken(
                &options.allowed_client_headers_on_success,
                HeaderAction::Append,
            ),
            ..Allowed::default()
        });
    }
    let headers = match &options.allowed_client_headers {
        None => client_headers(&head.headers),
        Some(names) => {
            // Envoy's, besides the status and length: the challenge and the location.
            let always = [WWW_AUTHENTICATE, LOCATION];
            let names: Vec<HeaderName> = always
                .iter()
                .filter(|name| !names.contains(name))
                .cloned()
                .chain(names.iter().cloned())
                .collect();
            taken(&names, HeaderAction::Append)
        }
    };
    Decision::Deny(Denied {
        // A 1xx (a 101 above all) would tell the client something else than a denial.
        status: if head.status.is_informational() {
            StatusCode::FORBIDDEN
        } else {
            head.status
        },
        headers,
        body,
    })
}

/// The service's answer headers for the client, without those that describe the hop.
fn client_headers(headers: &HeaderMap) -> Vec<HeaderMutation> {
    headers
        .iter()
        .filter(|(name, _)| !is_protected(name))
        .map(|(name, value)| HeaderMutation {
            name: name.clone(),
            value: value.clone(),
            action: HeaderAction::Append,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use http::{HeaderName, Response};

    use super::*;

    fn head(status: u16, headers: &[(&str, &str)]) -> http::response::Parts {
        let mut builder = Response::builder().status(status);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let Ok(response) = builder.body(()) else {
            panic!("a valid test head");
        };
        response.into_parts().0
    }

    #[test]
    fn framing_and_hop_by_hop_headers_are_never_taken_from_the_service() {
        let options = HttpOptions {
            allowed_upstream_headers: vec![
                HeaderName::from_static("x-user"),
                HeaderName::from_static("content-length"),
            ],
            ..HttpOptions::default()
        };
        // Envoy allows on 200 alone: a 204 is the answer for the client.
        let no_content = head(204, &[("x-user", "alice")]);
        let Ok(Decision::Deny(denied)) = decide(&options, &no_content, Bytes::new()) else {
            panic!("a 204 denies");
        };
        assert_eq!(denied.status, StatusCode::NO_CONTENT);
        let ok = head(200, &[("x-user", "alice"), ("content-length", "9")]);
        let Ok(Decision::Allow(allowed)) = decide(&options, &ok, Bytes::new()) else {
            panic!("a 200 allows");
        };
        let names: Vec<_> = allowed
            .upstream_headers
            .iter()
            .map(|h| h.name.as_str())
            .collect();
        assert_eq!(names, ["x-user"]);
        let denial = head(
            401,
            &[
                ("www-authenticate", "Bearer"),
                ("content-length", "3"),
                ("transfer-encoding", "chunked"),
                ("trailer", "x-t"),
            ],
        );
        let Ok(Decision::Deny(denied)) = decide(&options, &denial, Bytes::from_static(b"nope"))
        else {
            panic!("a 401 denies");
        };
        assert_eq!(denied.status, StatusCode::UNAUTHORIZED);
        let names: Vec<_> = denied.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["www-authenticate"]);
        let Ok(Decision::Deny(denied)) = decide(&options, &head(101, &[]), Bytes::new()) else {
            panic!("a 101 denies");
        };
        assert_eq!(denied.status, StatusCode::FORBIDDEN);
        assert!(matches!(
            decide(&options, &head(503, &[]), Bytes::new()),
            Err(AuthzError::ErrorResponse { status }) if status == StatusCode::SERVICE_UNAVAILABLE
        ));
    }
}
