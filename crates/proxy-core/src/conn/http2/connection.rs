//! An HTTP/2 connection on Legate's own codec (`crates/http2`). This task owns the socket:
//! it reads (into a buffer it lets go of once the frames are taken), writes what the codec has
//! to send in one vectored write, and runs the connection's timers. Each request is served by
//! a task of its own (stream.rs), which hands its response to the codec through [`Shared`]
//! and wakes this task to write it; the request's body reaches it through an inbox that this
//! task fills, and the window goes back to the client as the body is taken.
//!
//! The codec bounds what a client can make the connection hold (its output, each body by its
//! window) and ends floods itself; they are counted here as hyper's were.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io::IoSlice;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use http::{HeaderMap, Method, StatusCode};
use http2::server::{Config, Connection, ConnectionError, Event, Flood};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::super::Codecs;
use super::super::io::DownstreamIo;
use super::super::service::ProxyService;
use super::{QUIET_CLOSE_GRACE, Quiet, stream};
use crate::context::stream_inbox::{self, Inbox, WakeCell};
use crate::context::{ConnCtx, RequestBody, SignalWatch, sleep_until_some};

/// How much one read takes at most (a stack buffer: an idle connection holds none).
const READ_SIZE: usize = 16 * 1024;
/// Slices gathered into one write.
const WRITE_SLICES: usize = 64;
/// The payload of this side's keep-alive PINGs.
const KEEPALIVE_PING: [u8; 8] = *b"legateka";

/// What the connection's task and its streams' tasks share.
pub(super) struct Shared {
    pub(super) codec: RefCell<Connection>,
    /// The connection's task: woken when a stream has queued output or taken body bytes.
    pub(super) wake: Rc<WakeCell>,
    streams: RefCell<HashMap<u32, Slot>>,
}

/// What the connection keeps of a stream being served.
struct Slot {
    /// Where its request body goes; `None` for a request without one.
    inbox: Option<Inbox>,
    task: Option<AbortHandle>,
    /// The codec has room for the DATA the stream's task was waiting to send.
    ready: bool,
    sender: Option<Waker>,
}

impl Shared {
    /// Resolves once the stream may send more DATA (or is gone).
    pub(super) async fn send_ready(&self, id: u32) {
        std::future::poll_fn(|cx| {
            let mut streams = self.streams.borrow_mut();
            let Some(slot) = streams.get_mut(&id) else {
                return Poll::Ready(());
            };
            if std::mem::take(&mut slot.ready) {
                return Poll::Ready(());
            }
            slot.sender = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }

    /// The stream's task is over: `finished`, its response was sent whole (a request still
    /// coming is then refused with `NO_ERROR`); otherwise the stream is reset (`CANCEL`), so
    /// the client never takes a cut-short response as whole.
    pub(super) fn finish(&self, id: u32, finished: bool) {
        self.streams.borrow_mut().remove(&id);
        let reason = if finished {
            http2::frame::Reason::NO_ERROR
        } else {
            http2::frame::Reason::CANCEL
        };
        self.codec.borrow_mut().reset(id, reason);
        self.wake.wake();
    }
}

/// Ends the streams' tasks when the connection goes.
struct AbortStreams(Rc<Shared>);

impl Drop for AbortStreams {
    fn drop(&mut self) {
        for (_, slot) in self.0.streams.borrow_mut().drain() {
            if let Some(task) = slot.task {
                task.abort();
            }
        }
    }
}

/// PINGs on a quiet connection: one every `interval`, answered within `timeout`.
struct Keepalive {
    interval: Duration,
    timeout: Duration,
    next: Instant,
    sent: Option<Instant>,
}

impl Keepalive {
    fn due(&self) -> Instant {
        self.sent.map_or(self.next, |sent| sent + self.timeout)
    }
}

/// What the socket did.
enum Io {
    Read,
    Wrote,
    Closed,
    Failed(std::io::Error),
}

pub(super) async fn serve(
    mut io: DownstreamIo,
    service: ProxyService,
    codecs: &Codecs,
    config: Config,
    mut drain: SignalWatch,
) {
    let ctx = Rc::clone(&service.conn);
    let shared = Rc::new(Shared {
        codec: RefCell::new(Connection::new(config)),
        wake: Rc::new(WakeCell::default()),
        streams: RefCell::new(HashMap::new()),
    });
    let _abort = AbortStreams(Rc::clone(&shared));
    let mut input = BytesMut::new();
    let recheck = codecs.idle_timeout.min(codecs.request_headers_timeout);
    let mut quiet_check = ctx.opened + recheck;
    let expires = ctx.expires_at();
    let mut expired = false;
    let mut going_away = false;
    // After GOAWAY, how long the client has to answer its PING before the final GOAWAY.
    let mut grace: Option<Instant> = None;
    let mut keepalive = codecs.h2_keepalive.map(|k| Keepalive {
        interval: k.interval,
        timeout: k.timeout,
        next: Instant::now() + k.interval,
        sent: None,
    });
    let mut needs_flush = false;
    let mut open = true;
    // The codec stopped reading for the output: frames may be left in `input`.
    let mut paused = false;
    let mut close_by: Option<Instant> = None;
    loop {
        dispatch(&shared, &service, codecs, keepalive.as_mut());
        if paused && !shared.codec.borrow().wants_write() {
            // Frames left by a read that paused for the output.
            paused = recv(&shared, &ctx, &mut input);
            continue;
        }
        let (done, output) = {
            let codec = shared.codec.borrow();
            (codec.is_done(), codec.output_len())
        };
        if (done || !open) && output == 0 && !needs_flush {
            break;
        }
        if (done || !open) && close_by.is_none() {
            // What is left to write gets the idle timeout, not forever: a client that stopped
            // reading does not hold the connection.
            close_by = Some(Instant::now() + codecs.idle_timeout);
        }
        let mut go_away = false;
        tokio::select! {
            biased;
            step = std::future::poll_fn(|cx| {
                poll_io(cx, &mut io, &shared, &mut input, &mut needs_flush, open && !done)
            }) => match step {
                Io::Read => paused = recv(&shared, &ctx, &mut input),
                Io::Wrote => {}
                Io::Closed => {
                    // The client closed its side: nothing more can be asked or answered.
                    open = false;
                    if shared.codec.borrow().output_len() == 0 {
                        break;
                    }
                }
                Io::Failed(error) => {
                    tracing::debug!(%error, "downstream HTTP/2 connection failed");
                    return;
                }
            },
            () = drain.raised(), if !going_away => go_away = true,
            _ = ctx.retire.notified(), if !going_away => go_away = true,
            () = sleep_until_some(expires), if !expired => {
                expired = true;
                ctx.listener.stats.cx_max_duration.inc();
                go_away = true;
            }
            () = tokio::time::sleep_until(quiet_check), if !going_away => {
                match super::quiet_check(&ctx, codecs, recheck) {
                    Quiet::LookAgainAt(at) => quiet_check = at,
                    Quiet::Due => go_away = true,
                }
            }
            () = sleep_until_some(close_by) => {
                tracing::debug!("downstream HTTP/2 connection: the client took nothing more");
                return;
            }
            () = sleep_until_some(grace) => {
                // The client did not answer the GOAWAY's PING: the final GOAWAY now.
                grace = None;
                shared.codec.borrow_mut().finish_drain();
            }
            () = sleep_until_some(keepalive.as_ref().map(Keepalive::due)) => {
                let Some(keepalive) = keepalive.as_mut() else { continue };
                if keepalive.sent.is_some() {
                    tracing::debug!("downstream HTTP/2 connection: no answer to a keep-alive PING");
                    return;
                }
                keepalive.sent = Some(Instant::now());
                shared.codec.borrow_mut().ping(KEEPALIVE_PING);
            }
        }
        if go_away && !going_away {
            // Streams in flight finish; the client opens a new connection for the rest.
            going_away = true;
            shared.codec.borrow_mut().go_away();
            grace = Some(Instant::now() + QUIET_CLOSE_GRACE);
        }
    }
    // Lingers: the client's last frames are read rather than reset.
    let _ = io.shutdown().await;
}

/// Reads the frames in `input`, counting a flood that ended the connection. Returns whether
/// the codec paused for its output (frames may be left).
fn recv(shared: &Shared, ctx: &ConnCtx, input: &mut BytesMut) -> bool {
    let mut codec = shared.codec.borrow_mut();
    let result = codec.recv(input, std::time::Instant::now());
    let paused = codec.wants_write();
    drop(codec);
    if input.is_empty() {
        // Nothing held while idle.
        *input = BytesMut::new();
    }
    if let Err(error) = result {
        count_flood(ctx, &error);
        tracing::debug!(%error, "downstream HTTP/2 connection ended with an error");
    }
    paused
}

fn count_flood(ctx: &ConnCtx, error: &ConnectionError) {
    let stats = &ctx.listener.stats;
    match error.flood {
        Some(Flood::Control) => stats.cx_h2_control_flood.inc(),
        Some(Flood::Continuation) => stats.cx_h2_continuation_flood.inc(),
        Some(Flood::Reset | Flood::StreamErrors) => stats.cx_h2_flood.inc(),
        None => {}
    }
}

/// Writes what the codec has to send (then flushes), and reads unless the output is over
/// its bound or reading is over.
fn poll_io(
    cx: &mut Context<'_>,
    io: &mut DownstreamIo,
    shared: &Shared,
    input: &mut BytesMut,
    needs_flush: &mut bool,
    read: bool,
) -> Poll<Io> {
    shared.wake.register(cx.waker());
    // Woken by a stream's reader taking body bytes: their window goes back now.
    give_back_window(shared);
    let mut codec = shared.codec.borrow_mut();
    let mut wrote = false;
    while codec.output_len() > 0 {
        let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
        let n = codec.output(&mut slices);
        match Pin::new(&mut *io).poll_write_vectored(cx, &slices[..n]) {
            Poll::Ready(Ok(0)) => {
                return Poll::Ready(Io::Failed(std::io::ErrorKind::WriteZero.into()));
            }
            Poll::Ready(Ok(written)) => {
                codec.advance_output(written);
                *needs_flush = true;
                wrote = true;
            }
            Poll::Ready(Err(error)) => return Poll::Ready(Io::Failed(error)),
            Poll::Pending => break,
        }
    }
    if codec.output_len() == 0 && *needs_flush {
        match Pin::new(&mut *io).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                *needs_flush = false;
                // The loop looks again: a connection that is done can close now.
                return Poll::Ready(Io::Wrote);
            }
            Poll::Ready(Err(error)) => return Poll::Ready(Io::Failed(error)),
            Poll::Pending => {}
        }
    }
    if wrote {
        // Streams waiting for room may send now: dispatch before reading on.
        return Poll::Ready(Io::Wrote);
    }
    if read && !codec.wants_write() {
        drop(codec);
        let mut buf = [0u8; READ_SIZE];
        let mut filled = ReadBuf::new(&mut buf);
        match Pin::new(&mut *io).poll_read(cx, &mut filled) {
            Poll::Ready(Ok(())) if filled.filled().is_empty() => return Poll::Ready(Io::Closed),
            Poll::Ready(Ok(())) => {
                input.extend_from_slice(filled.filled());
                return Poll::Ready(Io::Read);
            }
            Poll::Ready(Err(error)) => return Poll::Ready(Io::Failed(error)),
            Poll::Pending => {}
        }
    }
    Poll::Pending
}

/// Hands the codec's events on: requests to new stream tasks, body frames to their inboxes,
/// resets to the tasks they end, room to send to the tasks waiting for it.
fn dispatch(
    shared: &Rc<Shared>,
    service: &ProxyService,
    codecs: &Codecs,
    mut keepalive: Option<&mut Keepalive>,
) {
    loop {
        let event = shared.codec.borrow_mut().poll_event();
        let Some(event) = event else { return };
        match event {
            Event::Request {
                stream,
                head,
                end_stream,
            } => start(shared, service, codecs, stream, head, end_stream),
            Event::Data {
                stream,
                data,
                end_stream,
            } => {
                let len = data.len() as u32;
                let kept = shared
                    .streams
                    .borrow()
                    .get(&stream)
                    .and_then(|slot| slot.inbox.as_ref())
                    .is_some_and(|inbox| inbox.push(data, end_stream));
                if !kept {
                    // Nobody reads it: the window goes back at once.
                    shared.codec.borrow_mut().release(stream, len);
                }
            }
            Event::Trailers { stream, trailers } => {
                if let Some(inbox) = shared
                    .streams
                    .borrow()
                    .get(&stream)
                    .and_then(|slot| slot.inbox.as_ref())
                {
                    inbox.trailers(trailers);
                }
            }
            Event::Reset { stream, .. } => {
                // The client gave the stream up (or broke its rules): its service ends, and
                // the upstream request with it.
                let slot = shared.streams.borrow_mut().remove(&stream);
                if let Some(slot) = slot {
                    if let Some(inbox) = &slot.inbox {
                        inbox.fail();
                    }
                    if let Some(task) = slot.task {
                        task.abort();
                    }
                }
            }
            Event::SendReady { stream } => {
                if let Some(slot) = shared.streams.borrow_mut().get_mut(&stream) {
                    slot.ready = true;
                    if let Some(sender) = slot.sender.take() {
                        sender.wake();
                    }
                }
            }
            Event::Pong { payload } => {
                if payload == KEEPALIVE_PING
                    && let Some(keepalive) = keepalive.as_deref_mut()
                {
                    keepalive.sent = None;
                    keepalive.next = Instant::now() + keepalive.interval;
                }
            }
            Event::GoAway { .. } => {}
        }
    }
}

/// Gives the client window back for the body bytes the streams' readers took; a body let go
/// of is not wanted any more (the codec drops the rest as it comes).
fn give_back_window(shared: &Shared) {
    let mut streams = shared.streams.borrow_mut();
    let mut codec = shared.codec.borrow_mut();
    for (&id, slot) in streams.iter_mut() {
        let Some(inbox) = &slot.inbox else { continue };
        let taken = inbox.take_taken();
        if taken > 0 {
            codec.release(id, taken);
        }
        if inbox.is_dropped() {
            codec.discard_body(id);
            slot.inbox = None;
        }
    }
}

/// Starts serving a request on a task of its own.
fn start(
    shared: &Rc<Shared>,
    service: &ProxyService,
    codecs: &Codecs,
    id: u32,
    head: http2::head::RequestHead,
    end_stream: bool,
) {
    let parts = head.parts;
    if parts.method == Method::CONNECT {
        // Tunnels are not served on this codec yet (nor over HTTP/3): refused, as there.
        let mut refused = http::Response::new(()).into_parts().0;
        refused.status = StatusCode::FORBIDDEN;
        let mut codec = shared.codec.borrow_mut();
        let _ = codec.send_response(id, &refused, true);
        codec.reset(id, http2::frame::Reason::NO_ERROR);
        return;
    }
    let head_only = parts.method == Method::HEAD;
    let (inbox, receiver) = if end_stream {
        (None, None)
    } else {
        let (inbox, receiver) = stream_inbox::inbox(Rc::clone(&shared.wake), head.content_length);
        (Some(inbox), Some(receiver))
    };
    if !end_stream && stream::expects_continue(&parts.headers) {
        // A client waiting to send its body is told to go on at once, as Envoy does.
        let _ = shared
            .codec
            .borrow_mut()
            .send_interim(id, StatusCode::CONTINUE, &HeaderMap::new());
    }
    let request = http::Request::from_parts(parts, ());
    // Boxed, as hyper boxes a request's service future: the handler's state is large.
    let served = Box::pin(service.serve_inline(request, move |(), received| {
        receiver.map_or_else(RequestBody::empty, |r| RequestBody::inbox(r, received))
    }));
    let whole = Rc::new(Cell::new(false));
    let task = stream::serve(Rc::clone(shared), id, served, head_only, Rc::clone(&whole));
    let conn = Rc::clone(shared);
    // The service marked this stream for the idle limit as it took the request.
    let handle = match codecs.stream_exec.limit(task) {
        Ok(limited) => tokio::task::spawn_local(async move {
            limited.await;
            conn.finish(id, whole.get());
        }),
        Err(task) => tokio::task::spawn_local(async move {
            task.await;
            conn.finish(id, whole.get());
        }),
    };
    shared.streams.borrow_mut().insert(
        id,
        Slot {
            inbox,
            task: Some(handle.abort_handle()),
            ready: false,
            sender: None,
        },
    );
}
