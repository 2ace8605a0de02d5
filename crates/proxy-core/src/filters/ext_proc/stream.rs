//! One exchange's stream to the processor, shared by its phases. Messages go out in the order
//! sent; a task of the stream reads the answers and hands each to the phase waiting for it (an
//! answer about the request to the request's phase, one about the response to the
//! response's), so a request body still streaming and the response's headers can be answered
//! side by side, as Envoy's processors answer them. Each answer is awaited within
//! `message_timeout`. Once no phase holds the stream it is half closed and read to the
//! processor's end (its status), as a gRPC client ends a call; after a failure it is reset.

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
    /// Processing is over for this exchange (a failure another phase met, or the exchange
    /// gave the stream up): it goes on unprocessed, and nothing is counted again.
    #[error("processing is over for this exchange")]
    Over,
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
            stream.check()?;
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

impl Drop for Session {
    /// An exchange that ends without finishing (cancelled, a tunnel) resets the stream.
    fn drop(&mut self) {
        self.abandon();
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
    /// The failure of the stream that no phase was waiting for: the next to send learns it.
    error: RefCell<Option<ProcessorError>>,
    /// Tells its reader that the stream was dropped: whether to read it to its end.
    stop: Option<oneshot::Sender<Ending>>,
}

#[derive(Default)]
struct Waiting {
    request: VecDeque<oneshot::Sender<Answered>>,
    response: VecDeque<oneshot::Sender<Answered>>,
}

impl Waiting {
    /// Who waits for `answer`: the first phase of the side it is about, else the first of
    /// the other (which finds it out of turn). An immediate response goes to the response's
    /// phase where one waits (the response has not gone: it takes its place), else the
    /// request's.
    fn for_answer(&mut self, answer: &ProcessingResponse) -> Option<oneshot::Sender<Answered>> {
        let about_response = match answer.response {
            Some(Answer::ResponseHeaders(_) | Answer::ResponseBody(_) | Answer::ResponseTrailers(_)) => true,
            Some(Answer::ImmediateResponse(_)) => !self.response.is_empty(),
            _ => false,
        };
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
        let stop = Some(stop);
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
            error: RefCell::new(None),
            stop,
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
        self.check()?;
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

    /// A failure ended it: it is reset, not half closed, and nothing more goes on it.
    pub(super) fn abandon(&self) {
        self.failed.set(true);
    }

    /// Whether messages may still go on it: after a failure, the failure no phase learnt of
    /// yet (once), else that processing is over.
    fn check(&self) -> Result<(), ProcessorError> {
        if !self.failed.get() {
            return Ok(());
        }
        Err(self.error.borrow_mut().take().unwrap_or(ProcessorError::Over))
    }
}

/// How a dropped stream ends.
enum Ending {
    /// Half closed: the processor ends its side, and its reader reads on to that end (for at
    /// most [`CLOSING_TIME`]). Resetting every stream instead would spend the connection's
    /// allowance of locally reset streams, after which h2 closes it.
    Closing,
    /// After a failure: reset at once.
    Reset,
}

/// How long a half-closed stream's reader waits for the processor to end its side (Envoy's
/// `deferred_close_timeout` default), before the stream is reset.
const CLOSING_TIME: Duration = Duration::from_secs(5);

impl Drop for Stream {
    fn drop(&mut self) {
        let closing = !self.failed.get() && self.sender.get_mut().finish().is_ok();
        if closing {
            self.filter.stats.streams_closed.inc();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(if closing { Ending::Closing } else { Ending::Reset });
        }
    }
}

/// The stream's reader: hands each answer to its phase until the stream is dropped or ends.
/// The phases waiting when it fails learn why (the first) or that it ended.
async fn read_answers(
    stream: Weak<Stream>,
    mut receiver: DuplexReceiver,
    mut stopped: oneshot::Receiver<Ending>,
    filter: Rc<Inner>,
) {
    loop {
        let answer = tokio::select! {
            ending = &mut stopped => {
                if let Ok(Ending::Closing) = ending {
                    // What comes now has no one to go to; the stream ends with the processor's
                    // status, or is reset (dropped) when that does not come in time.
                    let rest = async { while next_answer(&mut receiver, &filter).await.is_ok() {} };
                    let _ = tokio::time::timeout(CLOSING_TIME, rest).await;
                }
                return;
            }
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
                // One phase learns why (and counts it); any other, that processing is over.
                stream.failed.set(true);
                let mut error = Some(error);
                let waiting = &mut *waiting;
                for phase in waiting.request.drain(..).chain(waiting.response.drain(..)) {
                    let _ = phase.send(Err(error.take().unwrap_or(ProcessorError::Over)));
                }
                *stream.error.borrow_mut() = error;
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
