//! One exchange's stream to the processor, shared by its phases. Messages go out in the order
//! sent; a task of the stream reads the answers and hands each to the phase waiting for it (an
//! answer about the request to the request's phase, one about the response to the
//! response's), so a request body still streaming and the response's headers can be answered
//! side by side, as Envoy's processors answer them. Each answer is awaited within
//! `message_timeout`. The stream is half closed once no phase holds it, and reset instead
//! after a failure.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode as pb_mode;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
};
use grpc_channel::{ChannelError, DuplexCall, DuplexReceiver, DuplexSender};
use prost::Message as _;
use tokio::sync::oneshot;

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
    #[error("the stream failed before the answer came")]
    StreamFailed,
    #[error("cannot decode the answer: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("an answer out of turn (a {0} while waiting for the answer to the {1})")]
    Spurious(&'static str, &'static str),
    #[error("an immediate response, which the filter is set to refuse")]
    ImmediateRefused,
    #[error("a header change that is not allowed: {0}")]
    Mutation(String),
}

/// Which side of the exchange a message is about.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    Request,
    Response,
}

/// An answer, or why there is none.
pub(super) type Answered = Result<ProcessingResponse, ProcessorError>;

/// What one exchange has with the processor.
pub(crate) struct Session {
    /// Open from the first message (or a streamed body) on.
    stream: Option<Rc<Stream>>,
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
            stream: None,
            mode,
            failure_mode_allow,
            replaced_body: None,
            clear_route: false,
        }
    }

    /// The stream, opened (within the message timeout) if it is not yet.
    pub(super) async fn stream(&mut self, filter: &Rc<Inner>) -> Result<Rc<Stream>, ProcessorError> {
        if let Some(stream) = &self.stream {
            return Ok(Rc::clone(stream));
        }
        let head = filter.service.head();
        let opened = tokio::time::timeout(filter.config.message_timeout, filter.service.channel().open(head));
        let call = match opened.await {
            Ok(call) => call.map_err(ChannelError::from)?,
            Err(_) => return Err(timed_out(filter)),
        };
        filter.stats.streams_started.inc();
        let stream = Stream::start(filter, call, self.mode);
        self.stream = Some(Rc::clone(&stream));
        Ok(stream)
    }

    /// Sends `message` and waits for its answer (within the message timeout). After a
    /// failure nothing more goes on the stream.
    pub(super) async fn ask(&mut self, filter: &Rc<Inner>, direction: Direction, message: Message) -> Answered {
        let timeout = filter.config.message_timeout;
        let asked = async {
            let answer = self.stream(filter).await?.send(direction, message)?;
            answer.await.unwrap_or(Err(ProcessorError::Ended))
        };
        let answered = match tokio::time::timeout(timeout, asked).await {
            Ok(answered) => answered,
            Err(_) => Err(timed_out(filter)),
        };
        if answered.is_err() {
            self.abandon();
        }
        answered
    }

    /// Nothing more goes on the stream: it is reset, not half closed.
    pub(super) fn abandon(&mut self) {
        if let Some(stream) = self.stream.take() {
            stream.abandon();
        }
    }

    /// Whether the response is sent to the processor.
    pub(super) fn processes_response(&self) -> bool {
        self.mode.response_headers == config::HeaderMode::Send
            || self.mode.response_body != config::BodyMode::None
    }

    /// This phase is done with the stream: once no phase holds it, it is half closed (the
    /// processor has had every message), and reset if the processor has not ended its side
    /// by then, as Envoy resets it when the exchange is done.
    pub(super) fn finish(&mut self) {
        self.stream = None;
    }
}

/// An open stream.
pub(super) struct Stream {
    filter: Rc<Inner>,
    sender: RefCell<DuplexSender>,
    /// Each side's phases waiting for answers, in the order their messages went.
    waiting: RefCell<Waiting>,
    /// What the first message says: which bodies follow. Taken by the first message.
    protocol_config: Cell<Option<ProtocolConfiguration>>,
    /// A failure ended it: it is reset when dropped, not half closed.
    failed: Cell<bool>,
    /// Its reader stopped: no answer will come.
    closed: Cell<Closed>,
    /// Dropped with the stream, which stops its reader.
    _stop: oneshot::Sender<()>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Closed {
    Open,
    /// The processor ended its side (status OK).
    Ended,
    Failed,
}

impl Closed {
    /// What a phase learns that waits on a stream closed so.
    fn error(self) -> ProcessorError {
        match self {
            Closed::Ended => ProcessorError::Ended,
            Closed::Open | Closed::Failed => ProcessorError::StreamFailed,
        }
    }
}

#[derive(Default)]
struct Waiting {
    request: VecDeque<oneshot::Sender<Answered>>,
    response: VecDeque<oneshot::Sender<Answered>>,
}

impl Waiting {
    /// Who waits for `answer`: the first phase of the side it is about, else the first of
    /// the other (which finds it out of turn), an immediate response the request's first.
    fn for_answer(&mut self, answer: &ProcessingResponse) -> Option<oneshot::Sender<Answered>> {
        let about_response = matches!(
            answer.response,
            Some(Answer::ResponseHeaders(_) | Answer::ResponseBody(_) | Answer::ResponseTrailers(_))
        );
        let (first, second) = if about_response {
            (&mut self.response, &mut self.request)
        } else {
            (&mut self.request, &mut self.response)
        };
        first.pop_front().or_else(|| second.pop_front())
    }
}

impl Stream {
    fn start(filter: &Rc<Inner>, call: DuplexCall, mode: ProcessingMode) -> Rc<Self> {
        let (sender, receiver) = call.split();
        let (stop, stopped) = oneshot::channel();
        let stream = Rc::new(Stream {
            filter: Rc::clone(filter),
            sender: RefCell::new(sender),
            waiting: RefCell::default(),
            protocol_config: Cell::new(Some(ProtocolConfiguration {
                request_body_mode: body_mode(mode.request_body) as i32,
                response_body_mode: body_mode(mode.response_body) as i32,
                send_body_without_waiting_for_header_response: false,
            })),
            failed: Cell::new(false),
            closed: Cell::new(Closed::Open),
            _stop: stop,
        });
        tokio::task::spawn_local(read_answers(Rc::downgrade(&stream), receiver, stopped, Rc::clone(filter)));
        stream
    }

    /// Sends `message` (about `direction`'s side); its answer comes on what is returned.
    pub(super) fn send(
        &self,
        direction: Direction,
        message: Message,
    ) -> Result<oneshot::Receiver<Answered>, ProcessorError> {
        if self.closed.get() != Closed::Open {
            return Err(self.closed.get().error());
        }
        let request = ProcessingRequest {
            request: Some(message),
            protocol_config: self.protocol_config.take(),
            ..Default::default()
        };
        self.sender.borrow_mut().send(&request.encode_to_vec())?;
        self.filter.stats.stream_msgs_sent.inc();
        let (answer, answered) = oneshot::channel();
        let mut waiting = self.waiting.borrow_mut();
        match direction {
            Direction::Request => waiting.request.push_back(answer),
            Direction::Response => waiting.response.push_back(answer),
        }
        Ok(answered)
    }

    /// A failure ended it: it is reset, not half closed.
    pub(super) fn abandon(&self) {
        self.failed.set(true);
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.failed.get() && self.sender.get_mut().finish().is_ok() {
            self.filter.stats.streams_closed.inc();
        }
    }
}

/// The stream's reader: hands each answer to its phase until the stream is dropped or ends.
/// The phases waiting when it fails learn why (the first) or that it ended.
async fn read_answers(
    stream: Weak<Stream>,
    mut receiver: DuplexReceiver,
    mut stopped: oneshot::Receiver<()>,
    filter: Rc<Inner>,
) {
    loop {
        let answer = tokio::select! {
            _ = &mut stopped => return,
            answer = next_answer(&mut receiver, &filter) => answer,
        };
        let Some(stream) = stream.upgrade() else {
            return;
        };
        let mut waiting = stream.waiting.borrow_mut();
        match answer {
            Ok(answer) => match waiting.for_answer(&answer) {
                Some(phase) => {
                    let _ = phase.send(Ok(answer));
                }
                // Nothing was asked: ignored, and counted.
                None => filter.stats.spurious_msgs_received.inc(),
            },
            Err(error) => {
                let closed = if matches!(error, ProcessorError::Ended) {
                    Closed::Ended
                } else {
                    Closed::Failed
                };
                stream.closed.set(closed);
                let mut error = Some(error);
                let waiting = &mut *waiting;
                for phase in waiting.request.drain(..).chain(waiting.response.drain(..)) {
                    let _ = phase.send(Err(error.take().unwrap_or_else(|| closed.error())));
                }
                return;
            }
        }
    }
}

/// The next answer. A request for more time is all such a message says (the rest is not
/// read), and it is ignored without `max_message_timeout` (not configurable here), as by
/// Envoy: the answer is still awaited.
async fn next_answer(receiver: &mut DuplexReceiver, filter: &Inner) -> Answered {
    loop {
        let Some(answer) = receiver.recv(MAX_ANSWER).await? else {
            return Err(ProcessorError::Ended);
        };
        filter.stats.stream_msgs_received.inc();
        let answer = ProcessingResponse::decode(answer)?;
        if answer.override_message_timeout.is_none() {
            return Ok(answer);
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
