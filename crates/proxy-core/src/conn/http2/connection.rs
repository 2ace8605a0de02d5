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
use std::io::IoSlice;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http::{HeaderMap, Method, StatusCode};
use http2::server::{Config, Connection, ConnectionError, Event, Flood};
use http2::spares::{self, Spares};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use super::super::Codecs;
use super::super::io::DownstreamIo;
use super::super::service::ProxyService;
use super::stream::{self, Served};
use super::stream_task::{self, StreamTask};
use super::tunnel::StreamEnd;
use super::{QUIET_CLOSE_GRACE, Quiet};
use crate::box_pool::PooledBox;
use crate::context::stream_inbox::{self, Inbox, WakeCell};
use crate::context::stream_tunnel::StreamTunnel;
use crate::context::{ConnCtx, RequestBody, SignalWatch};

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
    streams: RefCell<Streams>,
    /// The connection is gone: tunnels still holding a stream stop.
    closed: Cell<bool>,
}

/// The streams being served, by id. The client picks the ids, but it has at most the
/// connection's stream limit open at once, so a fast hash (foldhash, randomly seeded) is safe
/// here, where SipHash cost more than the rest of each lookup.
type Streams = std::collections::HashMap<u32, Slot, foldhash::fast::RandomState>;

/// Emptied stream maps kept per thread: a connection holds its map only while it has
/// streams, and one served a request at a time would otherwise make one per request.
const SPARE_MAPS: usize = 8;
/// A map grown past this many streams (a burst) is freed, not kept.
const MAX_SPARE_MAP: usize = 16;

thread_local! {
    static SPARE_STREAMS: Spares<Streams> = const { Spares::new() };
}

/// What the connection keeps of a stream being served.
struct Slot {
    /// Where its request body goes; `None` for a request without one.
    inbox: Option<Inbox>,
    task: StreamTask,
    /// The codec has room for the DATA the stream's task was waiting to send.
    ready: bool,
    sender: Option<Waker>,
}

impl Shared {
    /// Resolves once the stream may send more DATA (or is gone).
    pub(super) async fn send_ready(&self, id: u32) {
        std::future::poll_fn(|cx| self.poll_send_ready(cx, id).map(drop)).await;
    }

    /// Ready once the stream may send more DATA (`true`), or is gone (`false`).
    pub(super) fn poll_send_ready(&self, cx: &mut Context<'_>, id: u32) -> Poll<bool> {
        let mut streams = self.streams.borrow_mut();
        let Some(slot) = streams.get_mut(&id) else {
            return Poll::Ready(false);
        };
        if std::mem::take(&mut slot.ready) {
            return Poll::Ready(true);
        }
        slot.sender = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Forgets a stream's slot; the map goes back to the thread's spares once no stream is
    /// left (an idle connection holds none).
    fn forget(&self, id: u32) -> Option<Slot> {
        let mut streams = self.streams.borrow_mut();
        let slot = streams.remove(&id);
        if streams.is_empty() && streams.capacity() > 0 {
            let emptied = std::mem::take(&mut *streams);
            drop(streams);
            if emptied.capacity() <= MAX_SPARE_MAP {
                spares::give(&SPARE_STREAMS, emptied, SPARE_MAPS);
            }
        }
        slot
    }

    /// Keeps a new stream's slot, in a spare map if the connection holds none.
    fn keep(&self, id: u32, slot: Slot) {
        let mut streams = self.streams.borrow_mut();
        if streams.capacity() == 0
            && let Some(spare) = spares::take(&SPARE_STREAMS)
        {
            *streams = spare;
        }
        streams.insert(id, slot);
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// The stream's task is over: `finished`, its response was sent whole (a request still
    /// coming is then refused with `NO_ERROR`); otherwise the stream is reset (`CANCEL`), so
    /// the client never takes a cut-short response as whole.
    pub(super) fn finish(&self, id: u32, finished: bool) {
        self.forget(id);
        let reason = if finished {
            http2::frame::Reason::NO_ERROR
        } else {
            http2::frame::Reason::CANCEL
        };
        self.codec.borrow_mut().reset(id, reason);
        self.wake.wake();
    }
}

/// Ends the streams' tasks when the connection goes, and the tunnels on its streams.
struct AbortStreams(Rc<Shared>);

impl Drop for AbortStreams {
    fn drop(&mut self) {
        self.0.closed.set(true);
        let streams = std::mem::take(&mut *self.0.streams.borrow_mut());
        for (_, slot) in streams {
            slot.task.abort();
            if let Some(inbox) = &slot.inbox {
                inbox.fail();
            }
            if let Some(sender) = slot.sender {
                sender.wake();
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
        streams: RefCell::new(Streams::default()),
        closed: Cell::new(false),
    });
    let _abort = AbortStreams(Rc::clone(&shared));
    let mut input = BytesMut::new();
    let recheck = codecs.idle_timeout.min(codecs.request_headers_timeout);
    let mut timers = Timers {
        quiet_check: Some(ctx.opened + recheck),
        expires: ctx.expires_at(),
        close_by: None,
        grace: None,
        keepalive: codecs.h2_keepalive.map(|k| Keepalive {
            interval: k.interval,
            timeout: k.timeout,
            next: Instant::now() + k.interval,
            sent: None,
        }),
        never: Instant::now() + Timers::NEVER,
    };
    // One timer for the earliest of them, set again only when that changes, and the drain
    // and retire signals listened to once: a turn of the loop registers nothing.
    let timer = tokio::time::sleep_until(timers.next());
    let drained = drain.raised();
    let retired = ctx.retire.notified();
    tokio::pin!(timer, drained, retired);
    let mut going_away = false;
    let mut needs_flush = false;
    let mut open = true;
    // The codec stopped reading for the output: frames may be left in `input`.
    let mut paused = false;
    loop {
        dispatch(&shared, &service, codecs, timers.keepalive.as_mut());
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
        if (done || !open) && timers.close_by.is_none() {
            // What is left to write gets the idle timeout, not forever: a client that stopped
            // reading does not hold the connection.
            timers.close_by = Some(Instant::now() + codecs.idle_timeout);
        }
        let next = timers.next();
        if timer.deadline() != next {
            timer.as_mut().reset(next);
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
            () = &mut drained, if !going_away => go_away = true,
            () = &mut retired, if !going_away => go_away = true,
            // Whatever was set for the timer's deadline is due now.
            () = &mut timer => match timers.due(Instant::now().max(timer.deadline())) {
                Some(Due::Expired) => {
                    timers.expires = None;
                    ctx.listener.stats.cx_max_duration.inc();
                    go_away = true;
                }
                Some(Due::QuietCheck) => match super::quiet_check(&ctx, codecs, recheck) {
                    Quiet::LookAgainAt(at) => timers.quiet_check = Some(at),
                    Quiet::Due => {
                        timers.quiet_check = None;
                        go_away = true;
                    }
                },
                Some(Due::CloseBy) => {
                    tracing::debug!("downstream HTTP/2 connection: the client took nothing more");
                    return;
                }
                Some(Due::Grace) => {
                    // The client did not answer the GOAWAY's PING: the final GOAWAY now.
                    timers.grace = None;
                    shared.codec.borrow_mut().finish_drain();
                }
                Some(Due::Keepalive) => {
                    let Some(keepalive) = timers.keepalive.as_mut() else { continue };
                    if keepalive.sent.is_some() {
                        tracing::debug!("downstream HTTP/2 connection: no answer to a keep-alive PING");
                        return;
                    }
                    keepalive.sent = Some(Instant::now());
                    shared.codec.borrow_mut().ping(KEEPALIVE_PING);
                }
                None => {
                    // The timer stood for no deadline: it waits that long again.
                    timers.never = Instant::now() + Timers::NEVER;
                }
            },
        }
        if go_away && !going_away {
            // Streams in flight finish; the client opens a new connection for the rest.
            going_away = true;
            timers.quiet_check = None;
            shared.codec.borrow_mut().go_away();
            timers.grace = Some(Instant::now() + QUIET_CLOSE_GRACE);
        }
    }
    // Lingers: the client's last frames are read rather than reset.
    let _ = io.shutdown().await;
}

/// The connection's deadlines; `None` where one does not run.
struct Timers {
    /// When to look whether the connection has been quiet too long (not while going away).
    quiet_check: Option<Instant>,
    /// `max_connection_duration`.
    expires: Option<Instant>,
    /// Once done (or closed by the client), when what is left to write is given up.
    close_by: Option<Instant>,
    /// After GOAWAY, how long the client has to answer its PING before the final GOAWAY.
    grace: Option<Instant>,
    keepalive: Option<Keepalive>,
    /// The timer's deadline while none runs.
    never: Instant,
}

/// Which deadline came.
enum Due {
    Expired,
    QuietCheck,
    CloseBy,
    Grace,
    Keepalive,
}

impl Timers {
    /// Far enough to mean never, near enough not to overflow.
    const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);

    fn all(&self) -> [(Option<Instant>, Due); 5] {
        [
            (self.close_by, Due::CloseBy),
            (self.expires, Due::Expired),
            (self.grace, Due::Grace),
            (self.quiet_check, Due::QuietCheck),
            (self.keepalive.as_ref().map(Keepalive::due), Due::Keepalive),
        ]
    }

    /// The earliest deadline.
    fn next(&self) -> Instant {
        (self.all().into_iter().filter_map(|(at, _)| at).min()).unwrap_or(self.never)
    }

    /// The first deadline (in the order of `all`) that `now` has reached.
    fn due(&self, now: Instant) -> Option<Due> {
        (self.all().into_iter()).find_map(|(at, due)| at.is_some_and(|at| at <= now).then_some(due))
    }
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
        // Uninitialised: the read fills what it reports, and zeroing 16 KiB a read costs.
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); READ_SIZE];
        let mut filled = ReadBuf::uninit(&mut buf);
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
                if let Some(slot) = shared.forget(stream) {
                    if let Some(inbox) = &slot.inbox {
                        inbox.fail();
                    }
                    slot.task.abort();
                    // A tunnel's relay (no task of the stream's) may wait to send on it.
                    if let Some(sender) = slot.sender {
                        sender.wake();
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
    let mut parts = head.parts;
    let head_only = parts.method == Method::HEAD;
    // A CONNECT's stream is the client's side of its tunnel: its DATA is no request body.
    let connect = parts.method == Method::CONNECT;
    if let Some(protocol) = &head.protocol {
        let protocol = String::from_utf8_lossy(protocol);
        (parts.extensions).insert(hyper::ext::Protocol::from(protocol.as_ref()));
    }
    let (inbox, receiver) = if end_stream && !connect {
        (None, None)
    } else {
        let (inbox, receiver) = stream_inbox::inbox(Rc::clone(&shared.wake), head.content_length);
        if end_stream {
            inbox.push(Bytes::new(), true);
        }
        (Some(inbox), Some(receiver))
    };
    let (mut body, mut opening) = (None, None);
    match receiver {
        Some(receiver) if connect => {
            let end = Rc::new(StreamEnd {
                shared: Rc::clone(shared),
                id,
            });
            let (tunnel, settle) = StreamTunnel::new(receiver, end);
            body = Some(Body::Tunnel(tunnel));
            opening = Some(settle);
        }
        Some(receiver) => {
            if super::super::expects_continue(&parts.headers) {
                // A client waiting to send its body is told to go on at once, as Envoy does.
                let _ = shared.codec.borrow_mut().send_interim(
                    id,
                    StatusCode::CONTINUE,
                    &HeaderMap::new(),
                );
            }
            body = Some(Body::Inbox(receiver));
        }
        None => {}
    }
    let request = http::Request::from_parts(parts, ());
    // Boxed apart from the stream's task, as hyper boxes a request's service future: the
    // handler's state is large (3,936 bytes), and a block from the worker's pool spares a
    // malloc and a free of it per request.
    let served = PooledBox::pin_with(|| {
        service.serve_inline(request, move |(), received| match body {
            Some(Body::Inbox(receiver)) => RequestBody::inbox(receiver, received),
            Some(Body::Tunnel(tunnel)) => RequestBody::stream_tunnel(tunnel),
            None => RequestBody::empty(),
        })
    });
    let task = {
        let shared = Rc::clone(shared);
        move || stream::serve(shared, id, served, head_only, opening)
    };
    let conn = Rc::clone(shared);
    let finish = move |served| match served {
        // The relay owns the stream now.
        Served::Tunnel => {}
        served => conn.finish(id, served == Served::Whole),
    };
    // The service marked this stream for the idle limit as it took the request. `map`, not
    // an async block: a block awaiting a future it captured holds it twice (3,312 bytes
    // instead of 1,640). Pooled too, and made in its block: the stream's task then holds a
    // pointer, where the whole future would be copied into its box. A stream ended by the
    // limit was cut short.
    let exec = &codecs.stream_exec;
    let run = match exec.take_mark() {
        Some(mark) => stream_task::spawn(PooledBox::pin_with(move || {
            exec.limit_marked(task, mark)
                .map(move |served| finish(served.unwrap_or(Served::Cut)))
        })),
        None => stream_task::spawn(PooledBox::pin_with(|| task().map(finish))),
    };
    shared.keep(
        id,
        Slot {
            inbox,
            task: run,
            ready: false,
            sender: None,
        },
    );
}

/// What a stream's request body is.
enum Body {
    Inbox(stream_inbox::InboxReceiver),
    Tunnel(StreamTunnel),
}
