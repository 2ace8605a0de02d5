//! The request body as it travels upstream: counted for the access log, timed for the route
//! timeout, recorded for a retry, read ahead for an authorization check, or copied to mirrors.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::Instant;

/// A request body relayed upstream, counting its bytes for the access log when asked to.
pub struct RequestBody {
    source: Source,
    received: Option<Rc<Cell<u64>>>,
    /// When the last frame was handed upstream, if someone watches.
    progress: Option<ProgressClock>,
    /// A copy of the frames sent so far, kept for a retry while it fits the buffer limit.
    replay: Option<Rc<RefCell<Replay>>>,
    /// The listener's `request_timeout`, if it has one. Boxed: most bodies have none.
    deadline: Option<Box<Deadline>>,
    /// Set once the body has ended, for a watcher that asked (`max_stream_duration`).
    ended: Option<Rc<Cell<bool>>>,
}

/// Envoy's request timeout: the body must end by then, unless the response has begun.
struct Deadline {
    timer: Pin<Box<tokio::time::Sleep>>,
    answered: ResponseBegun,
}

/// Set once the response head is there: the request timeout no longer runs. It also tells
/// whether the timeout ran out first, which an HTTP/2 upstream's error would not (hyper
/// resets the stream and keeps the body's error).
#[derive(Clone, Default)]
pub(crate) struct ResponseBegun(Rc<Cell<Deadlined>>);

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum Deadlined {
    #[default]
    Pending,
    Answered,
    TimedOut,
}

impl ResponseBegun {
    /// The response has begun: from now the body may take its time.
    pub(crate) fn set(&self) {
        if self.0.get() == Deadlined::Pending {
            self.0.set(Deadlined::Answered);
        }
    }

    /// The body did not end in time.
    pub(crate) fn timed_out(&self) -> bool {
        self.0.get() == Deadlined::TimedOut
    }
}

use super::body_pipe::{PipeReceiver, PipeSender, body_pipe};
use super::mirror_feed::{FeedReceiver, FeedSender, feed};
use super::stream_inbox::InboxReceiver;
use super::stream_tunnel::StreamTunnel;
use crate::error::{BodyError, RequestTimedOut};

enum Source {
    Client(hyper::body::Incoming),
    /// An HTTP/1.1 body, read from the connection as it is asked for.
    Http1(h1::IncomingBody),
    /// A retry: the frames recorded from the first try.
    Replayed(VecDeque<Bytes>),
    /// The client's body, of which the first frames were read ahead (for an authorization
    /// check) and are sent before the rest.
    ReadAhead {
        front: VecDeque<Frame<Bytes>>,
        rest: Box<Source>,
    },
    /// The client's body, each frame also queued for the copies sent to mirrors.
    Teed {
        inner: Box<Source>,
        copies: Vec<FeedSender>,
    },
    /// A mirror's copy of another request's body.
    Mirrored(FeedReceiver),
    /// Frames another task makes from the client's (an external processor's answers).
    Piped(PipeReceiver),
    /// An HTTP/2 request's body on Legate's own codec, filled by the connection's task.
    Inbox(InboxReceiver),
    /// A CONNECT's stream on Legate's own codec: no body, but the tunnel's client side, for
    /// the request path to take.
    Tunnel(Box<StreamTunnel>),
    /// gRPC-Web text: the client's base64, decoded as it comes, whole groups of four at a
    /// time. Padding inside a group of frames decoded together fails it, as in Envoy.
    Base64 {
        inner: Box<Source>,
        pending: Vec<u8>,
    },
}

/// When a body last moved, shared by the body and the route timeout that watches it. Clocks
/// come from a per-worker pool and go back to it with their last holder: a request with a
/// body allocates none.
#[derive(Clone)]
pub(crate) struct ProgressClock(Rc<Cell<Instant>>);

/// Clocks kept per worker.
const CLOCKS_KEPT: usize = 64;

thread_local! {
    static CLOCKS: RefCell<Vec<Rc<Cell<Instant>>>> = const { RefCell::new(Vec::new()) };
}

impl ProgressClock {
    /// A clock set to now.
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        let clock = CLOCKS
            .with_borrow_mut(Vec::pop)
            .unwrap_or_else(|| Rc::new(Cell::new(now)));
        clock.set(now);
        Self(clock)
    }
}

impl std::ops::Deref for ProgressClock {
    type Target = Cell<Instant>;

    fn deref(&self) -> &Cell<Instant> {
        &self.0
    }
}

impl Drop for ProgressClock {
    fn drop(&mut self) {
        if Rc::strong_count(&self.0) == 1 {
            let clock = Rc::clone(&self.0);
            // At thread exit the pool may be gone: the clock is freed then.
            let _ = CLOCKS.try_with(|pool| {
                let mut pool = pool.borrow_mut();
                if pool.len() < CLOCKS_KEPT {
                    pool.push(clock);
                }
            });
        }
    }
}

/// The frames of a request body, recorded as they go upstream so a retry can send them again.
/// Only a body that ended within `limit` bytes can be replayed.
pub(crate) struct Replay {
    frames: Vec<Bytes>,
    bytes: usize,
    limit: usize,
    complete: bool,
    too_large: bool,
}

impl Replay {
    /// A body to send again, if the whole body was recorded.
    pub(crate) fn body(&self) -> Option<RequestBody> {
        (self.complete && !self.too_large).then(|| RequestBody {
            source: Source::Replayed(self.frames.iter().cloned().collect()),
            received: None,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        })
    }

    fn record(&mut self, data: &Bytes) {
        if self.too_large {
            return;
        }
        if self.bytes + data.len() > self.limit {
            self.too_large = true;
            self.frames = Vec::new();
            return;
        }
        self.bytes += data.len();
        self.frames.push(data.clone());
    }
}

impl RequestBody {
    pub(crate) fn new(inner: hyper::body::Incoming, received: Option<Rc<Cell<u64>>>) -> Self {
        Self {
            source: Source::Client(inner),
            received,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        }
    }

    /// A client's body that a task of the codec feeds (an HTTP/3 request's).
    pub(crate) fn piped(
        receiver: super::body_pipe::PipeReceiver,
        received: Option<Rc<Cell<u64>>>,
    ) -> Self {
        Self {
            source: Source::Piped(receiver),
            received,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        }
    }

    /// An HTTP/2 request's body, as the connection's task receives it.
    pub(crate) fn inbox(receiver: InboxReceiver, received: Option<Rc<Cell<u64>>>) -> Self {
        Self {
            source: Source::Inbox(receiver),
            received,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        }
    }

    /// A CONNECT's stream on Legate's own HTTP/2 codec, which becomes the tunnel's client side.
    pub(crate) fn stream_tunnel(tunnel: StreamTunnel) -> Self {
        Self {
            source: Source::Tunnel(Box::new(tunnel)),
            received: None,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        }
    }

    /// Takes the tunnel's client side out of a CONNECT's body (which is then empty).
    pub(crate) fn take_stream_tunnel(&mut self) -> Option<Box<StreamTunnel>> {
        if !matches!(self.source, Source::Tunnel(_)) {
            return None;
        }
        match std::mem::replace(&mut self.source, Source::Replayed(VecDeque::new())) {
            Source::Tunnel(tunnel) => {
                tunnel.mark_taken();
                Some(tunnel)
            }
            _ => None,
        }
    }

    /// An HTTP/1.1 request's body.
    pub(crate) fn http1(inner: h1::IncomingBody, received: Option<Rc<Cell<u64>>>) -> Self {
        Self {
            source: Source::Http1(inner),
            received,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        }
    }

    /// The body fails with [`RequestTimedOut`] if it has not ended by `at`, unless the
    /// returned flag is set first. `None` (nothing made) for a body already complete.
    pub(crate) fn end_by(&mut self, at: Instant) -> Option<ResponseBegun> {
        if self.is_end_stream() {
            return None;
        }
        let begun = ResponseBegun::default();
        self.deadline = Some(Box::new(Deadline {
            timer: Box::pin(tokio::time::sleep_until(at)),
            answered: begun.clone(),
        }));
        Some(begun)
    }

    /// A flag set once the body has ended (set already for a body complete now).
    pub(crate) fn watch_end(&mut self) -> Rc<Cell<bool>> {
        let ended = Rc::new(Cell::new(self.source.client_done()));
        if !ended.get() {
            self.ended = Some(Rc::clone(&ended));
        }
        ended
    }

    /// The body is base64 (gRPC-Web text): it goes on decoded, and fails where it is not
    /// base64.
    pub(crate) fn decode_base64(&mut self) {
        let inner = std::mem::replace(&mut self.source, Source::Replayed(VecDeque::new()));
        self.source = Source::Base64 {
            inner: Box::new(inner),
            pending: Vec::new(),
        };
    }

    /// A body with nothing in it: a request without one, or one the proxy makes up.
    pub(crate) fn empty() -> Self {
        Self {
            source: Source::Replayed(VecDeque::new()),
            received: None,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        }
    }

    /// A clock the body moves forward each time a frame goes upstream, and when it ends;
    /// `None` for a body that is already complete (no request body). Asked again, the same
    /// clock, set to now.
    pub(crate) fn track_progress(&mut self) -> Option<ProgressClock> {
        if self.is_end_stream() {
            return None;
        }
        if let Some(clock) = &self.progress {
            clock.set(Instant::now());
            return Some(clock.clone());
        }
        let clock = ProgressClock::new();
        self.progress = Some(clock.clone());
        Some(clock)
    }

    /// Reads the body ahead until `max` bytes or its end, keeping what it read to send first:
    /// `(the first max bytes, whether that is the whole body)`.
    pub(crate) async fn read_ahead(&mut self, max: usize) -> Result<(Bytes, bool), BodyError> {
        // The client's body, as it came or as a filter before read, decoded or had it processed.
        if !matches!(
            self.source,
            Source::Client(_)
                | Source::Http1(_)
                | Source::ReadAhead { .. }
                | Source::Base64 { .. }
                | Source::Piped(_)
                | Source::Inbox(_)
        ) {
            return Ok((Bytes::new(), self.source_ended()));
        }
        let mut start = bytes::BytesMut::new();
        let (_, whole) = self
            .read_front(max as u64, |data| {
                let room = max.saturating_sub(start.len());
                start.extend_from_slice(&data[..data.len().min(room)]);
            })
            .await?;
        Ok((start.freeze(), whole))
    }

    /// These bytes in place of the client's body (an external processor's), which is not
    /// read further. They read as read ahead, so a filter after may read them in turn.
    pub(crate) fn replace_with(&mut self, data: Bytes) {
        let front = if data.is_empty() {
            VecDeque::new()
        } else {
            VecDeque::from([Frame::data(data)])
        };
        self.source = Source::ReadAhead {
            front,
            rest: Box::new(Source::Replayed(VecDeque::new())),
        };
    }

    /// The first `len` bytes read ahead (by [`RequestBody::read_ahead`]) replaced by `data`:
    /// what follows them goes on as it was.
    pub(crate) fn replace_read_ahead(&mut self, len: usize, data: Bytes) {
        let Source::ReadAhead { front, .. } = &mut self.source else {
            return;
        };
        let mut left = len;
        let mut kept = VecDeque::with_capacity(front.len() + 1);
        if !data.is_empty() {
            kept.push_back(Frame::data(data));
        }
        for frame in front.drain(..) {
            match frame.into_data() {
                Ok(mut data) if left > 0 => {
                    let cut = left.min(data.len());
                    left -= cut;
                    let tail = data.split_off(cut);
                    if !tail.is_empty() {
                        kept.push_back(Frame::data(tail));
                    }
                }
                Ok(data) => kept.push_back(Frame::data(data)),
                Err(frame) => kept.push_back(frame),
            }
        }
        *front = kept;
    }

    /// Hands the client's frames to another task (an external processor's streamed body),
    /// which sends what goes upstream in their place: the client's frames (counted for the
    /// access log as they are read), and where to send their replacements. The request
    /// timeout, replay and progress stay with this body, on the frames that go upstream.
    pub(crate) fn pipe(&mut self) -> (RequestBody, PipeSender) {
        let (sender, receiver) = body_pipe();
        let source = std::mem::replace(&mut self.source, Source::Piped(receiver));
        let client = RequestBody {
            source,
            received: self.received.take(),
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        };
        (client, sender)
    }

    /// Reads the whole body ahead, if it is at most `max` bytes, to send as it came: its
    /// length, or `None` (what was read is still sent) for a longer one.
    pub(crate) async fn read_whole(&mut self, max: u64) -> Result<Option<u64>, BodyError> {
        let (read, whole) = self.read_front(max, |_| {}).await?;
        Ok(whole.then_some(read))
    }

    /// Reads frames until more than `max` bytes or the end (held to the request timeout),
    /// showing each one's data to `seen`, and keeps them to be sent first:
    /// `(bytes read, whether that is the whole body)`.
    async fn read_front(
        &mut self,
        max: u64,
        mut seen: impl FnMut(&Bytes),
    ) -> Result<(u64, bool), BodyError> {
        let mut front = VecDeque::new();
        let mut read = 0u64;
        while read <= max && !self.source.is_end_stream() {
            match std::future::poll_fn(|cx| self.poll_client(cx)).await {
                None => break,
                Some(Err(error)) => return Err(error),
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        read += data.len() as u64;
                        seen(data);
                    }
                    front.push_back(frame);
                }
            }
        }
        let whole = self.source.is_end_stream() && read <= max;
        let rest = std::mem::replace(&mut self.source, Source::Replayed(VecDeque::new()));
        self.source = Source::ReadAhead {
            front,
            rest: Box::new(rest),
        };
        Ok((read, whole))
    }

    /// A body for a copy of this request sent to a mirror: its frames as this body's go
    /// upstream, as long as the copy keeps within `limit` bytes of them.
    pub(crate) fn copy_for_mirror(&mut self, limit: usize) -> RequestBody {
        if self.is_end_stream() {
            return RequestBody::empty();
        }
        let (sender, receiver) = feed(limit, self.source.size_hint());
        match &mut self.source {
            Source::Teed { copies, .. } => copies.push(sender),
            _ => {
                let inner = std::mem::replace(&mut self.source, Source::Replayed(VecDeque::new()));
                self.source = Source::Teed {
                    inner: Box::new(inner),
                    copies: vec![sender],
                };
            }
        }
        RequestBody {
            source: Source::Mirrored(receiver),
            received: None,
            progress: None,
            replay: None,
            deadline: None,
            ended: None,
        }
    }

    /// Starts recording the frames for a retry, up to `limit` bytes.
    pub(crate) fn record_for_replay(&mut self, limit: usize) -> Rc<RefCell<Replay>> {
        let replay = Rc::new(RefCell::new(Replay {
            frames: Vec::new(),
            bytes: 0,
            limit,
            complete: self.is_end_stream(),
            too_large: false,
        }));
        self.replay = Some(Rc::clone(&replay));
        replay
    }
}

impl Drop for RequestBody {
    fn drop(&mut self) {
        // Dropped when the codec is done with it: the request has left, or failed.
        if let Some(clock) = &self.progress {
            clock.set(Instant::now());
        }
    }
}

impl Source {
    /// Whether the client has sent its whole body (frames read ahead but not yet passed on
    /// count as sent).
    fn client_done(&self) -> bool {
        match self {
            Source::ReadAhead { rest, .. } => rest.client_done(),
            Source::Teed { inner, .. } | Source::Base64 { inner, .. } => inner.client_done(),
            other => other.is_end_stream(),
        }
    }
}

impl Body for Source {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Source::Client(inner) => Pin::new(inner).poll_frame(cx).map_err(Into::into),
            Source::Http1(inner) => Pin::new(inner).poll_frame(cx).map_err(Into::into),
            Source::Replayed(frames) => {
                Poll::Ready(frames.pop_front().map(|data| Ok(Frame::data(data))))
            }
            Source::ReadAhead { front, rest } => match front.pop_front() {
                Some(frame) => Poll::Ready(Some(Ok(frame))),
                None => Pin::new(rest.as_mut()).poll_frame(cx),
            },
            Source::Teed { inner, copies } => {
                let polled = Pin::new(inner.as_mut()).poll_frame(cx);
                match &polled {
                    Poll::Ready(Some(Ok(frame))) => {
                        let ended = inner.is_end_stream();
                        for copy in copies.iter() {
                            copy.send(frame);
                            if ended {
                                copy.end();
                            }
                        }
                    }
                    Poll::Ready(None) => copies.iter().for_each(FeedSender::end),
                    // A failed body: dropping the senders gives the copies up.
                    Poll::Ready(Some(Err(_))) => copies.clear(),
                    Poll::Pending => {}
                }
                polled
            }
            Source::Mirrored(receiver) => receiver.poll_frame(cx),
            Source::Piped(receiver) => receiver.poll_frame(cx),
            Source::Inbox(receiver) => receiver.poll_frame(cx),
            Source::Tunnel(_) => Poll::Ready(None),
            Source::Base64 { inner, pending } => loop {
                match ready!(Pin::new(inner.as_mut()).poll_frame(cx)) {
                    Some(Ok(frame)) => match frame.into_data() {
                        Ok(data) => {
                            pending.extend(data.iter().filter(|b| !b.is_ascii_whitespace()));
                            let whole = pending.len() / 4 * 4;
                            if whole == 0 {
                                continue;
                            }
                            let decoded = decode_base64(&pending[..whole]);
                            pending.drain(..whole);
                            return Poll::Ready(Some(decoded.map(Frame::data)));
                        }
                        Err(frame) => return Poll::Ready(Some(Ok(frame))),
                    },
                    None if pending.is_empty() => return Poll::Ready(None),
                    None => {
                        pending.clear();
                        return Poll::Ready(Some(Err(Box::new(InvalidBase64))));
                    }
                    Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                }
            },
        }
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        match self {
            Source::Client(inner) => inner.is_end_stream(),
            Source::Http1(inner) => inner.is_end_stream(),
            Source::Replayed(frames) => frames.is_empty(),
            Source::ReadAhead { front, rest } => front.is_empty() && rest.is_end_stream(),
            Source::Teed { inner, .. } => inner.is_end_stream(),
            Source::Mirrored(receiver) => receiver.is_end_stream(),
            Source::Piped(receiver) => receiver.is_end_stream(),
            Source::Inbox(receiver) => receiver.is_end_stream(),
            Source::Tunnel(_) => true,
            Source::Base64 { inner, pending } => pending.is_empty() && inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Source::Client(inner) => inner.size_hint(),
            Source::Http1(inner) => inner.size_hint(),
            Source::Replayed(frames) => {
                SizeHint::with_exact(frames.iter().map(|f| f.len() as u64).sum())
            }
            Source::ReadAhead { front, rest } => {
                let ahead: u64 = front
                    .iter()
                    .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
                    .sum();
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(rest.lower() + ahead);
                if let Some(upper) = rest.upper() {
                    hint.set_upper(upper + ahead);
                }
                hint
            }
            Source::Teed { inner, .. } => inner.size_hint(),
            Source::Mirrored(receiver) => receiver.size_hint(),
            // Three bytes for four, whatever their number; a processor's, whatever it says.
            Source::Inbox(receiver) => receiver.size_hint(),
            Source::Tunnel(_) => SizeHint::with_exact(0),
            Source::Base64 { .. } | Source::Piped(_) => SizeHint::default(),
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BodyError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        let polled = this.poll_client(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            if let Some(counter) = &this.received {
                counter.set(counter.get() + data.len() as u64);
            }
            if let Some(replay) = &this.replay {
                replay.borrow_mut().record(data);
            }
        }
        if let Some(replay) = &this.replay
            && (matches!(polled, Poll::Ready(None)) || this.source_ended())
        {
            replay.borrow_mut().complete = true;
        }
        if let (Some(clock), Poll::Ready(_)) = (&this.progress, &polled) {
            clock.set(Instant::now());
        }
        polled
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.source_ended()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.source.size_hint()
    }
}

impl RequestBody {
    #[inline]
    fn source_ended(&self) -> bool {
        self.source.is_end_stream()
    }

    /// The next frame from the source, held to the request timeout until the client has sent
    /// its whole body (frames read ahead count as sent); marks the end for a watcher.
    #[inline]
    fn poll_client(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let polled = Pin::new(&mut self.source).poll_frame(cx);
        let done = matches!(polled, Poll::Ready(None)) || self.source.client_done();
        if let Some(deadline) = &mut self.deadline {
            if done {
                // Whole in time: the request timeout is done with.
                self.deadline = None;
            } else if deadline.answered.0.get() == Deadlined::Pending
                && deadline.timer.as_mut().poll(cx).is_ready()
            {
                deadline.answered.0.set(Deadlined::TimedOut);
                self.deadline = None;
                return Poll::Ready(Some(Err(Box::new(RequestTimedOut))));
            }
        }
        if done && let Some(ended) = &self.ended {
            ended.set(true);
        }
        polled
    }
}

/// A gRPC-Web text body that is not base64.
#[derive(Debug, thiserror::Error)]
#[error("invalid base64 in a gRPC-Web text request body")]
pub(crate) struct InvalidBase64;

fn decode_base64(text: &[u8]) -> Result<Bytes, BodyError> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map(Bytes::from)
        .map_err(|_| Box::new(InvalidBase64) as BodyError)
}
