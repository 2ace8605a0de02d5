//! The `ext_proc` filter (Envoy's): each exchange gets a stream to the external processor
//! (`envoy.service.ext_proc.v3.ExternalProcessor/Process`) on the worker's one connection to
//! it. The processor is sent the request's headers, its body (buffered, whole or its start),
//! the response's headers and body, as the processing mode says, and answers each message:
//! go on (with header and body changes), or answer the client itself. A streamed body goes
//! through the processor chunk by chunk on a task of its own (`streamed.rs`). A processor that fails
//! or is too slow (`message_timeout`) fails the exchange with `status_on_error`, or with
//! `failure_mode_allow` lets it go on unprocessed.

mod messages;
mod stream;
mod streamed;

use std::rc::Rc;

use tokio::sync::oneshot::error::TryRecvError;

use bytes::Bytes;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    CommonResponse, HttpBody, HttpHeaders, ProcessingResponse, common_response::ResponseStatus,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode as pb_mode;
use http::{Request, Response, StatusCode};
use http_body::Body;

use super::grpc_service::{ServiceChannel, service_tls};
use super::{
    ResponseBody, BuildCtx, Exchange, Flow, HeadersFlow, HttpFilter, LocalReply, PerRouteSettings, ResponseCtx,
};
use crate::catalog::ExtProcStats;
use crate::context::RequestBody;
use crate::error::ProxyError;
use crate::throttle::LogThrottle;
use config::{BodyMode, ExtProcConfig, HeaderMode, ProcessingMode};
use messages::Head;
use stream::{PROCESS, ProcessorError, Session};
use stream::Direction;
use streamed::Streamed;

/// The filter on one worker. Behind a pointer: its client is large, most filters are a few
/// words, and a streamed body's task holds it too.
pub(crate) struct ExtProc(Rc<Inner>);

pub(crate) struct Inner {
    service: ServiceChannel,
    config: ExtProcConfig,
    /// The processing and failure modes by route.
    settings: PerRouteSettings<Modes>,
    stats: ExtProcStats,
    /// Failures, logged at most once a second: a dead processor must not flood the log.
    errors: LogThrottle,
}

#[derive(Clone, Copy)]
struct Modes {
    mode: ProcessingMode,
    failure_mode_allow: bool,
}

/// The exchange's stream, from the request phase to the response phase.
#[derive(Default)]
pub(crate) enum State {
    #[default]
    Idle,
    Open(Box<Session>),
    /// The request body is streaming through the processor, on a task of its own: how that
    /// ends, and the stream for the response (where it is processed).
    Streaming {
        outcome: tokio::sync::oneshot::Receiver<Streamed>,
        session: Option<Box<Session>>,
    },
}

impl HttpFilter for ExtProc {
    type Config = ExtProcConfig;
    /// TLS to the processor, its files read once per generation rather than by each worker.
    type Shared = grpc_channel::Tls;
    type State = State;

    fn shared(config: &ExtProcConfig, _: &config::ListenerConfig, _: &str) -> Option<grpc_channel::Tls> {
        service_tls(&config.service, "ext_proc")
    }

    fn new(config: &ExtProcConfig, tls: Option<&grpc_channel::Tls>, ctx: &BuildCtx<'_>) -> Self {
        let listener = config::ExtProcRoute::default();
        // A route's own modes, with the listener's where it gives none.
        let modes = |route: &config::ExtProcRoute| Modes {
            mode: route.processing_mode.unwrap_or(config.processing_mode),
            failure_mode_allow: route.failure_mode_allow.unwrap_or(config.failure_mode_allow),
        };
        ExtProc(Rc::new(Inner {
            service: ServiceChannel::new(&config.service, tls.cloned(), "ext_proc", PROCESS),
            config: config.clone(),
            settings: PerRouteSettings::new(&listener, ctx.table, ctx.filter, |f| &f.ext_proc, modes),
            stats: ctx.catalog.ext_proc(ctx.shard, &ctx.listener.name),
            errors: LogThrottle::default(),
        }))
    }

    /// The processor sees the request's `x-request-id`, as Envoy's connection manager sets it
    /// before the filters.
    fn uses_request_id(&self) -> bool {
        true
    }

    async fn on_request_headers(
        &self,
        req: &mut Request<RequestBody>,
        exchange: &Exchange<'_>,
        state: &mut State,
    ) -> Result<HeadersFlow, ProxyError> {
        let inner = &self.0;
        let Some(modes) = inner.settings.get(exchange) else {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        };
        if !modes.mode.sends_anything() {
            return Ok(HeadersFlow::Flow(Flow::Continue));
        }
        let mut session = Box::new(Session::new(modes.mode, modes.failure_mode_allow));
        let mut flow = Flow::Continue;
        if session.mode.request_headers == HeaderMode::Send {
            let scheme = if exchange.conn.listener.tls { "https" } else { "http" };
            let headers = messages::request_headers(
                req.method(),
                req.uri(),
                req.headers(),
                exchange.host_text(),
                scheme,
            );
            let message = Message::RequestHeaders(HttpHeaders {
                headers: Some(headers),
                end_of_stream: req.body().is_end_stream(),
                ..Default::default()
            });
            // Boxed: the call's future is large, and only this filter needs it.
            let answer = Box::pin(session.ask(inner, Direction::Request, message)).await;
            match inner.on_request_answer(answer, "request_headers", req, &mut session).await {
                Ok(Flow::Continue) => {}
                Ok(Flow::ClearRoute) => flow = Flow::ClearRoute,
                Ok(respond) => return Ok(HeadersFlow::Flow(respond)),
                Err(failed) => return Ok(HeadersFlow::Flow(inner.failed(failed, &mut session, exchange, state))),
            }
        }
        let body_mode = session.mode.request_body;
        if body_mode == BodyMode::Streamed && !req.body().is_end_stream() {
            let stream = match Box::pin(session.stream(inner)).await {
                Ok(stream) => stream,
                Err(failed) => return Ok(HeadersFlow::Flow(inner.failed(failed, &mut session, exchange, state))),
            };
            // Its length may change chunk by chunk: it goes on without one, as from Envoy.
            req.headers_mut().remove(http::header::CONTENT_LENGTH);
            let (client, out) = req.body_mut().pipe();
            let listener = exchange.conn.listener.name.clone();
            let allow = session.failure_mode_allow;
            let outcome = streamed::start(Rc::clone(inner), stream, allow, client, out, Direction::Request, listener);
            let session = if session.processes_response() {
                Some(session)
            } else {
                session.finish();
                None
            };
            *state = State::Streaming { outcome, session };
            return Ok(HeadersFlow::Flow(flow));
        }
        if body_mode != BodyMode::None && !req.body().is_end_stream() {
            // The route is matched again after the body's answer: the body is still sent.
            session.clear_route = matches!(flow, Flow::ClearRoute);
            *state = State::Open(session);
            return Ok(HeadersFlow::ReadBody(inner.config.buffer_limit as usize));
        }
        inner.keep_for_response(session, state);
        Ok(HeadersFlow::Flow(flow))
    }

    async fn on_request_body(
        &self,
        req: &mut Request<RequestBody>,
        start: &Bytes,
        whole: bool,
        exchange: &Exchange<'_>,
        state: &mut State,
    ) -> Result<Flow, ProxyError> {
        let inner = &self.0;
        let State::Open(mut session) = std::mem::take(state) else {
            return Ok(Flow::Continue);
        };
        if session.mode.request_body == BodyMode::Buffered && !whole {
            // Envoy's answer to a buffered body over the limit.
            return Ok(Flow::Respond(Box::new(LocalReply::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Bytes::from_static(b"Payload Too Large"),
            ))));
        }
        let message = Message::RequestBody(HttpBody {
            body: start.to_vec(),
            end_of_stream: whole,
            ..Default::default()
        });
        let answer = Box::pin(session.ask(inner, Direction::Request, message)).await;
        let flow = match inner.on_request_answer(answer, "request_body", req, &mut session).await {
            Ok(flow) => flow,
            Err(failed) => return Ok(inner.failed(failed, &mut session, exchange, state)),
        };
        if let Some(new_body) = session.replaced_body.take() {
            req.body_mut().replace_read_ahead(start.len(), new_body.clone());
            messages::set_length(req.headers_mut(), whole.then_some(new_body.len()));
        }
        if matches!(flow, Flow::Respond(_)) {
            return Ok(flow);
        }
        let flow = if session.clear_route { Flow::ClearRoute } else { flow };
        inner.keep_for_response(session, state);
        Ok(flow)
    }

    fn waits_on_response(&self, state: &State) -> bool {
        !matches!(state, State::Idle)
    }

    async fn on_response(
        &self,
        response: &mut Response<ResponseBody>,
        ctx: &ResponseCtx<'_>,
        state: &mut State,
    ) {
        let inner = &self.0;
        let (mut session, mut request_body) = match std::mem::take(state) {
            State::Idle => return,
            State::Open(session) => (session, None),
            // The request's body may still be streaming: the response goes on beside it, unless
            // the processor already answered or failed the exchange, or processing is over.
            State::Streaming { mut outcome, session } => {
                match outcome.try_recv() {
                    Ok(Streamed::Reply(reply)) => return *response = reply_response(reply),
                    Ok(Streamed::Failed(status)) => return *response = local_response(status, Bytes::new()),
                    Ok(Streamed::Over) | Err(TryRecvError::Closed) => return,
                    Ok(Streamed::Done | Streamed::Unread) | Err(TryRecvError::Empty) => {}
                }
                let Some(session) = session else {
                    return;
                };
                (session, Some(outcome))
            }
        };
        // A tunnel's bytes are not an HTTP body.
        if ctx.info.upgraded {
            return;
        }
        let next = Box::pin(inner.process_response(response, ctx, &mut session)).await;
        // The processor may have answered the client, or failed, about the request's body
        // meanwhile: the response has not gone, so that answer takes its place.
        match request_body.as_mut().map(|outcome| outcome.try_recv()) {
            Some(Ok(Streamed::Reply(reply))) => return *response = reply_response(reply),
            Some(Ok(Streamed::Failed(status))) => return *response = local_response(status, Bytes::new()),
            _ => {}
        }
        if next == Next::Stream {
            match Box::pin(session.stream(inner)).await {
                Ok(stream) => {
                    let (upstream, out) = response.body_mut().pipe();
                    let listener = ctx.exchange.conn.listener.name.clone();
                    let allow = session.failure_mode_allow;
                    // How it ends is the body's: the stream ends with it.
                    drop(streamed::start(Rc::clone(inner), stream, allow, upstream, out, Direction::Response, listener));
                }
                Err(error) => inner.response_failed(error, response, &mut session, ctx),
            }
        }
        session.finish();
    }
}

impl Inner {
    /// Makes the changes an answer about the request asks for: `Continue` (or `ClearRoute`),
    /// the processor's own answer, or why the answer fails the exchange.
    async fn on_request_answer(
        &self,
        answer: Result<ProcessingResponse, ProcessorError>,
        expected: &'static str,
        req: &mut Request<RequestBody>,
        session: &mut Session,
    ) -> Result<Flow, ProcessorError> {
        let answer = answer?;
        let common = match (answer.response, expected) {
            (Some(Answer::RequestHeaders(h)), "request_headers") => h.response,
            (Some(Answer::RequestBody(b)), "request_body") => b.response,
            (Some(Answer::ImmediateResponse(reply)), _) => {
                return self.immediate(reply).map(|r| Flow::Respond(Box::new(r)));
            }
            (other, expected) => {
                self.stats.spurious_msgs_received.inc();
                return Err(ProcessorError::Spurious(answer_name(other.as_ref()), expected));
            }
        };
        if expected == "request_headers" && self.config.allow_mode_override
            && let Some(mode) = answer.mode_override
        {
            session.mode = overridden(session.mode, self.config.processing_mode, &mode);
        }
        let Some(common) = common else {
            return Ok(Flow::Continue);
        };
        let (parts, body) = std::mem::replace(req, Request::new(RequestBody::empty())).into_parts();
        let mut parts = parts;
        let changed = self.apply_common(&common, &mut Head {
            headers: &mut parts.headers,
            path: Some(&mut parts.uri),
            status: None,
        });
        *req = Request::from_parts(parts, body);
        changed?;
        let replacing = common.status() == ResponseStatus::ContinueAndReplace;
        // A headers answer replaces the body only with CONTINUE_AND_REPLACE (as Envoy reads it).
        let mutation = common.body_mutation.as_ref().filter(|_| replacing || expected != "request_headers");
        if let Some(new_body) = messages::new_body(mutation) {
            if expected == "request_headers" {
                // Replaces the body before any of it is read: the client's is not sent. It is
                // read (within the buffer limit, which keeps the connection's framing) and
                // dropped; the rest of a longer one is dropped with it.
                if !req.body().is_end_stream() {
                    let _ = req.body_mut().read_whole(self.config.buffer_limit).await;
                }
                messages::set_length(req.headers_mut(), Some(new_body.len()));
                req.body_mut().replace_with(new_body);
                // Nothing more of the request is sent (CONTINUE_AND_REPLACE).
                session.mode.request_body = BodyMode::None;
            } else {
                session.replaced_body = Some(new_body);
            }
        }
        if common.status() == ResponseStatus::ContinueAndReplace {
            session.mode.request_body = BodyMode::None;
        }
        // Envoy clears the route only after a header change.
        if common.clear_route_cache && common.header_mutation.is_some() && !self.config.disable_clear_route_cache {
            return Ok(Flow::ClearRoute);
        }
        Ok(Flow::Continue)
    }

    /// The header changes of an answer; counts those refused.
    fn apply_common(&self, common: &CommonResponse, head: &mut Head<'_>) -> Result<(), ProcessorError> {
        let Some(mutation) = &common.header_mutation else {
            return Ok(());
        };
        let rejected = messages::apply_header_mutation(mutation, head)?;
        if rejected > 0 {
            self.stats.rejected_header_mutations.add(rejected);
        }
        Ok(())
    }

    fn immediate(
        &self,
        reply: envoy_types::pb::envoy::service::ext_proc::v3::ImmediateResponse,
    ) -> Result<LocalReply, ProcessorError> {
        if self.config.disable_immediate_response {
            self.stats.spurious_msgs_received.inc();
            return Err(ProcessorError::ImmediateRefused);
        }
        self.stats.immediate_responses.inc();
        Ok(messages::immediate_reply(reply))
    }

    /// After the request phases: the stream is kept for the response when it is sent, else
    /// ended.
    fn keep_for_response(&self, mut session: Box<Session>, state: &mut State) {
        if session.processes_response() {
            *state = State::Open(session);
        } else {
            session.finish();
        }
    }

    /// The processor failed: the exchange goes on unprocessed (`failure_mode_allow`), or is
    /// answered 504 (no answer in time) or `status_on_error`. A processor that ended the
    /// stream with an OK status has finished: the exchange goes on unprocessed, as in Envoy.
    fn failed(&self, error: ProcessorError, session: &mut Session, exchange: &Exchange<'_>, state: &mut State) -> Flow {
        *state = State::Idle;
        session.abandon();
        match self.failure_status(&error, session.failure_mode_allow, &exchange.conn.listener.name) {
            None => Flow::Continue,
            Some(status) => Flow::Respond(Box::new(LocalReply::new(status, Bytes::new()))),
        }
    }

    /// The status a failure answers with; `None` where the exchange goes on unprocessed.
    pub(super) fn failure_status(&self, error: &ProcessorError, failure_mode_allow: bool, listener: &str) -> Option<StatusCode> {
        match error {
            ProcessorError::Ended => {
                self.stats.streams_closed.inc();
                return None;
            }
            // Another phase met the failure, and counted it.
            ProcessorError::Over => return None,
            _ => {}
        }
        self.note_failure(error, failure_mode_allow, listener);
        // A change the processor asked for that cannot be made fails the exchange whatever the
        // failure mode, as Envoy's error answers do.
        let fatal = matches!(error, ProcessorError::Mutation(_));
        if failure_mode_allow && !fatal {
            self.stats.failure_mode_allowed.inc();
            return None;
        }
        Some(match error {
            ProcessorError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::from_u16(self.config.status_on_error).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        })
    }

    fn note_failure(&self, error: &ProcessorError, failure_mode_allow: bool, listener: &str) {
        // Envoy counts a failed stream for a gRPC error only.
        if matches!(error, ProcessorError::Channel(_) | ProcessorError::Decode(_)) {
            self.stats.streams_failed.inc();
        }
        if let Some(failed) = self.errors.hit() {
            tracing::warn!(
                listener,
                failed,
                failure_mode_allow,
                %error,
                "external processor failed"
            );
        }
    }

    /// The response's phases: its headers, then its body, as the mode says. A streamed body
    /// is left to stream.
    async fn process_response(
        self: &Rc<Self>,
        response: &mut Response<ResponseBody>,
        ctx: &ResponseCtx<'_>,
        session: &mut Session,
    ) -> Next {
        let has_body = !ctx.info.head_request && !response.body().is_end_stream();
        let sends_body = has_body && session.mode.response_body != BodyMode::None;
        if session.mode.response_headers == HeaderMode::Send {
            let message = Message::ResponseHeaders(HttpHeaders {
                headers: Some(messages::response_headers(response.status(), response.headers())),
                end_of_stream: !has_body,
                ..Default::default()
            });
            let answer = session.ask(self, Direction::Response, message).await;
            match self.on_response_answer(answer, "response_headers", response, session) {
                Ok(true) => {}
                Ok(false) => return Next::Done,
                Err(error) => {
                    self.response_failed(error, response, session, ctx);
                    return Next::Done;
                }
            }
        }
        if !sends_body || session.mode.response_body == BodyMode::None {
            return Next::Done;
        }
        if session.mode.response_body == BodyMode::Streamed {
            // Its length may change chunk by chunk, as from Envoy.
            response.headers_mut().remove(http::header::CONTENT_LENGTH);
            return Next::Stream;
        }
        let Some((start, whole)) = response.body_mut().read_front(self.config.buffer_limit as usize).await else {
            // The upstream failed mid-body: the client gets what came and that failure, as
            // without the filter.
            return Next::Done;
        };
        if session.mode.response_body == BodyMode::Buffered && !whole {
            // Envoy's answer to a buffered response body over the limit.
            *response = local_response(StatusCode::INTERNAL_SERVER_ERROR, Bytes::from_static(b"Internal Server Error"));
            return Next::Done;
        }
        let message = Message::ResponseBody(HttpBody {
            body: start.to_vec(),
            end_of_stream: whole,
            ..Default::default()
        });
        let answer = session.ask(self, Direction::Response, message).await;
        match self.on_response_answer(answer, "response_body", response, session) {
            Ok(_) => {
                if let Some(new_body) = session.replaced_body.take() {
                    messages::set_length(response.headers_mut(), whole.then_some(new_body.len()));
                    response.body_mut().replace_front(new_body);
                }
            }
            Err(error) => self.response_failed(error, response, session, ctx),
        }
        Next::Done
    }

    /// Makes the changes an answer about the response asks for: whether the response goes on
    /// to its next phase.
    fn on_response_answer(
        &self,
        answer: Result<ProcessingResponse, ProcessorError>,
        expected: &'static str,
        response: &mut Response<ResponseBody>,
        session: &mut Session,
    ) -> Result<bool, ProcessorError> {
        let answer = answer?;
        let common = match (answer.response, expected) {
            (Some(Answer::ResponseHeaders(h)), "response_headers") => h.response,
            (Some(Answer::ResponseBody(b)), "response_body") => b.response,
            (Some(Answer::ImmediateResponse(reply)), _) => {
                *response = reply_response(self.immediate(reply)?);
                return Ok(false);
            }
            (other, expected) => {
                self.stats.spurious_msgs_received.inc();
                return Err(ProcessorError::Spurious(answer_name(other.as_ref()), expected));
            }
        };
        if expected == "response_headers"
            && self.config.allow_mode_override
            && let Some(mode) = answer.mode_override
        {
            session.mode = overridden(session.mode, self.config.processing_mode, &mode);
        }
        let Some(common) = common else {
            return Ok(true);
        };
        let (mut parts, body) = std::mem::replace(response, Response::new(ResponseBody::local(Bytes::new()))).into_parts();
        let mut status = parts.status;
        let changed = self.apply_common(&common, &mut Head {
            headers: &mut parts.headers,
            path: None,
            status: Some(&mut status),
        });
        parts.status = status;
        *response = Response::from_parts(parts, body);
        changed?;
        let replacing = common.status() == ResponseStatus::ContinueAndReplace;
        let mutation = common.body_mutation.as_ref().filter(|_| replacing || expected != "response_headers");
        if let Some(new_body) = messages::new_body(mutation) {
            if expected == "response_headers" {
                messages::set_length(response.headers_mut(), Some(new_body.len()));
                *response.body_mut() = ResponseBody::local(new_body);
                session.mode.response_body = BodyMode::None;
            } else {
                session.replaced_body = Some(new_body);
            }
        }
        if common.status() == ResponseStatus::ContinueAndReplace {
            session.mode.response_body = BodyMode::None;
        }
        Ok(true)
    }

    /// The processor failed on the response: it goes on as it is (`failure_mode_allow`, or
    /// the processor ended the stream), or is replaced by 504 or `status_on_error`.
    fn response_failed(
        &self,
        error: ProcessorError,
        response: &mut Response<ResponseBody>,
        session: &mut Session,
        ctx: &ResponseCtx<'_>,
    ) {
        session.abandon();
        if let Some(status) = self.failure_status(&error, session.failure_mode_allow, &ctx.exchange.conn.listener.name) {
            *response = local_response(status, Bytes::new());
        }
    }
}

/// What is left of the response once its phases are through.
#[derive(PartialEq, Eq)]
enum Next {
    Done,
    /// Its body is to be streamed through the processor.
    Stream,
}

/// The processor's own answer, as the response.
fn reply_response(reply: LocalReply) -> Response<ResponseBody> {
    let mut response = local_response(reply.status, reply.body);
    *response.headers_mut() = reply.headers;
    response
}

fn local_response(status: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::local(body));
    *response.status_mut() = status;
    response
}

/// The name of an answer's kind, for an error about one out of turn.
fn answer_name(answer: Option<&Answer>) -> &'static str {
    match answer {
        None => "an empty answer",
        Some(Answer::RequestHeaders(_)) => "request_headers",
        Some(Answer::ResponseHeaders(_)) => "response_headers",
        Some(Answer::RequestBody(_)) => "request_body",
        Some(Answer::ResponseBody(_)) => "response_body",
        Some(Answer::RequestTrailers(_)) => "request_trailers",
        Some(Answer::ResponseTrailers(_)) => "response_trailers",
        Some(Answer::ImmediateResponse(_)) => "immediate_response",
        Some(Answer::StreamedImmediateResponse(_)) => "streamed_immediate_response",
    }
}

/// The mode a processor's `mode_override` asks for: what it cannot be (a full-duplex body)
/// keeps the current setting.
fn overridden(
    current: ProcessingMode,
    filter: ProcessingMode,
    mode: &envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode,
) -> ProcessingMode {
    // `DEFAULT` is the filter's own setting (not a route's), as Envoy reads an override.
    let header = |value: i32, default: HeaderMode| match pb_mode::HeaderSendMode::try_from(value) {
        Ok(pb_mode::HeaderSendMode::Skip) => HeaderMode::Skip,
        Ok(pb_mode::HeaderSendMode::Send) => HeaderMode::Send,
        Ok(pb_mode::HeaderSendMode::Default) | Err(_) => default,
    };
    let body = |value: i32, current: BodyMode| match pb_mode::BodySendMode::try_from(value) {
        Ok(pb_mode::BodySendMode::None) => BodyMode::None,
        Ok(pb_mode::BodySendMode::Buffered) => BodyMode::Buffered,
        Ok(pb_mode::BodySendMode::BufferedPartial) => BodyMode::BufferedPartial,
        Ok(pb_mode::BodySendMode::Streamed) => BodyMode::Streamed,
        _ => current,
    };
    ProcessingMode {
        request_headers: current.request_headers,
        response_headers: header(mode.response_header_mode, filter.response_headers),
        request_body: body(mode.request_body_mode, current.request_body),
        response_body: body(mode.response_body_mode, current.response_body),
    }
}
