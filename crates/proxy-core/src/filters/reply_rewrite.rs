//! A response's new status, body or headers, as a local reply mapper or the
//! `custom_response` filter gives them, made once per worker.

use bytes::Bytes;
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderValue, StatusCode};

use super::Mutations;

pub(crate) struct ReplyRewrite {
    status: Option<StatusCode>,
    body: Option<Bytes>,
    headers: Option<Mutations>,
}

impl ReplyRewrite {
    pub(crate) fn new(config: &config::filters::reply::ReplyRewrite) -> Self {
        Self {
            status: config.status,
            body: config.body.clone(),
            headers: config.headers.as_ref().map(Mutations::new),
        }
    }

    /// Whether its header values read the request id.
    pub(crate) fn uses_request_id(&self) -> bool {
        self.headers
            .as_ref()
            .is_some_and(Mutations::uses_request_id)
    }

    /// Rewrites a response's head: its status, the rewrite's headers, then the framing of a
    /// new body, typed `text/plain` where the headers left it untyped (as Envoy's local
    /// replies). Returns the new body, for the caller to send instead of the response's own.
    /// `apply_headers` applies the rewrite's header changes with what the caller knows of
    /// the exchange.
    pub(crate) fn apply(
        &self,
        status: &mut StatusCode,
        headers: &mut HeaderMap,
        apply_headers: impl FnOnce(&Mutations, &mut HeaderMap),
    ) -> Option<Bytes> {
        if let Some(new) = self.status {
            *status = new;
        }
        if self.body.is_some() {
            // The old body's type does not describe the new one.
            headers.remove(CONTENT_TYPE);
        }
        if let Some(mutations) = &self.headers {
            apply_headers(mutations, headers);
        }
        let body = self.body.as_ref()?;
        // The new body is sent as it is: not compressed, not chunked.
        headers.remove(CONTENT_ENCODING);
        headers.remove(TRANSFER_ENCODING);
        headers.insert(CONTENT_LENGTH, HeaderValue::from(body.len()));
        if !headers.contains_key(CONTENT_TYPE) {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        }
        Some(body.clone())
    }
}
