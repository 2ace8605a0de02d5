//! What the application sends: responses, their bodies and trailers, resets, window
//! credit, PINGs and GOAWAY; and the output it becomes.

use std::io::IoSlice;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};

use super::{Connection, Event, Phase, SendError, push_event};
use crate::frame::{self, MAX_WINDOW, Reason};
use crate::stream::State;

impl Connection {
    /// Sends a response's head; `end_stream` when it has no body.
    pub fn send_response(
        &mut self,
        id: u32,
        head: &http::response::Parts,
        end_stream: bool,
    ) -> Result<(), SendError> {
        self.send_response_head(id, head.status, &head.headers, end_stream)
    }

    /// As [`send_response`](Self::send_response), from the head's status and fields: for a
    /// caller that keeps its response whole rather than taking it apart (a move of it all).
    pub fn send_response_head(
        &mut self,
        id: u32,
        status: StatusCode,
        headers: &HeaderMap,
        end_stream: bool,
    ) -> Result<(), SendError> {
        let index = self.sendable(id)?;
        if self.streams[index].head_sent {
            return Err(SendError::HeadSent);
        }
        self.streams[index].head_sent = true;
        self.send_head(index, Some(status), headers, end_stream);
        Ok(())
    }

    /// Sends an interim (1xx) response: 100 Continue, 103 Early Hints.
    pub fn send_interim(
        &mut self,
        id: u32,
        status: StatusCode,
        headers: &HeaderMap,
    ) -> Result<(), SendError> {
        let index = self.sendable(id)?;
        if self.streams[index].head_sent {
            return Err(SendError::HeadSent);
        }
        self.send_head(index, Some(status), headers, false);
        Ok(())
    }

    /// Sends as much of `data` as the windows and the output's room allow, splitting it into
    /// frames; what is left stays in `data`, and [`Event::SendReady`] comes when more can
    /// go. `end_stream` ends the response once all of it is sent.
    pub fn send_data(
        &mut self,
        id: u32,
        data: &mut Bytes,
        end_stream: bool,
    ) -> Result<(), SendError> {
        let index = self.sendable(id)?;
        if !self.streams[index].head_sent {
            return Err(SendError::HeadNotSent);
        }
        loop {
            let stream = &mut self.streams[index];
            if data.is_empty() && !end_stream {
                return Ok(());
            }
            let room = (stream.send.available())
                .min(self.send_window.available())
                .min(self.peer_max_frame_size) as usize;
            let room = room.min(self.config.max_output.saturating_sub(self.output.len()));
            let n = room.min(data.len());
            if n == 0 && !data.is_empty() {
                stream.wants_send = true;
                return Ok(());
            }
            let chunk = data.split_to(n);
            let last = end_stream && data.is_empty();
            frame::encode_data_head(id, n, last, self.output.buf());
            self.output.payload(chunk);
            // Within the windows, as `room` was.
            let _ = stream.send.consume(n as u32);
            let _ = self.send_window.consume(n as u32);
            self.floods.response_frame_sent();
            if last {
                stream.state.send(true);
                self.remove_if_closed(index);
                return Ok(());
            }
            if data.is_empty() {
                return Ok(());
            }
        }
    }

    /// Sends trailers, which end the response.
    pub fn send_trailers(&mut self, id: u32, trailers: &HeaderMap) -> Result<(), SendError> {
        let index = self.sendable(id)?;
        if !self.streams[index].head_sent {
            return Err(SendError::HeadNotSent);
        }
        self.send_head(index, None, trailers, true);
        Ok(())
    }

    /// What `send_data` could send on the stream now.
    pub fn send_capacity(&self, id: u32) -> usize {
        let Some(stream) = self.streams.iter().find(|s| s.id == id) else {
            return 0;
        };
        let room = stream.send.available().min(self.send_window.available()) as usize;
        room.min(self.config.max_output.saturating_sub(self.output.len()))
    }

    /// Resets a stream (the application gave it up: `CANCEL`; or its response is done and
    /// the rest of the request is not wanted: `NO_ERROR`). Nothing more comes of it.
    pub fn reset(&mut self, id: u32, reason: Reason) {
        let Some(index) = self.stream_index(id) else {
            return;
        };
        frame::encode_reset(id, reason, self.output.buf());
        self.streams[index].state.send_reset();
        self.remember_reset(id);
        self.remove(index);
    }

    /// The application wants no more of the stream's request body (it answered without it):
    /// what still comes is dropped and its window given back at once, and a body that ends
    /// short of its `content-length` is no error. Data already handed on and not released is
    /// given back too.
    pub fn discard_body(&mut self, id: u32) {
        let Some(stream) = self.stream_mut(id) else {
            return;
        };
        stream.discarding = true;
        let unreleased = stream.unreleased;
        self.release(id, unreleased);
    }

    /// The application took `n` bytes of the stream's body: window credit goes back to the
    /// client (in few updates, see [`crate::flow::Credit`]).
    pub fn release(&mut self, id: u32, n: u32) {
        let Some(stream) = self.stream_mut(id) else {
            // A stream that went gave its untaken bytes back then.
            return;
        };
        let n = n.min(stream.unreleased);
        stream.unreleased -= n;
        let receiving = matches!(
            stream.state,
            State::Open { .. } | State::HalfClosedLocal { .. }
        );
        let increment = if receiving {
            stream.recv.release(n)
        } else {
            None
        };
        if let Some(increment) = increment {
            frame::encode_window_update(id, increment, self.output.buf());
        }
        self.release_connection(n);
    }

    /// Sends a PING; its answer comes as [`Event::Pong`].
    pub fn ping(&mut self, payload: [u8; 8]) {
        if self.phase != Phase::Closed {
            frame::encode_ping(false, payload, self.output.buf());
        }
    }

    /// Begins a graceful shutdown: GOAWAY naming no stream as the last (requests already on
    /// their way are still served) and a PING; once the PING is answered, the final GOAWAY
    /// names the last stream opened, and streams after it are ignored. Streams open finish.
    pub fn go_away(&mut self) {
        match self.phase {
            Phase::Open => {
                frame::encode_goaway(MAX_WINDOW, Reason::NO_ERROR, b"", self.output.buf());
                frame::encode_ping(false, super::DRAIN_PING, self.output.buf());
                self.phase = Phase::Draining { final_sent: false };
            }
            // Told to go before the client even began: it is closed.
            Phase::Preface | Phase::FirstSettings => {
                frame::encode_goaway(0, Reason::NO_ERROR, b"", self.output.buf());
                self.phase = Phase::Closed;
            }
            Phase::Draining { .. } | Phase::Closed => {}
        }
    }

    /// Sends the final GOAWAY without waiting for the PING's answer (a client that does not
    /// answer).
    pub fn finish_drain(&mut self) {
        if matches!(
            self.phase,
            Phase::Draining { final_sent: true } | Phase::Closed
        ) {
            return;
        }
        frame::encode_goaway(self.last_stream, Reason::NO_ERROR, b"", self.output.buf());
        self.phase = Phase::Draining { final_sent: true };
    }

    /// Bytes waiting to be written.
    pub fn output_len(&self) -> usize {
        self.output.len()
    }

    /// Fills `dst` with the next bytes to write, for one vectored write; returns how many
    /// slices it filled.
    pub fn output<'a>(&'a self, dst: &mut [IoSlice<'a>]) -> usize {
        self.output.slices(dst)
    }

    /// `n` bytes of the output were written. Streams waiting for room may send again.
    pub fn advance_output(&mut self, n: usize) {
        let was_full = self.output.len() >= self.config.max_output;
        self.output.advance(n);
        if was_full || self.output.len() == 0 {
            self.wake_senders();
        }
    }

    /// Wakes the streams waiting to send that can now.
    pub(super) fn wake_senders(&mut self) {
        if self.send_window.available() == 0 || self.output.len() >= self.config.max_output {
            return;
        }
        for stream in &mut self.streams {
            if stream.wants_send && stream.send.available() > 0 {
                stream.wants_send = false;
                push_event(&mut self.events, Event::SendReady { stream: stream.id });
            }
        }
    }

    /// The stream's index, if the application may still send on it.
    fn sendable(&self, id: u32) -> Result<usize, SendError> {
        if self.phase == Phase::Closed {
            return Err(SendError::ConnectionEnded);
        }
        self.stream_index(id)
            .filter(|&i| self.streams[i].state.can_send())
            .ok_or(SendError::StreamClosed(id))
    }

    /// A head (with `status`) or trailers (without), as HEADERS and CONTINUATION frames.
    /// Connection-specific fields, which HTTP/2 forbids, are left out.
    fn send_head(
        &mut self,
        index: usize,
        status: Option<StatusCode>,
        headers: &HeaderMap,
        end_stream: bool,
    ) {
        let pseudo = status
            .as_ref()
            .map(|s| (&b":status"[..], s.as_str().as_bytes(), false));
        let regular = headers
            .iter()
            .filter(|(name, _)| !is_connection_specific(name))
            .map(|(name, value)| {
                (
                    name.as_str().as_bytes(),
                    value.as_bytes(),
                    value.is_sensitive(),
                )
            });
        let stream = &mut self.streams[index];
        let max_frame = self.peer_max_frame_size as usize;
        let encoder = &mut self.encoder;
        frame::encode_header_block_with(
            stream.id,
            end_stream,
            max_frame,
            self.output.buf(),
            |out| encoder.encode(pseudo.into_iter().chain(regular), out),
        );
        self.floods.response_frame_sent();
        if end_stream {
            stream.state.send(true);
            self.remove_if_closed(index);
        } else {
            stream.state.send(false);
        }
    }
}

fn is_connection_specific(name: &http::HeaderName) -> bool {
    [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::TE,
    ]
    .contains(name)
        || name == "keep-alive"
        || name == "proxy-connection"
}
