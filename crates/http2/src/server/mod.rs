//! A server's HTTP/2 connection without I/O: bytes read go in ([`Connection::recv`]), events
//! come out ([`Connection::poll_event`]), responses go in ([`Connection::send_response`],
//! [`Connection::send_data`], ...) and the bytes to write come out
//! ([`Connection::output`]). The task that owns the socket decides when to read and write;
//! this decides what the bytes mean, under RFC 9113's rules and the flood limits of
//! [`FloodLimits`].
//!
//! What the connection holds is bounded: output stops growing at [`Config::max_output`]
//! (reading pauses and DATA waits until it is written), a stream's body is bounded by the
//! window this side announced, and nothing is buffered once the output is written.
//!
//! ```
//! use std::time::Instant;
//! use bytes::BytesMut;
//! use http2::server::{Config, Connection, Event};
//!
//! let mut conn = Connection::new(Config::default());
//! let mut input = BytesMut::from(&b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0"[..]);
//! // HEADERS on stream 1: GET http://a/ from HPACK's static table, END_STREAM.
//! input.extend_from_slice(b"\0\0\x06\x01\x05\0\0\0\x01\x82\x86\x84\x41\x01a");
//! conn.recv(&mut input, Instant::now())?;
//! let Some(Event::Request { stream, head, end_stream: true }) = conn.poll_event() else {
//!     panic!("a request");
//! };
//! assert_eq!(head.parts.uri, "http://a/");
//! let response = http::Response::new(()).into_parts().0;
//! conn.send_response(stream, &response, true)?;
//! assert!(conn.output_len() > 0); // SETTINGS, their ACK, the response
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod floods;
mod output;
mod recv;
mod send;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;

use crate::flow::{Credit, DEFAULT_WINDOW, Window};
use crate::frame::{self, BlockAssembler, DEFAULT_MAX_FRAME_SIZE, Reason, Settings};
use crate::head::RequestHead;
use crate::hpack::{DEFAULT_TABLE_SIZE, Decoder, Encoder};
use crate::spares;
use crate::stream::State;

pub use floods::{Flood, FloodLimits};
use output::Output;

/// The client connection preface (RFC 9113 section 3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Event queues and stream lists kept per thread, of each: a connection's queue is emptied
/// within the poll that filled it, and its list when its last stream ends, so a few serve
/// many connections.
const SPARE_QUEUES: usize = 8;
/// A queue grown past this many events (a burst of many streams at once) is freed, not kept.
const MAX_SPARE_EVENTS: usize = 16;
/// A list grown past this many streams is freed, not kept.
const MAX_SPARE_STREAMS: usize = 16;

thread_local! {
    static EVENT_QUEUES: spares::Spares<VecDeque<Event>> = const { spares::Spares::new() };
    static STREAM_LISTS: spares::Spares<Vec<Stream>> = const { spares::Spares::new() };
}

/// Queues an event, in a spare queue if the connection holds none.
fn push_event(events: &mut VecDeque<Event>, event: Event) {
    if events.capacity() == 0
        && let Some(spare) = spares::take(&EVENT_QUEUES)
    {
        *events = spare;
    }
    events.push_back(event);
}

/// What this side announces and holds to.
#[derive(Debug, Clone)]
pub struct Config {
    /// Streams a client may have open at once; more are refused (`REFUSED_STREAM`).
    pub max_concurrent_streams: u32,
    /// Each stream's receive window: what a client may send before the application takes it.
    pub initial_stream_window: u32,
    /// The connection's receive window, all streams together (at least 65,535).
    pub initial_connection_window: u32,
    /// The largest request head, as RFC 9113 counts it; a larger one is answered 431.
    pub max_header_list_size: u32,
    /// The HPACK table this side keeps for the client's blocks.
    pub header_table_size: u32,
    /// RFC 8441's extended CONNECT (WebSocket over HTTP/2) is offered.
    pub enable_connect_protocol: bool,
    /// Output bytes beyond which reading pauses and DATA waits for the socket.
    pub max_output: usize,
    pub floods: FloodLimits,
    /// Where a request's header map comes from, given the fields it will hold (at most 64:
    /// the map grows past that as it is filled): a pool the application fills with the maps
    /// of heads it has written, say.
    pub header_map: fn(usize) -> HeaderMap,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_concurrent_streams: 100,
            initial_stream_window: DEFAULT_WINDOW,
            initial_connection_window: DEFAULT_WINDOW,
            max_header_list_size: 16 * 1024,
            header_table_size: DEFAULT_TABLE_SIZE as u32,
            enable_connect_protocol: false,
            max_output: 64 * 1024,
            floods: FloodLimits::default(),
            header_map: |_| HeaderMap::new(),
        }
    }
}

/// What the connection read.
#[derive(Debug)]
pub enum Event {
    /// A request's head: its stream is open. `end_stream`: it has no body.
    Request {
        stream: u32,
        head: RequestHead,
        end_stream: bool,
    },
    /// A piece of a request's body. Its length goes back with [`Connection::release`]
    /// once the application has taken it.
    Data {
        stream: u32,
        data: Bytes,
        end_stream: bool,
    },
    /// The request's trailers, which end it.
    Trailers { stream: u32, trailers: HeaderMap },
    /// The stream ended before its exchange was done: the client reset it (`reason` is
    /// its), or this side did for the client's error. Nothing more is sent on it.
    Reset { stream: u32, reason: Reason },
    /// A stream that had DATA waiting ([`Connection::send_data`] took only part) may send
    /// more.
    SendReady { stream: u32 },
    /// The client answered a PING this side sent ([`Connection::ping`]).
    Pong { payload: [u8; 8] },
    /// The client sent GOAWAY: it opens no more streams.
    GoAway { reason: Reason },
}

/// Why the connection ended. GOAWAY with [`ConnectionError::reason`] is queued in the
/// output; after the output is written the socket is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} ({reason:?})")]
pub struct ConnectionError {
    pub reason: Reason,
    pub what: &'static str,
    /// The flood limit it was, if it was one.
    pub flood: Option<Flood>,
}

impl ConnectionError {
    pub(crate) fn new(reason: Reason, what: &'static str) -> Self {
        ConnectionError {
            reason,
            what,
            flood: None,
        }
    }
}

/// Why a response could not be sent on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("stream {0} is not open for sending (reset, ended, or never opened)")]
    StreamClosed(u32),
    #[error("the response head was already sent")]
    HeadSent,
    #[error("DATA or trailers before the response head")]
    HeadNotSent,
    #[error("the connection has ended")]
    ConnectionEnded,
}

/// A stream the connection keeps.
#[derive(Debug)]
struct Stream {
    id: u32,
    state: State,
    /// What the client may still send on it.
    recv: Credit,
    /// What this side may still send on it.
    send: Window,
    /// The request's declared `content-length`, less the DATA received.
    remaining: Option<u64>,
    opened_at: Instant,
    /// Its request event was taken by the application.
    taken: bool,
    head_sent: bool,
    /// Body bytes handed on and not yet released: given back to the connection's window
    /// if the stream goes first.
    unreleased: u32,
    /// DATA was held back for want of window or output room: [`Event::SendReady`] is due
    /// when there is some.
    wants_send: bool,
    /// The application wants no more of the request's body ([`Connection::discard_body`]).
    discarding: bool,
}

/// Where the connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the client's preface.
    Preface,
    /// Waiting for the SETTINGS that must come first.
    FirstSettings,
    Open,
    /// GOAWAY sent: streams above `last` are ignored. `final_sent`: the second GOAWAY
    /// (with the real last stream) went out.
    Draining {
        final_sent: bool,
    },
    /// A connection error: only the output is left to write.
    Closed,
}

/// The payload of the PING that measures a graceful shutdown's round trip.
const DRAIN_PING: [u8; 8] = *b"drain\0\0\0";
/// How many stream ids reset by this side are remembered, so frames the client sent
/// before it heard are dropped quietly.
const RECENT_RESETS: usize = 32;

/// A server connection; see the module documentation.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    phase: Phase,
    streams: Vec<Stream>,
    /// The highest stream id the client opened.
    last_stream: u32,
    /// The highest stream id the client used, counting those ignored after the final
    /// GOAWAY: ids above it are idle.
    highest_stream: u32,
    /// Streams this side reset lately (frames may still be on their way).
    recent_resets: VecDeque<u32>,
    events: VecDeque<Event>,
    output: Output,
    blocks: BlockAssembler,
    decoder: Decoder,
    encoder: Encoder,
    /// The connection's receive window.
    recv_window: Credit,
    /// The connection's send window.
    send_window: Window,
    /// The client's settings in force.
    peer_initial_window: u32,
    peer_max_frame_size: u32,
    /// This side's stream window as the client knows it (65,535 until it acknowledges).
    acked_stream_window: u32,
    /// This side's SETTINGS not yet acknowledged.
    settings_unacked: bool,
    /// The client sent GOAWAY.
    peer_gone: bool,
    floods: floods::Counters,
}

impl Connection {
    /// A connection that has read nothing yet; its SETTINGS (and the connection window's
    /// first update) are in the output already.
    pub fn new(config: Config) -> Self {
        let connection_window = config.initial_connection_window.max(DEFAULT_WINDOW);
        let mut output = Output::default();
        let settings = Settings {
            header_table_size: (config.header_table_size != DEFAULT_TABLE_SIZE as u32)
                .then_some(config.header_table_size),
            max_concurrent_streams: Some(config.max_concurrent_streams),
            initial_window_size: (config.initial_stream_window != DEFAULT_WINDOW)
                .then_some(config.initial_stream_window),
            max_header_list_size: Some(config.max_header_list_size),
            enable_connect_protocol: config.enable_connect_protocol.then_some(true),
            ..Settings::default()
        };
        frame::encode_settings(&settings, output.buf());
        if connection_window > DEFAULT_WINDOW {
            frame::encode_window_update(0, connection_window - DEFAULT_WINDOW, output.buf());
        }
        Connection {
            blocks: BlockAssembler::new(
                config.max_header_list_size as usize,
                DEFAULT_MAX_FRAME_SIZE as usize,
            ),
            // The client encodes for the default table until it acknowledges ours.
            decoder: Decoder::new(DEFAULT_TABLE_SIZE),
            encoder: Encoder::new(DEFAULT_TABLE_SIZE),
            recv_window: Credit::new(connection_window),
            send_window: Window::new(DEFAULT_WINDOW),
            peer_initial_window: DEFAULT_WINDOW,
            peer_max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            acked_stream_window: DEFAULT_WINDOW,
            settings_unacked: true,
            peer_gone: false,
            phase: Phase::Preface,
            streams: Vec::new(),
            last_stream: 0,
            highest_stream: 0,
            recent_resets: VecDeque::new(),
            events: VecDeque::new(),
            output,
            floods: floods::Counters::default(),
            config,
        }
    }

    /// The next thing read, if any. Taking a request starts its service: a stream the
    /// client resets before its request is taken never reaches the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        let event = self.events.pop_front()?;
        if let Event::Request { stream, .. } = &event {
            if let Some(s) = self.stream_mut(*stream) {
                s.taken = true;
            }
            self.floods.request_taken();
        }
        self.release_events();
        Some(event)
    }

    /// Whether [`Connection::poll_event`] has something (writing output can wake senders).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Streams open (a request read and its exchange not finished).
    pub fn open_streams(&self) -> usize {
        self.streams.iter().filter(|s| !s.state.is_closed()).count()
    }

    /// The highest stream id the client opened (what a GOAWAY names).
    pub fn last_stream(&self) -> u32 {
        self.last_stream
    }

    /// The connection has ended (a connection error, or a graceful shutdown with no stream
    /// left): once the output is written, the socket can close.
    pub fn is_done(&self) -> bool {
        match self.phase {
            Phase::Closed => true,
            Phase::Draining { final_sent } => final_sent && self.streams.is_empty(),
            _ => self.peer_gone && self.streams.is_empty(),
        }
    }

    /// Whether reading should pause until the output is written (it is over
    /// [`Config::max_output`]).
    pub fn wants_write(&self) -> bool {
        self.output.len() >= self.config.max_output
    }

    fn stream_mut(&mut self, id: u32) -> Option<&mut Stream> {
        self.streams.iter_mut().find(|s| s.id == id)
    }

    fn stream_index(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    /// Forgets a closed stream, giving back the connection window its untaken body held.
    fn remove(&mut self, index: usize) {
        let stream = self.streams.swap_remove(index);
        if stream.unreleased > 0 {
            self.release_connection(stream.unreleased);
        }
        self.release_streams();
    }

    /// Gives the event queue, once empty, back to the thread's spares: an idle connection
    /// holds none.
    fn release_events(&mut self) {
        if self.events.is_empty() && self.events.capacity() > 0 {
            let mut events = std::mem::take(&mut self.events);
            if events.capacity() <= MAX_SPARE_EVENTS {
                events.clear(); // back to the start of its room
                spares::give(&EVENT_QUEUES, events, SPARE_QUEUES);
            }
        }
    }

    /// Gives the stream list, once no stream is left, back to the thread's spares.
    fn release_streams(&mut self) {
        if self.streams.is_empty() && self.streams.capacity() > 0 {
            let streams = std::mem::take(&mut self.streams);
            if streams.capacity() <= MAX_SPARE_STREAMS {
                spares::give(&STREAM_LISTS, streams, SPARE_QUEUES);
            }
        }
    }

    fn release_connection(&mut self, n: u32) {
        if let Some(increment) = self.recv_window.release(n) {
            frame::encode_window_update(0, increment, self.output.buf());
        }
    }

    /// Time since the stream opened, for the premature-reset count.
    fn age(stream: &Stream, now: Instant) -> Duration {
        now.saturating_duration_since(stream.opened_at)
    }
}
