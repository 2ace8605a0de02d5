//! A body streamed to the processor (`streamed` mode): each chunk is sent as it comes and
//! passed on, changed or not, when its answer comes, in order. Chunks sent and not yet
//! answered are held up to the buffer limit; past it the body is not read on until answers
//! come, so a slow processor slows the sender instead of growing a queue. A task of its own
//! does this, between the body as it comes and a pipe to where it goes, beside the exchange's
//! other phases on the same stream.

use std::collections::VecDeque;
use std::rc::Rc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::HttpBody;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use http::StatusCode;
use http_body::{Body, Frame};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::stream::{Answered, Direction, ProcessorError, Stream, timed_out};
use super::{Inner, LocalReply, answer_name, messages};
use crate::context::body_pipe::PipeSender;
use crate::error::BodyError;

/// How streaming a body ended.
pub(crate) enum Streamed {
    /// Every chunk was answered.
    Done,
    /// The body's reader went away before its end (an upstream that answered without
    /// reading it all, a client gone).
    Unread,
    /// Nothing more goes to the processor: the body went on unprocessed (a failure the
    /// filter lets through, or the processor ended the stream), or failed on its own.
    Over,
    /// The processor answered the client itself; the body was cut short.
    Reply(LocalReply),
    /// The processor failed, and the exchange with it: the status to answer; the body was cut
    /// short.
    Failed(StatusCode),
}

/// Why a streamed body was cut short: the processor answered the client, or failed.
#[derive(Debug, thiserror::Error)]
#[error("the external processor stopped the body")]
pub(crate) struct ProcessorStopped;

/// What a chunk held awaiting its answer costs besides its bytes (the chunk, its message),
/// so that many small chunks count against the limit too.
const CHUNK_COST: usize = 64;

/// A chunk sent and not yet answered.
struct Chunk {
    data: Bytes,
    /// The body's last.
    end: bool,
    answer: oneshot::Receiver<Answered>,
    /// Its answer is due by then.
    due: Instant,
}

/// Streams `body` through the processor on a task of its own, its chunks as answered going
/// to `out`. The outcome comes when the body is done with.
pub(super) fn start<B>(
    filter: Rc<Inner>,
    stream: Rc<Stream>,
    failure_mode_allow: bool,
    body: B,
    out: PipeSender,
    direction: Direction,
    listener: String,
) -> oneshot::Receiver<Streamed>
where
    B: Body<Data = Bytes, Error = BodyError> + Unpin + 'static,
{
    let (done, outcome) = oneshot::channel();
    tokio::task::spawn_local(async move {
        let mut pump = Pump {
            outcome: Some(done),
            filter,
            stream,
            failure_mode_allow,
            body,
            out,
            direction,
            listener,
            held: VecDeque::new(),
            held_bytes: 0,
            read_all: false,
            trailers: None,
        };
        let ended = pump.run().await;
        pump.decide(ended);
    });
    outcome
}

struct Pump<B> {
    /// Where how it ends is told, as soon as that is known (before the body is cut short or
    /// drained, which may wait on its reader).
    outcome: Option<oneshot::Sender<Streamed>>,
    filter: Rc<Inner>,
    stream: Rc<Stream>,
    failure_mode_allow: bool,
    body: B,
    out: PipeSender,
    direction: Direction,
    listener: String,
    /// Sent, awaiting answers, in order.
    held: VecDeque<Chunk>,
    held_bytes: usize,
    /// The body's end was read (and sent).
    read_all: bool,
    /// The body's trailers: passed on after its last chunk.
    trailers: Option<http::HeaderMap>,
}

impl<B> Pump<B>
where
    B: Body<Data = Bytes, Error = BodyError> + Unpin,
{
    async fn run(&mut self) -> Streamed {
        let filter = Rc::clone(&self.filter);
        let limit = filter.config.buffer_limit as usize;
        loop {
            if self.read_all && self.held.is_empty() {
                break;
            }
            let due = self.held.front().map(|chunk| chunk.due);
            let can_read = !self.read_all && self.held_bytes <= limit;
            tokio::select! {
                // An answer that came is taken before its deadline is looked at: a pump held
                // back by a slow reader must not time out answers waiting for it.
                biased;
                answer = front_answer(&mut self.held) => {
                    let answer = match answer {
                        Ok(answer) => answer,
                        Err(error) => return self.give_up(error).await,
                    };
                    let common = match (answer.response, self.direction) {
                        (Some(Answer::RequestBody(body)), Direction::Request)
                        | (Some(Answer::ResponseBody(body)), Direction::Response) => body.response,
                        (Some(Answer::ImmediateResponse(reply)), _) => {
                            return match filter.immediate(reply) {
                                Ok(reply) => {
                                    self.decide(Streamed::Reply(reply));
                                    self.stop().await;
                                    Streamed::Over
                                }
                                Err(error) => self.give_up(error).await,
                            };
                        }
                        (other, _) => {
                            filter.stats.spurious_msgs_received.inc();
                            let error = ProcessorError::Spurious(answer_name(other.as_ref()), self.expected());
                            return self.give_up(error).await;
                        }
                    };
                    let Some(chunk) = self.held.pop_front() else {
                        continue;
                    };
                    self.held_bytes -= chunk.data.len() + CHUNK_COST;
                    // The headers have gone on: only the body can change now (as in Envoy,
                    // which ignores a header change here).
                    let data = common
                        .and_then(|common| messages::new_body(common.body_mutation.as_ref()))
                        .unwrap_or(chunk.data);
                    if !self.pass_on(data, chunk.end).await {
                        return Streamed::Unread;
                    }
                }
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    return self.give_up(timed_out(&filter)).await;
                }
                () = self.out.closed() => return Streamed::Unread,
                frame = std::future::poll_fn(|cx| std::pin::Pin::new(&mut self.body).poll_frame(cx)), if can_read => {
                    let (data, end) = match frame {
                        Some(Ok(frame)) => match frame.into_data() {
                            Ok(data) => {
                                let end = self.body.is_end_stream();
                                (data, end)
                            }
                            Err(frame) => {
                                self.trailers = frame.into_trailers().ok();
                                (Bytes::new(), true)
                            }
                        },
                        None => (Bytes::new(), true),
                        Some(Err(error)) => {
                            // The body's own failure goes on as it is; the stream is reset.
                            self.stream.abandon();
                            self.out.fail(error).await;
                            return Streamed::Over;
                        }
                    };
                    if data.is_empty() && !end {
                        continue;
                    }
                    self.read_all = end;
                    let message = self.message(&data, end);
                    let answer = match self.stream.send(self.direction, message) {
                        Ok(answer) => answer,
                        Err(error) => {
                            self.hold(data, end, None);
                            return self.give_up(error).await;
                        }
                    };
                    self.hold(data, end, Some(answer));
                }
            }
        }
        Streamed::Done
    }

    /// Holds a chunk sent until its answer comes (one that could not be sent, until it is
    /// passed on unprocessed).
    fn hold(&mut self, data: Bytes, end: bool, answer: Option<oneshot::Receiver<Answered>>) {
        // A chunk never sent has no answer coming: a closed receiver stands for it.
        let answer = answer.unwrap_or_else(|| oneshot::channel().1);
        self.held_bytes += data.len() + CHUNK_COST;
        let due = Instant::now() + self.filter.config.message_timeout;
        self.held.push_back(Chunk { data, end, answer, due });
    }

    /// Tells how it ends (the first time only).
    fn decide(&mut self, ended: Streamed) {
        if let Some(outcome) = self.outcome.take() {
            let _ = outcome.send(ended);
        }
    }

    /// The processor answered the client, or failed the exchange: the body is cut short, and
    /// nothing more goes on the stream.
    async fn stop(&mut self) {
        self.stream.abandon();
        self.out.fail(Box::new(ProcessorStopped)).await;
    }

    /// A chunk's message to the processor.
    fn message(&self, data: &Bytes, end: bool) -> Message {
        let body = HttpBody {
            body: data.to_vec(),
            end_of_stream: end,
            ..Default::default()
        };
        match self.direction {
            Direction::Request => Message::RequestBody(body),
            Direction::Response => Message::ResponseBody(body),
        }
    }

    fn expected(&self) -> &'static str {
        match self.direction {
            Direction::Request => "request_body",
            Direction::Response => "response_body",
        }
    }

    /// Passes a chunk on; the body's last also takes its trailers. `false` once the body's
    /// reader has gone.
    async fn pass_on(&mut self, data: Bytes, end: bool) -> bool {
        let trailers = if end { self.trailers.take() } else { None };
        if (!data.is_empty() || end) && !self.out.send(Frame::data(data), end && trailers.is_none()).await {
            return false;
        }
        match trailers {
            Some(trailers) => self.out.send(Frame::trailers(trailers), true).await,
            None => true,
        }
    }

    /// The processor failed: the body goes on unprocessed (`failure_mode_allow`, or a stream
    /// the processor ended), or is cut short for the exchange to fail.
    async fn give_up(&mut self, error: ProcessorError) -> Streamed {
        self.stream.abandon();
        if let Some(status) = self.filter.failure_status(&error, self.failure_mode_allow, &self.listener) {
            self.decide(Streamed::Failed(status));
            self.out.fail(Box::new(ProcessorStopped)).await;
            return Streamed::Over;
        }
        self.decide(Streamed::Over);
        while let Some(chunk) = self.held.pop_front() {
            if !self.pass_on(chunk.data, chunk.end).await {
                return Streamed::Over;
            }
        }
        while !self.read_all {
            let next = tokio::select! {
                () = self.out.closed() => break,
                next = std::future::poll_fn(|cx| std::pin::Pin::new(&mut self.body).poll_frame(cx)) => next,
            };
            match next {
                Some(Ok(frame)) => {
                    let end = self.body.is_end_stream();
                    self.read_all = end;
                    if !self.out.send(frame, end).await {
                        break;
                    }
                }
                None => {
                    self.read_all = true;
                    self.out.send(Frame::data(Bytes::new()), true).await;
                }
                Some(Err(error)) => {
                    self.out.fail(error).await;
                    break;
                }
            }
        }
        Streamed::Over
    }
}

/// The answer to the first chunk held; never, while none is.
async fn front_answer(held: &mut VecDeque<Chunk>) -> Answered {
    match held.front_mut() {
        Some(chunk) => (&mut chunk.answer).await.unwrap_or(Err(ProcessorError::Ended)),
        None => std::future::pending().await,
    }
}
