//! The call to the rate limit service: `envoy.service.ratelimit.v3.RateLimitService/
//! ShouldRateLimit` on the worker's one connection to it, bounded by the filter's timeout.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use grpc_channel::{ChannelError, read_unary, unary_frame};
use prost::Message;

use crate::filters::grpc_service::ServiceChannel;
use config::GrpcService;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest answer read: gRPC's usual limit on a received message.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// One request's descriptor: its entries, and the hits it counts for (1 unless given).
pub(crate) struct Descriptor {
    pub(crate) entries: Vec<(String, String)>,
    pub(crate) hits_addend: Option<u64>,
}

/// Why a call gave no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CallError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error("cannot decode the answer: {0}")]
    Decode(#[from] prost::DecodeError),
}

/// A worker's client of the rate limit service.
pub(crate) struct RateLimitClient {
    service: ServiceChannel,
    timeout: Duration,
}

impl RateLimitClient {
    pub(crate) fn new(service: &GrpcService, tls: Option<grpc_channel::Tls>, timeout: Duration) -> Self {
        Self {
            service: ServiceChannel::new(service, tls, "ratelimit", PATH),
            timeout,
        }
    }

    /// Asks whether a request with these descriptors is over a limit, within the timeout.
    pub(crate) async fn should_rate_limit(
        &self,
        domain: &str,
        descriptors: Vec<Descriptor>,
    ) -> Result<RateLimitResponse, CallError> {
        let request = RateLimitRequest {
            domain: domain.to_owned(),
            descriptors: descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|(key, value)| Entry { key, value })
                        .collect(),
                    limit: None,
                    hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                    is_negative_hits: false,
                })
                .collect(),
            hits_addend: 0,
        };
        let frame = unary_frame(&request.encode_to_vec());
        let call = async {
            let answer = (self.service.channel())
                .call(self.service.head(), frame)
                .await
                .map_err(ChannelError::from)?;
            let message = read_unary(answer, MAX_ANSWER).await?;
            Ok::<_, CallError>(RateLimitResponse::decode(message)?)
        };
        tokio::time::timeout(self.timeout, call)
            .await
            .map_err(|_| CallError::Timeout(self.timeout))?
    }
}
