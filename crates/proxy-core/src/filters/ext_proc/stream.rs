//! One exchange's stream to the processor: opened with the first message, each message's
//! answer awaited within `message_timeout`, half closed when nothing more will be sent.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode as pb_mode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use grpc_channel::{ChannelError, DuplexCall};
use prost::Message as _;

use super::Inner;
use config::{BodyMode, ProcessingMode};

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

    /// Sends `message` and waits for its answer (within the message timeout). The stream is
    /// opened by the first message.
    pub(super) async fn ask(
        &mut self,
        filter: &Inner,
        message: Message,
    ) -> Result<ProcessingResponse, ProcessorError> {
        let timeout = filter.config.message_timeout;
        let asked = async {
            self.send(filter, message).await?;
            self.recv(filter).await
        };
        let answered = match tokio::time::timeout(timeout, asked).await {
            Ok(answered) => answered,
            Err(_) => Err(timed_out(filter)),
        };
        if answered.is_err() {
            // Nothing more goes on this stream: it is reset when dropped.
            self.call = None;
        }
        answered
    }

    /// Sends `message`, opening the stream with the first, which also says which bodies will
    /// follow. Its answer is not awaited.
    pub(super) async fn send(&mut self, filter: &Inner, message: Message) -> Result<(), ProcessorError> {
        let protocol_config = self.call.is_none().then(|| ProtocolConfiguration {
            request_body_mode: body_mode(self.mode.request_body) as i32,
            response_body_mode: body_mode(self.mode.response_body) as i32,
            send_body_without_waiting_for_header_response: false,
        });
        if self.call.is_none() {
            let opened = filter.service.channel().open(filter.service.head()).await;
            self.call = Some(opened.map_err(ChannelError::from)?);
            filter.stats.streams_started.inc();
        }
        let Some(call) = self.call.as_mut() else {
            return Err(ProcessorError::Ended);
        };
        let request = ProcessingRequest {
            request: Some(message),
            protocol_config,
            ..Default::default()
        };
        call.send(&request.encode_to_vec())?;
        filter.stats.stream_msgs_sent.inc();
        Ok(())
    }

    /// The next answer (without a time limit: the caller has one). Cancelled, nothing is lost:
    /// what was read of an answer stays for the next call.
    pub(super) async fn recv(&mut self, filter: &Inner) -> Result<ProcessingResponse, ProcessorError> {
        let Some(call) = self.call.as_mut() else {
            return Err(ProcessorError::Ended);
        };
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

/// A message's answer did not come in time (counted).
pub(super) fn timed_out(filter: &Inner) -> ProcessorError {
    filter.stats.message_timeouts.inc();
    ProcessorError::Timeout(filter.config.message_timeout)
}

fn body_mode(mode: BodyMode) -> pb_mode::BodySendMode {
    match mode {
        BodyMode::None => pb_mode::BodySendMode::None,
        BodyMode::Buffered => pb_mode::BodySendMode::Buffered,
        BodyMode::BufferedPartial => pb_mode::BodySendMode::BufferedPartial,
        BodyMode::Streamed => pb_mode::BodySendMode::Streamed,
    }
}
