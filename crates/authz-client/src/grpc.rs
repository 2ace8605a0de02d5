//! gRPC mode: `envoy.service.auth.v3.Authorization/Check` on the client's one connection.
//!
//! A check is one unary call: the CheckRequest encoded once, into the one buffer that is its
//! gRPC frame and the request's only DATA frame; the answer read as one message and the
//! trailers' `grpc-status`.

use std::sync::Arc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::auth::v3::CheckResponse;
use grpc_channel::{CallError, Channel, ChannelError, call_head};
use h2::RecvStream;
use http::{Request, Response, Uri};
use prost::Message;

use crate::check_encoding::check_frame;
use crate::check_message::decision;
use crate::decision::Decision;
use crate::retry::Failed;
use crate::{AuthzError, CheckInput, Endpoint};

const CHECK_URI: &str = "http://ext-authz/envoy.service.auth.v3.Authorization/Check";
const CHECK_PATH: &str = "/envoy.service.auth.v3.Authorization/Check";

/// The largest answer read: gRPC's usual limit on a received message.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

pub(crate) struct GrpcChannel {
    channel: Channel,
    /// The call's URI, parsed once: a check clones it.
    check_uri: Uri,
    /// Which failed calls are tried again; `None`: none.
    retry: Option<Arc<dyn crate::CheckRetry>>,
}

impl GrpcChannel {
    pub(crate) fn new(endpoint: Endpoint) -> Self {
        Self {
            channel: Channel::new(endpoint),
            check_uri: Uri::from_static(CHECK_URI),
            retry: None,
        }
    }

    pub(crate) fn set_retry(&mut self, retry: Arc<dyn crate::CheckRetry>) {
        self.retry = Some(retry);
    }

    /// Calls go over TLS, with the `https` scheme.
    pub(crate) fn set_tls(&mut self, tls: crate::Tls) {
        let mut parts = self.check_uri.clone().into_parts();
        parts.scheme = Some(http::uri::Scheme::HTTPS);
        if let Ok(uri) = Uri::from_parts(parts) {
            self.check_uri = uri;
        }
        self.channel.set_tls(tls);
    }

    /// Calls go with this `:authority`; one that makes no URI keeps the default.
    pub(crate) fn set_authority(&mut self, authority: &str) {
        let scheme = self.check_uri.scheme_str().unwrap_or("http").to_owned();
        if let Ok(uri) = Uri::builder()
            .scheme(scheme.as_str())
            .authority(authority)
            .path_and_query(&CHECK_URI[CHECK_URI.len() - CHECK_PATH.len()..])
            .build()
        {
            self.check_uri = uri;
        }
    }

    /// One call, then retries as the policy allows (the caller's timeout bounds them all):
    /// a retry reads the answer's head, where a failed call's `grpc-status` is (trailers-only).
    pub(crate) async fn check(&self, input: &CheckInput<'_>) -> Result<Decision, AuthzError> {
        let frame = check_frame(input)?;
        let response = crate::retry::tries(
            self.retry.as_deref(),
            self.channel.backoff(),
            |response: &Response<RecvStream>| (response.status(), response.headers()),
            async || self.call(input, frame.clone()).await,
        )
        .await?;
        let message = grpc_channel::read_unary(response, MAX_ANSWER).await?;
        decision(decode(&message)?)
    }

    /// One Check call, up to its answer's head.
    async fn call(
        &self,
        input: &CheckInput<'_>,
        frame: Bytes,
    ) -> Result<Response<RecvStream>, Failed> {
        let mut head: Request<()> = call_head(self.check_uri.clone());
        input.put_trace_context(head.headers_mut());
        self.channel.call(head, frame).await.map_err(|e| match e {
            CallError::Connect(e) => Failed::Connect(e.into()),
            CallError::Reset(e) => Failed::Reset(e.into()),
            CallError::Refused(e) => Failed::Refused(e.into()),
        })
    }
}

fn decode(message: &[u8]) -> Result<CheckResponse, AuthzError> {
    CheckResponse::decode(message).map_err(|e| {
        AuthzError::from(ChannelError::Status {
            code: tonic::Code::Internal,
            message: format!("cannot decode the answer: {e}"),
        })
    })
}
