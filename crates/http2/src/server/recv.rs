//! What the client's frames do to the connection and its streams.

use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};

use super::{
    Connection, ConnectionError, Event, Flood, PREFACE, Phase, RECENT_RESETS, STREAM_LISTS, Stream,
    push_event,
};
use crate::flow::{Credit, Window};
use crate::frame::{self, DEFAULT_MAX_FRAME_SIZE, Frame, FrameError, Priority, Reason, Settings};
use crate::head;
use crate::hpack::DecodeError;
use crate::spares;
use crate::stream::{Arrival, Scope, State, StateError};

impl Connection {
    /// Reads the whole frames at the front of `input` (the bytes read so far); a partial
    /// frame stays for the next read. Reading pauses while the output is over
    /// [`super::Config::max_output`]: call again once it is written. On an error, GOAWAY is
    /// queued, every stream is dropped, and nothing more is read.
    pub fn recv(&mut self, input: &mut BytesMut, now: Instant) -> Result<(), ConnectionError> {
        if self.phase == Phase::Closed {
            return Ok(());
        }
        let result = self.recv_frames(input, now);
        if let Err(error) = result {
            self.close(error);
        }
        result
    }

    fn recv_frames(&mut self, input: &mut BytesMut, now: Instant) -> Result<(), ConnectionError> {
        if self.phase == Phase::Preface {
            let n = input.len().min(PREFACE.len());
            if input[..n] != PREFACE[..n] {
                return Err(protocol("not the HTTP/2 connection preface"));
            }
            if n < PREFACE.len() {
                return Ok(());
            }
            input.advance(n);
            self.phase = Phase::FirstSettings;
        }
        while !self.wants_write() && self.phase != Phase::Closed {
            let frame = match frame::decode(input, DEFAULT_MAX_FRAME_SIZE) {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(error) => {
                    let error = self.blocks.frame_error(error);
                    self.frame_error(error)?;
                    continue;
                }
            };
            if self.phase == Phase::FirstSettings {
                if !matches!(frame, Frame::Settings(_)) {
                    return Err(protocol("the first frame is not SETTINGS"));
                }
                self.phase = Phase::Open;
            }
            let frame = match self.blocks.push(frame) {
                Ok(Some(frame)) => frame,
                Ok(None) => continue,
                Err(error) => {
                    let mut error = ConnectionError::new(error.reason, error.what);
                    if error.reason == Reason::ENHANCE_YOUR_CALM {
                        error.flood = Some(Flood::Continuation);
                    }
                    return Err(error);
                }
            };
            self.frame(frame, now)?;
        }
        Ok(())
    }

    fn frame(&mut self, frame: Frame, now: Instant) -> Result<(), ConnectionError> {
        match frame {
            Frame::Data {
                stream,
                end_stream,
                data,
                flow_len,
            } => self.recv_data(stream, end_stream, data, flow_len),
            Frame::Headers {
                stream,
                end_stream,
                priority,
                fragment,
                ..
            } => self.recv_headers(stream, end_stream, priority, fragment, now),
            // Priorities are read and checked, and not acted on (RFC 9113 deprecates them).
            Frame::Priority { .. } | Frame::Unknown { .. } => Ok(()),
            Frame::Reset { stream, reason } => self.recv_reset(stream, reason, now),
            Frame::Settings(settings) => {
                self.control_frame(now)?;
                self.peer_settings(settings)?;
                frame::encode_settings_ack(self.output.buf());
                Ok(())
            }
            Frame::SettingsAck => {
                self.settings_acked();
                Ok(())
            }
            Frame::PushPromise { .. } => Err(protocol("PUSH_PROMISE from a client")),
            Frame::Ping {
                ack: false,
                payload,
            } => {
                self.control_frame(now)?;
                frame::encode_ping(true, payload, self.output.buf());
                Ok(())
            }
            Frame::Ping { ack: true, payload } => {
                if payload == super::DRAIN_PING
                    && self.phase == (Phase::Draining { final_sent: false })
                {
                    self.finish_drain();
                } else {
                    push_event(&mut self.events, Event::Pong { payload });
                }
                Ok(())
            }
            Frame::GoAway { reason, .. } => {
                self.peer_gone = true;
                push_event(&mut self.events, Event::GoAway { reason });
                Ok(())
            }
            Frame::WindowUpdate { stream, increment } => self.recv_window_update(stream, increment),
            // The assembler takes CONTINUATION frames into their blocks.
            Frame::Continuation { .. } => Err(protocol("CONTINUATION outside a header block")),
        }
    }

    fn recv_headers(
        &mut self,
        id: u32,
        end_stream: bool,
        priority: Option<Priority>,
        block: Bytes,
        now: Instant,
    ) -> Result<(), ConnectionError> {
        // The block is read first, whatever becomes of the stream: the client's table and
        // this side's must stay in step.
        let mut fields = head::FieldList::take();
        let limit = self.config.max_header_list_size as usize;
        let too_large = match self.decoder.decode(&block, limit, |f| fields.push(f)) {
            Ok(()) => false,
            Err(DecodeError::HeaderListTooLarge { .. }) => true,
            Err(_) => {
                return Err(ConnectionError::new(
                    Reason::COMPRESSION_ERROR,
                    "a header block that cannot be decoded",
                ));
            }
        };
        if id.is_multiple_of(2) {
            return Err(protocol("HEADERS on an even-numbered stream"));
        }
        let on_itself = priority.is_some_and(|p| p.is_on_itself(id));
        if let Some(index) = self.stream_index(id) {
            // Trailers.
            let stream = &mut self.streams[index];
            match stream.state.recv_headers(end_stream) {
                Ok(Arrival::Deliver) => {}
                Ok(Arrival::Ignore) => return Ok(()),
                Err(error) => return self.state_error(id, error),
            }
            if stream.discarding {
                self.remove_if_closed(index);
                return Ok(());
            }
            if on_itself || too_large || stream.remaining.is_some_and(|n| n != 0) {
                return self.stream_error(id, Reason::PROTOCOL_ERROR);
            }
            let Ok(trailers) = head::trailers(fields.drain(..)) else {
                return self.stream_error(id, Reason::PROTOCOL_ERROR);
            };
            push_event(
                &mut self.events,
                Event::Trailers {
                    stream: id,
                    trailers,
                },
            );
            self.remove_if_closed(index);
            return Ok(());
        }
        if id <= self.last_stream {
            if self.recent_resets.contains(&id) {
                return Ok(());
            }
            return Err(protocol(
                "HEADERS on a closed stream, or a stream id not increasing",
            ));
        }
        self.highest_stream = self.highest_stream.max(id);
        if matches!(self.phase, Phase::Draining { final_sent: true }) {
            // After the final GOAWAY: ignored, as the client will learn, and so are the
            // stream's other frames.
            return Ok(());
        }
        self.last_stream = id;
        if self.streams.len() >= self.config.max_concurrent_streams as usize {
            frame::encode_reset(id, Reason::REFUSED_STREAM, self.output.buf());
            self.remember_reset(id);
            return Ok(());
        }
        self.floods.stream_opened();
        let mut state = State::Idle;
        // An idle stream takes HEADERS, with or without END_STREAM.
        let _ = state.recv_headers(end_stream);
        if self.streams.capacity() == 0
            && let Some(spare) = spares::take(&STREAM_LISTS)
        {
            self.streams = spare;
        }
        self.streams.push(Stream {
            id,
            state,
            recv: Credit::new(self.acked_stream_window),
            send: Window::new(self.peer_initial_window),
            remaining: None,
            opened_at: now,
            taken: false,
            head_sent: false,
            unreleased: 0,
            wants_send: false,
            discarding: false,
        });
        if on_itself {
            return self.stream_error(id, Reason::PROTOCOL_ERROR);
        }
        if too_large {
            return self.refuse(id, b"431", Reason::NO_ERROR);
        }
        // The client's count of fields, within the hint a map starts at.
        let headers = (self.config.header_map)(fields.len().min(head::CAPACITY_HINT));
        let connect_protocol = self.config.enable_connect_protocol;
        let head = match head::request_in(headers, fields.drain(..), connect_protocol) {
            Ok(head) if !(end_stream && head.content_length.is_some_and(|n| n > 0)) => head,
            _ => return self.refuse(id, b"400", Reason::PROTOCOL_ERROR),
        };
        if let Some(stream) = self.streams.last_mut() {
            stream.remaining = head.content_length;
        }
        push_event(
            &mut self.events,
            Event::Request {
                stream: id,
                head,
                end_stream,
            },
        );
        Ok(())
    }

    /// A request head this side refuses is answered (`status`) before its stream is reset
    /// with `reason` (RFC 9113 section 8.1.1 allows a response first): 431 for a head over
    /// the limit, as h2 answers it (then `NO_ERROR`, if the request is still coming), 400
    /// for a malformed one (then `PROTOCOL_ERROR`).
    fn refuse(&mut self, id: u32, status: &[u8], reason: Reason) -> Result<(), ConnectionError> {
        let mut block = BytesMut::new();
        self.encoder
            .encode([(&b":status"[..], status, false)], &mut block);
        let max_frame = self.peer_max_frame_size as usize;
        frame::encode_header_block(id, &block.freeze(), true, max_frame, self.output.buf());
        if let Some(index) = self.stream_index(id) {
            let stream = &mut self.streams[index];
            stream.state.send(true);
            if reason != Reason::NO_ERROR || !stream.state.is_closed() {
                frame::encode_reset(id, reason, self.output.buf());
                stream.state.send_reset();
                self.remember_reset(id);
            }
            self.remove(index);
        }
        self.floods
            .local_error_reset(&self.config.floods)
            .map_err(flood)
    }

    fn recv_data(
        &mut self,
        id: u32,
        end_stream: bool,
        data: Bytes,
        flow_len: u32,
    ) -> Result<(), ConnectionError> {
        // Every DATA counts against the connection's window, whatever its stream.
        if self.recv_window.received(flow_len).is_err() {
            return Err(ConnectionError::new(
                Reason::FLOW_CONTROL_ERROR,
                "DATA over the connection's window",
            ));
        }
        let Some(index) = self.stream_index(id) else {
            // Not a stream this side keeps: its bytes go back to the window at once.
            self.release_connection(flow_len);
            if self.is_idle(id) {
                return Err(protocol("DATA on an idle stream"));
            }
            if self.is_after_goaway(id) || self.recent_resets.contains(&id) {
                return Ok(());
            }
            // A stream this side finished and forgot may still have DATA on its way: reset,
            // but not counted as the client's error.
            frame::encode_reset(id, Reason::STREAM_CLOSED, self.output.buf());
            self.remember_reset(id);
            return Ok(());
        };
        let stream = &mut self.streams[index];
        match stream.state.recv_data(end_stream) {
            Ok(Arrival::Deliver) => {}
            Ok(Arrival::Ignore) => {
                self.release_connection(flow_len);
                return Ok(());
            }
            Err(error) => {
                self.release_connection(flow_len);
                return self.state_error(id, error);
            }
        }
        if stream.recv.received(flow_len).is_err() {
            self.release_connection(flow_len);
            return self.stream_error(id, Reason::FLOW_CONTROL_ERROR);
        }
        let len = data.len() as u32;
        if stream.discarding {
            // Nobody wants the rest of this body: its window goes back at once, and a body
            // that ends short of its length no longer matters.
            stream.unreleased += flow_len;
            self.release(id, flow_len);
            if let Some(index) = self.stream_index(id) {
                self.remove_if_closed(index);
            }
            return Ok(());
        }
        stream.remaining = match stream.remaining.map(|n| n.checked_sub(u64::from(len))) {
            Some(None) => {
                self.release_connection(flow_len);
                return self.stream_error(id, Reason::PROTOCOL_ERROR);
            }
            Some(Some(n)) if end_stream && n > 0 => {
                self.release_connection(flow_len);
                return self.stream_error(id, Reason::PROTOCOL_ERROR);
            }
            other => other.flatten(),
        };
        let padding = flow_len - len;
        stream.unreleased += len;
        // A small payload is copied: kept as it is, it would keep the whole read it came in
        // alive, and a client could make each byte of window hold a read's worth.
        let data = if data.len() < SMALL_DATA {
            Bytes::copy_from_slice(&data)
        } else {
            data
        };
        // Padding is nobody's to take: it goes back at once.
        if padding > 0 {
            stream.unreleased += padding;
            self.release(id, padding);
        }
        push_event(
            &mut self.events,
            Event::Data {
                stream: id,
                data,
                end_stream,
            },
        );
        if let Some(index) = self.stream_index(id) {
            self.remove_if_closed(index);
        }
        Ok(())
    }

    fn recv_reset(&mut self, id: u32, reason: Reason, now: Instant) -> Result<(), ConnectionError> {
        let Some(index) = self.stream_index(id) else {
            if self.is_idle(id) {
                return Err(protocol("RST_STREAM on an idle stream"));
            }
            return Ok(());
        };
        let stream = &mut self.streams[index];
        let ended_locally = matches!(stream.state, State::HalfClosedLocal { .. });
        match stream.state.recv_reset() {
            Ok(Arrival::Deliver) => {}
            Ok(Arrival::Ignore) => return Ok(()),
            Err(error) => return self.state_error(id, error),
        }
        let taken = stream.taken;
        let premature =
            !ended_locally && Self::age(stream, now) < self.config.floods.premature_reset_age;
        if taken {
            push_event(&mut self.events, Event::Reset { stream: id, reason });
        } else {
            self.drop_events(id);
        }
        self.remove(index);
        self.floods
            .peer_reset(taken, premature, &self.config.floods)
            .map_err(flood)
    }

    fn recv_window_update(&mut self, id: u32, increment: u32) -> Result<(), ConnectionError> {
        if id == 0 {
            if self.send_window.grow(increment).is_err() {
                return Err(ConnectionError::new(
                    Reason::FLOW_CONTROL_ERROR,
                    "a WINDOW_UPDATE that takes the connection's window over 2^31-1",
                ));
            }
            self.wake_senders();
            return Ok(());
        }
        let Some(index) = self.stream_index(id) else {
            if self.is_idle(id) {
                return Err(protocol("WINDOW_UPDATE on an idle stream"));
            }
            return Ok(());
        };
        let stream = &mut self.streams[index];
        match stream.state.recv_window_update() {
            Ok(Arrival::Deliver) => {}
            Ok(Arrival::Ignore) => return Ok(()),
            Err(error) => return self.state_error(id, error),
        }
        if stream.send.grow(increment).is_err() {
            return self.stream_error(id, Reason::FLOW_CONTROL_ERROR);
        }
        self.wake_senders();
        Ok(())
    }

    fn peer_settings(&mut self, settings: Settings) -> Result<(), ConnectionError> {
        if let Some(size) = settings.header_table_size {
            self.encoder.set_peer_limit(size as usize);
        }
        if let Some(size) = settings.max_frame_size {
            self.peer_max_frame_size = size;
        }
        if let Some(new) = settings.initial_window_size {
            let old = self.peer_initial_window;
            for stream in &mut self.streams {
                if stream.send.resize(old, new).is_err() {
                    return Err(ConnectionError::new(
                        Reason::FLOW_CONTROL_ERROR,
                        "SETTINGS_INITIAL_WINDOW_SIZE takes a stream's window over 2^31-1",
                    ));
                }
            }
            self.peer_initial_window = new;
            self.wake_senders();
        }
        Ok(())
    }

    /// The client acknowledged this side's SETTINGS: they are in force.
    fn settings_acked(&mut self) {
        if !std::mem::take(&mut self.settings_unacked) {
            return;
        }
        self.decoder
            .set_limit(self.config.header_table_size as usize);
        let (old, new) = (self.acked_stream_window, self.config.initial_stream_window);
        for stream in &mut self.streams {
            // Within bounds: both sizes are at most 2^31-1 and the window at most the old.
            let _ = stream.recv.resize(old, new);
        }
        self.acked_stream_window = new;
    }

    fn control_frame(&mut self, now: Instant) -> Result<(), ConnectionError> {
        self.floods
            .control_frame(now, &self.config.floods)
            .map_err(flood)
    }

    fn frame_error(&mut self, error: FrameError) -> Result<(), ConnectionError> {
        match error.stream {
            Some(id) => self.stream_error(id, error.reason),
            None => Err(ConnectionError::new(error.reason, error.what)),
        }
    }

    fn state_error(&mut self, id: u32, error: StateError) -> Result<(), ConnectionError> {
        match error.scope {
            Scope::Stream => self.stream_error(id, error.reason),
            Scope::Connection => Err(ConnectionError::new(error.reason, error.what)),
        }
    }

    /// Resets a stream for the client's error.
    fn stream_error(&mut self, id: u32, reason: Reason) -> Result<(), ConnectionError> {
        frame::encode_reset(id, reason, self.output.buf());
        self.remember_reset(id);
        if let Some(index) = self.stream_index(id) {
            let stream = &mut self.streams[index];
            stream.state.send_reset();
            if stream.taken {
                push_event(&mut self.events, Event::Reset { stream: id, reason });
            } else {
                self.drop_events(id);
            }
            self.remove(index);
        }
        self.floods
            .local_error_reset(&self.config.floods)
            .map_err(flood)
    }

    /// A stream the client has not opened (nor skipped over): frames other than HEADERS and
    /// PRIORITY on it are a connection error.
    fn is_idle(&self, id: u32) -> bool {
        id.is_multiple_of(2) || id > self.highest_stream
    }

    /// A stream the client opened after the final GOAWAY: its frames are dropped.
    fn is_after_goaway(&self, id: u32) -> bool {
        id > self.last_stream
    }

    pub(super) fn remember_reset(&mut self, id: u32) {
        if self.recent_resets.len() == RECENT_RESETS {
            self.recent_resets.pop_front();
        }
        self.recent_resets.push_back(id);
    }

    /// Drops the events of a stream whose request the application never took.
    fn drop_events(&mut self, id: u32) {
        self.events.retain(|event| match event {
            Event::Request { stream, .. }
            | Event::Data { stream, .. }
            | Event::Trailers { stream, .. } => *stream != id,
            _ => true,
        });
        self.release_events();
    }

    pub(super) fn remove_if_closed(&mut self, index: usize) {
        if self.streams[index].state.is_closed() {
            self.remove(index);
        }
    }

    /// Ends the connection: GOAWAY with the error, and every stream dropped.
    fn close(&mut self, error: ConnectionError) {
        frame::encode_goaway(
            self.last_stream,
            error.reason,
            error.what.as_bytes(),
            self.output.buf(),
        );
        self.phase = Phase::Closed;
        self.streams.clear();
        self.release_streams();
        self.events.clear();
        self.release_events();
    }
}

/// DATA payloads shorter than this are copied out of the read they came in.
const SMALL_DATA: usize = 4096;

fn protocol(what: &'static str) -> ConnectionError {
    ConnectionError::new(Reason::PROTOCOL_ERROR, what)
}

fn flood(flood: Flood) -> ConnectionError {
    let what = match flood {
        Flood::Reset => "too many streams reset before they were served",
        Flood::StreamErrors => "too many stream errors",
        Flood::Continuation => "a header block in too many CONTINUATION frames",
        Flood::Control => "too many PING or SETTINGS frames",
    };
    ConnectionError {
        reason: Reason::ENHANCE_YOUR_CALM,
        what,
        flood: Some(flood),
    }
}
