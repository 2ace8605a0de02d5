//! A streaming call: messages sent and read one at a time on one HTTP/2 stream of the
//! channel's connection, as a bidirectional gRPC method (ext_proc's `Process`) takes them.

use bytes::{Buf, Bytes, BytesMut};
use h2::client::ResponseFuture;
use h2::{RecvStream, SendStream};
use http::StatusCode;

use crate::frame::{FRAME_PREFIX, unary_frame};
use crate::status::{code_of_http_status, grpc_status, status};
use crate::{ChannelError, transport_error};

/// One open streaming call. Dropped before it ended, the stream is reset (cancelled).
pub struct DuplexCall {
    sender: DuplexSender,
    receiver: DuplexReceiver,
}

/// The sending half of a call (see [`DuplexCall::split`]).
pub struct DuplexSender {
    send: SendStream<Bytes>,
}

/// The receiving half of a call. The stream is reset once both halves are dropped, if it has
/// not ended by then.
pub struct DuplexReceiver {
    recv: Recv,
    /// Bytes read past the last whole message.
    pending: BytesMut,
}

enum Recv {
    /// The answer's head has not come.
    Head(ResponseFuture),
    Body(RecvStream),
    /// The service ended its side (its status was OK).
    Ended,
}

impl DuplexCall {
    pub(crate) fn new(send: SendStream<Bytes>, response: ResponseFuture) -> Self {
        Self {
            sender: DuplexSender { send },
            receiver: DuplexReceiver {
                recv: Recv::Head(response),
                pending: BytesMut::new(),
            },
        }
    }

    /// Its halves, for a call whose messages are sent from one place and read in another.
    pub fn split(self) -> (DuplexSender, DuplexReceiver) {
        (self.sender, self.receiver)
    }

    /// Sends one encoded message (framed here). The connection takes it whatever the flow
    /// control window: a message waits in its send buffer.
    pub fn send(&mut self, message: &[u8]) -> Result<(), ChannelError> {
        self.sender.send(message)
    }

    /// Ends the sending side (a half close): the service has had every message.
    pub fn finish(&mut self) -> Result<(), ChannelError> {
        self.sender.finish()
    }

    /// The next message the service sends; `None` once it ended the call with an OK status.
    /// A message over `max_message` bytes, a compressed one, or a status other than OK is an
    /// error. Cancelled, nothing is lost: what was read of a message stays for the next call.
    pub async fn recv(&mut self, max_message: usize) -> Result<Option<Bytes>, ChannelError> {
        self.receiver.recv(max_message).await
    }
}

impl DuplexSender {
    /// Sends one encoded message (framed here). The connection takes it whatever the flow
    /// control window: a message waits in its send buffer.
    pub fn send(&mut self, message: &[u8]) -> Result<(), ChannelError> {
        self.send
            .send_data(unary_frame(message), false)
            .map_err(|e| transport_error(&e))
    }

    /// Ends the sending side (a half close): the service has had every message.
    pub fn finish(&mut self) -> Result<(), ChannelError> {
        self.send
            .send_data(Bytes::new(), true)
            .map_err(|e| transport_error(&e))
    }
}

impl DuplexReceiver {
    /// As [`DuplexCall::recv`].
    pub async fn recv(&mut self, max_message: usize) -> Result<Option<Bytes>, ChannelError> {
        loop {
            if let Some(message) = self.take_message(max_message)? {
                return Ok(Some(message));
            }
            match &mut self.recv {
                Recv::Ended => return Ok(None),
                Recv::Head(response) => {
                    let (head, body) = response
                        .await
                        .map_err(|e| transport_error(&e))?
                        .into_parts();
                    if head.status != StatusCode::OK {
                        return Err(status(
                            code_of_http_status(head.status),
                            format!("the service answered HTTP {}", head.status),
                        ));
                    }
                    // Trailers-only: the call ended without a message.
                    if let Some(outcome) = grpc_status(&head.headers) {
                        self.recv = Recv::Ended;
                        outcome?;
                        return Ok(None);
                    }
                    self.recv = Recv::Body(body);
                }
                Recv::Body(body) => match body.data().await {
                    Some(data) => {
                        let data = data.map_err(|e| transport_error(&e))?;
                        let _ = body.flow_control().release_capacity(data.len());
                        self.pending.extend_from_slice(&data);
                    }
                    None => {
                        let trailers = body.trailers().await.map_err(|e| transport_error(&e))?;
                        self.recv = Recv::Ended;
                        match trailers.as_ref().and_then(grpc_status) {
                            Some(outcome) => outcome?,
                            None => {
                                return Err(status(
                                    tonic::Code::Internal,
                                    "a call ended without grpc-status",
                                ));
                            }
                        }
                        if !self.pending.is_empty() {
                            return Err(status(
                                tonic::Code::Internal,
                                "a call ended inside a message",
                            ));
                        }
                        return Ok(None);
                    }
                },
            }
        }
    }

    /// A whole message from the bytes read, if they hold one.
    fn take_message(&mut self, max_message: usize) -> Result<Option<Bytes>, ChannelError> {
        let Some(prefix) = self.pending.first_chunk::<FRAME_PREFIX>().copied() else {
            return Ok(None);
        };
        if prefix[0] != 0 {
            // No compression was offered, so none may be used.
            return Err(status(tonic::Code::Internal, "a compressed message"));
        }
        let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
        if len > max_message {
            return Err(status(
                tonic::Code::ResourceExhausted,
                format!("a message larger than {max_message} bytes"),
            ));
        }
        if self.pending.len() < FRAME_PREFIX + len {
            return Ok(None);
        }
        self.pending.advance(FRAME_PREFIX);
        Ok(Some(self.pending.split_to(len).freeze()))
    }
}
