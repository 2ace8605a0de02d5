//! One exchange's stream to the processor: opened with the first message, each message's
//! answer awaited within `message_timeout`, half closed when nothing more will be sent.

use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use grpc_channel::{ChannelError, DuplexCall};
use prost::Message;

use super::Inner;
use config::ProcessingMode;

/// The method each exchange's stream calls.
pub(super) const PROCESS: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

/// The largest answer read: gRPC's usual limit on a received message.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// Why the processor gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcessorError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error("the processor ended the stream before answering")]
    Ended,
    #[error("cannot decode the answer: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("an answer out of turn (a {0} while waiting for the answer to the {1})")]
    Spurious(&'static str, &'static str),
    #[error("an immediate response, which the filter is set to refuse")]
    ImmediateRefused,
    #[error("a header change that is not allowed: {0}")]
    Mutation(String),
}

/// What one exchange has with the processor.
pub(crate) struct Session {
    /// Open from the first message sent.
    call: Option<DuplexCall>,
    /// What is sent, as the route says (and the processor may override).
    pub(super) mode: ProcessingMode,
    pub(super) failure_mode_allow: bool,
    /// A body the processor gave in its answer about a body, to put in place of what it was
    /// sent.
    pub(super) replaced_body: Option<bytes::Bytes>,
    /// The answer to the request headers asked for the route to be matched again, which
    /// happens once the body's answer is in.
    pub(super) clear_route: bool,
}

impl Session {
    pub(super) fn new(mode: ProcessingMode, failure_mode_allow: bool) -> Self {
        Self {
            call: None,
            mode,
            failure_mode_allow,
            replaced_body: None,
            clear_route: false,
        }
    }

    /// Whether the stream is open (a message was sent on it).
    pub(super) fn is_open(&self) -> bool {
        self.call.is_some()
    }

    /// Sends `message` and waits for its answer (within the message timeout). The stream is
    /// opened by the first message.
    pub(super) async fn ask(
        &mut self,
        filter: &Inner,
        message: ProcessingRequest,
    ) -> Result<ProcessingResponse, ProcessorError> {
        let timeout = filter.config.message_timeout;
        let asked = async {
            if self.call.is_none() {
                let opened = filter.service.channel().open(filter.service.head()).await;
                self.call = Some(opened.map_err(ChannelError::from)?);
                filter.stats.streams_started.inc();
            }
            let Some(call) = self.call.as_mut() else {
                return Err(ProcessorError::Ended);
            };
            call.send(&message.encode_to_vec())?;
            filter.stats.stream_msgs_sent.inc();
            loop {
                let Some(answer) = call.recv(MAX_ANSWER).await? else {
                    return Err(ProcessorError::Ended);
                };
                filter.stats.stream_msgs_received.inc();
                let answer = ProcessingResponse::decode(answer)?;
                // A request for more time is all such a message says (the rest is not read), and
                // it is ignored without `max_message_timeout` (not configurable here), as by
                // Envoy: the answer is still awaited.
                if answer.override_message_timeout.is_some() {
                    continue;
                }
                return Ok(answer);
            }
        };
        let answered = match tokio::time::timeout(timeout, asked).await {
            Ok(answered) => answered,
            Err(_) => {
                filter.stats.message_timeouts.inc();
                Err(ProcessorError::Timeout(timeout))
            }
        };
        if answered.is_err() {
            // Nothing more goes on this stream: it is reset when dropped.
            self.call = None;
        }
        answered
    }

    /// Whether the response is sent to the processor.
    pub(super) fn processes_response(&self) -> bool {
        self.mode.response_headers == config::HeaderMode::Send
            || self.mode.response_body != config::BodyMode::None
    }

    /// Ends the stream (a half close): the processor has had every message. Dropped, the
    /// stream is reset if the processor has not ended its side by then, as Envoy resets it
    /// when the exchange is done.
    pub(super) fn finish(&mut self, filter: &Inner) {
        if let Some(mut call) = self.call.take()
            && call.finish().is_ok()
        {
            filter.stats.streams_closed.inc();
        }
    }
}
