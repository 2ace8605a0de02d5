//! A stream's life (RFC 9113 section 5.1) as the frames sent and received move it, and the
//! errors a frame in the wrong state is. Push is never used (a server does not push; a
//! client announces `SETTINGS_ENABLE_PUSH = 0`), so the reserved states do not occur.

use crate::frame::Reason;

/// Where a stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Idle,
    Open {
        /// The peer's first HEADERS came (its message has begun).
        received_head: bool,
    },
    /// This side sent END_STREAM.
    HalfClosedLocal {
        received_head: bool,
    },
    /// The peer sent END_STREAM.
    HalfClosedRemote,
    Closed(Closed),
}

/// How a stream closed: what may still arrive on it differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Both sides ended their messages.
    Ended,
    /// This side reset it: frames the peer sent before it knew are dropped.
    ResetLocally,
    /// The peer reset it.
    ResetByPeer,
}

/// A frame that the stream's state does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} ({reason:?}, {scope:?})")]
pub struct StateError {
    pub reason: Reason,
    pub scope: Scope,
    pub what: &'static str,
}

/// Whether an error resets the stream or ends the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Stream,
    Connection,
}

/// What to do with a frame that arrived on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Hand it on.
    Deliver,
    /// Drop it: the stream was reset by this side and the peer had not heard yet (DATA
    /// still counts against the connection's window).
    Ignore,
}

impl State {
    /// HEADERS arrived: the message's head, or (once the head came) its trailers, which
    /// must end it. A head that turns out to be interim (1xx) is followed by
    /// [`State::recv_interim`].
    pub fn recv_headers(&mut self, end_stream: bool) -> Result<Arrival, StateError> {
        let (received_head, local_ended) = match *self {
            State::Idle => (false, false),
            State::Open { received_head } => (received_head, false),
            State::HalfClosedLocal { received_head } => (received_head, true),
            _ => return self.after_end(),
        };
        if received_head && !end_stream {
            // A second HEADERS is trailers, which end the message (RFC 9113 section 8.1).
            return Err(stream_error(
                Reason::PROTOCOL_ERROR,
                "trailers without END_STREAM",
            ));
        }
        *self = match (end_stream, local_ended) {
            (false, false) => State::Open {
                received_head: true,
            },
            (false, true) => State::HalfClosedLocal {
                received_head: true,
            },
            (true, false) => State::HalfClosedRemote,
            (true, true) => State::Closed(Closed::Ended),
        };
        Ok(Arrival::Deliver)
    }

    /// The head just received was interim (1xx): the final head is still to come.
    pub fn recv_interim(&mut self) {
        if let State::Open { received_head } | State::HalfClosedLocal { received_head } = self {
            *received_head = false;
        }
    }

    /// DATA arrived.
    pub fn recv_data(&mut self, end_stream: bool) -> Result<Arrival, StateError> {
        let local_ended = match *self {
            State::Idle => {
                return Err(connection_error(
                    Reason::PROTOCOL_ERROR,
                    "DATA on an idle stream",
                ));
            }
            State::Open {
                received_head: false,
            }
            | State::HalfClosedLocal {
                received_head: false,
            } => {
                return Err(stream_error(
                    Reason::PROTOCOL_ERROR,
                    "DATA before the message's HEADERS",
                ));
            }
            State::Open { .. } => false,
            State::HalfClosedLocal { .. } => true,
            _ => return self.after_end(),
        };
        if end_stream {
            *self = if local_ended {
                State::Closed(Closed::Ended)
            } else {
                State::HalfClosedRemote
            };
        }
        Ok(Arrival::Deliver)
    }

    /// RST_STREAM arrived.
    pub fn recv_reset(&mut self) -> Result<Arrival, StateError> {
        match *self {
            State::Idle => Err(connection_error(
                Reason::PROTOCOL_ERROR,
                "RST_STREAM on an idle stream",
            )),
            State::Closed(Closed::ResetLocally | Closed::ResetByPeer) => Ok(Arrival::Ignore),
            _ => {
                *self = State::Closed(Closed::ResetByPeer);
                Ok(Arrival::Deliver)
            }
        }
    }

    /// WINDOW_UPDATE arrived. It may come after this side ended its message, or reset the
    /// stream, while the peer had not heard yet.
    pub fn recv_window_update(&self) -> Result<Arrival, StateError> {
        match *self {
            State::Idle => Err(connection_error(
                Reason::PROTOCOL_ERROR,
                "WINDOW_UPDATE on an idle stream",
            )),
            State::Closed(Closed::ResetByPeer) => Err(stream_error(
                Reason::STREAM_CLOSED,
                "WINDOW_UPDATE after RST_STREAM",
            )),
            State::Closed(_) => Ok(Arrival::Ignore),
            _ => Ok(Arrival::Deliver),
        }
    }

    /// This side sent HEADERS (a head, or trailers that end the message) or DATA.
    pub fn send(&mut self, end_stream: bool) {
        *self = match (*self, end_stream) {
            (State::Idle, false) => State::Open {
                received_head: false,
            },
            (State::Idle, true) => State::HalfClosedLocal {
                received_head: false,
            },
            (State::Open { received_head }, true) => State::HalfClosedLocal { received_head },
            (State::HalfClosedRemote, true) => State::Closed(Closed::Ended),
            (other, _) => other,
        };
    }

    /// This side reset the stream.
    pub fn send_reset(&mut self) {
        if !matches!(self, State::Closed(_)) {
            *self = State::Closed(Closed::ResetLocally);
        }
    }

    /// Whether this side may still send DATA or HEADERS.
    pub fn can_send(&self) -> bool {
        matches!(self, State::Open { .. } | State::HalfClosedRemote)
    }

    pub fn is_closed(&self) -> bool {
        matches!(self, State::Closed(_))
    }

    /// A frame other than PRIORITY, WINDOW_UPDATE and RST_STREAM after the peer ended its
    /// message or the stream closed.
    fn after_end(&self) -> Result<Arrival, StateError> {
        match *self {
            State::HalfClosedRemote => Err(stream_error(
                Reason::STREAM_CLOSED,
                "a frame after the peer's END_STREAM",
            )),
            State::Closed(Closed::ResetLocally) => Ok(Arrival::Ignore),
            State::Closed(Closed::ResetByPeer) => Err(stream_error(
                Reason::STREAM_CLOSED,
                "a frame after the peer's RST_STREAM",
            )),
            // RFC 9113 section 5.1: after END_STREAM both ways, a connection error.
            _ => Err(connection_error(
                Reason::STREAM_CLOSED,
                "a frame on a stream both sides ended",
            )),
        }
    }
}

fn stream_error(reason: Reason, what: &'static str) -> StateError {
    StateError {
        reason,
        scope: Scope::Stream,
        what,
    }
}

fn connection_error(reason: Reason, what: &'static str) -> StateError {
    StateError {
        reason,
        scope: Scope::Connection,
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(result: Result<Arrival, StateError>) -> Option<(Reason, Scope)> {
        result.err().map(|e| (e.reason, e.scope))
    }

    #[test]
    fn a_request_with_a_body_and_trailers_then_the_response() {
        let mut stream = State::Idle;
        assert_eq!(stream.recv_headers(false), Ok(Arrival::Deliver));
        assert_eq!(stream.recv_data(false), Ok(Arrival::Deliver));
        assert_eq!(stream.recv_window_update(), Ok(Arrival::Deliver));
        assert_eq!(stream.recv_headers(true), Ok(Arrival::Deliver));
        assert_eq!(stream, State::HalfClosedRemote);
        assert!(stream.can_send());
        stream.send(false);
        stream.send(true);
        assert_eq!(stream, State::Closed(Closed::Ended));
        // A WINDOW_UPDATE the peer sent before it saw the end is dropped; DATA is not
        // allowed.
        assert_eq!(stream.recv_window_update(), Ok(Arrival::Ignore));
        assert_eq!(
            scope(stream.recv_data(false)),
            Some((Reason::STREAM_CLOSED, Scope::Connection))
        );
    }

    #[test]
    fn frames_after_the_peer_ended_its_message() {
        let mut stream = State::Idle;
        assert_eq!(stream.recv_headers(true), Ok(Arrival::Deliver));
        assert_eq!(
            scope(stream.recv_data(false)),
            Some((Reason::STREAM_CLOSED, Scope::Stream))
        );
        assert_eq!(
            scope(stream.recv_headers(true)),
            Some((Reason::STREAM_CLOSED, Scope::Stream))
        );
        assert_eq!(stream.recv_reset(), Ok(Arrival::Deliver));
        assert_eq!(stream, State::Closed(Closed::ResetByPeer));
        assert_eq!(
            scope(stream.recv_window_update()),
            Some((Reason::STREAM_CLOSED, Scope::Stream))
        );
    }

    #[test]
    fn trailers_must_end_the_message() {
        let mut stream = State::Idle;
        assert_eq!(stream.recv_headers(false), Ok(Arrival::Deliver));
        assert_eq!(
            scope(stream.recv_headers(false)),
            Some((Reason::PROTOCOL_ERROR, Scope::Stream))
        );
    }

    #[test]
    fn idle_streams_take_only_headers() {
        assert_eq!(
            scope(State::Idle.recv_data(true)),
            Some((Reason::PROTOCOL_ERROR, Scope::Connection))
        );
        assert_eq!(
            scope(State::Idle.recv_reset()),
            Some((Reason::PROTOCOL_ERROR, Scope::Connection))
        );
        assert_eq!(
            scope(State::Idle.recv_window_update()),
            Some((Reason::PROTOCOL_ERROR, Scope::Connection))
        );
    }

    #[test]
    fn after_a_local_reset_what_was_in_flight_is_dropped() {
        let mut stream = State::Idle;
        assert_eq!(stream.recv_headers(false), Ok(Arrival::Deliver));
        stream.send_reset();
        assert!(!stream.can_send());
        assert_eq!(stream.recv_data(false), Ok(Arrival::Ignore));
        assert_eq!(stream.recv_headers(true), Ok(Arrival::Ignore));
        assert_eq!(stream.recv_window_update(), Ok(Arrival::Ignore));
        assert_eq!(stream.recv_reset(), Ok(Arrival::Ignore));
        assert!(stream.is_closed());
    }

    #[test]
    fn a_client_stream_opens_by_sending() {
        let mut stream = State::Idle;
        stream.send(true);
        assert!(!stream.can_send());
        assert_eq!(
            scope(stream.recv_data(false)),
            Some((Reason::PROTOCOL_ERROR, Scope::Stream)),
            "no body before the response's head"
        );
        // A 100 Continue, then the response: its head, then its body's end.
        assert_eq!(stream.recv_headers(false), Ok(Arrival::Deliver));
        stream.recv_interim();
        assert_eq!(stream.recv_headers(false), Ok(Arrival::Deliver));
        assert_eq!(
            scope({
                let mut copy = stream;
                copy.recv_headers(false)
            }),
            Some((Reason::PROTOCOL_ERROR, Scope::Stream)),
            "trailers must end it"
        );
        assert_eq!(stream.recv_data(true), Ok(Arrival::Deliver));
        assert_eq!(stream, State::Closed(Closed::Ended));
    }
}
