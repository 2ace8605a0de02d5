//! A body streamed to the processor (`streamed` mode): each chunk is sent as it comes and
//! passed on, changed or not, when its answer comes, in order. Chunks sent and not yet
//! answered are held up to the buffer limit; past it the body is not read on until answers
//! come, so a slow processor slows the sender instead of growing a queue. A task of its own
//! does this, between the body as it comes and a pipe to where it goes.

use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::HttpBody;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use http::StatusCode;
use http_body::{Body, Frame};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::stream::{ProcessorError, Session, timed_out};
use super::{Inner, LocalReply, answer_name, messages};
use crate::context::body_pipe::PipeSender;
use crate::error::BodyError;

/// Which body is streamed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    Request,
    Response,
}

/// How streaming a body ended.
pub(crate) enum Streamed {
    /// Every chunk was answered: the stream, for what is still to be sent.
    Done(Box<Session>),
    /// Nothing more is sent: the body went on unprocessed (a failure the filter lets through,
    /// or the processor ended the stream), failed on its own, or lost its reader.
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

/// A chunk sent and not yet answered.
struct Chunk {
    data: Bytes,
    /// The body's last.
    end: bool,
    /// Its answer is due by then.
    due: Instant,
}

/// Streams `body` through the processor on a task of its own, its chunks as answered going
/// to `out`. The outcome comes when the body is done with.
pub(super) fn start<B>(
    filter: Rc<Inner>,
    session: Box<Session>,
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
        let pump = Pump {
            filter,
            body,
            out,
            direction,
            listener,
            held: VecDeque::new(),
            held_bytes: 0,
            read_all: false,
            trailers: None,
        };
        let _ = done.send(pump.run(session).await);
    });
    outcome
}

struct Pump<B> {
    filter: Rc<Inner>,
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
    async fn run(mut self, mut session: Box<Session>) -> Streamed {
        let filter = Rc::clone(&self.filter);
        let limit = filter.config.buffer_limit as usize;
        loop {
            if self.read_all && self.held.is_empty() {
                break;
            }
            let due = self.held.front().map(|chunk| chunk.due);
            let can_read = !self.read_all && self.held_bytes <= limit;
            tokio::select! {
                frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)), if can_read => {
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
                            self.out.fail(error).await;
                            return Streamed::Over;
                        }
                    };
                    if data.is_empty() && !end {
                        continue;
                    }
                    self.read_all = end;
                    let message = self.message(&data, end);
                    let sent = tokio::time::timeout(filter.config.message_timeout, session.send(&filter, message)).await;
                    self.held_bytes += data.len();
                    self.held.push_back(Chunk { data, end, due: Instant::now() + filter.config.message_timeout });
                    match sent {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => return self.give_up(error, &session).await,
                        Err(_) => return self.give_up(timed_out(&filter), &session).await,
                    }
                }
                answer = session.recv(&filter), if due.is_some() => {
                    let answer = match answer {
                        Ok(answer) => answer,
                        Err(error) => return self.give_up(error, &session).await,
                    };
                    let common = match (answer.response, self.direction) {
                        (Some(Answer::RequestBody(body)), Direction::Request)
                        | (Some(Answer::ResponseBody(body)), Direction::Response) => body.response,
                        (Some(Answer::ImmediateResponse(reply)), _) => {
                            return match filter.immediate(reply) {
                                Ok(reply) => {
                                    self.out.fail(Box::new(ProcessorStopped)).await;
                                    Streamed::Reply(reply)
                                }
                                Err(error) => self.give_up(error, &session).await,
                            };
                        }
                        (other, _) => {
                            filter.stats.spurious_msgs_received.inc();
                            let error = ProcessorError::Spurious(answer_name(other.as_ref()), self.expected());
                            return self.give_up(error, &session).await;
                        }
                    };
                    let Some(chunk) = self.held.pop_front() else {
                        continue;
                    };
                    self.held_bytes -= chunk.data.len();
                    // The headers have gone on: only the body can change now (as in Envoy,
                    // which ignores a header change here).
                    let data = common
                        .and_then(|common| messages::new_body(common.body_mutation.as_ref()))
                        .unwrap_or(chunk.data);
                    if !self.pass_on(data, chunk.end).await {
                        return Streamed::Over;
                    }
                }
                () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                    return self.give_up(timed_out(&filter), &session).await;
                }
            }
        }
        Streamed::Done(session)
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
    async fn give_up(mut self, error: ProcessorError, session: &Session) -> Streamed {
        if let Some(status) = self.filter.failure_status(&error, session, &self.listener) {
            self.out.fail(Box::new(ProcessorStopped)).await;
            return Streamed::Failed(status);
        }
        while let Some(chunk) = self.held.pop_front() {
            if !self.pass_on(chunk.data, chunk.end).await {
                return Streamed::Over;
            }
        }
        while !self.read_all {
            let next = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await;
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
