//! Header blocks put together from a HEADERS or PUSH_PROMISE frame and the CONTINUATION
//! frames after it (RFC 9113 section 6.10), with the CONTINUATION flood bounded: a block
//! may take only so many frames and so many bytes before the connection ends.

use bytes::{Bytes, BytesMut};

use super::{Frame, FrameError, Reason};

/// Puts header blocks together; every frame read goes through [`BlockAssembler::push`].
#[derive(Debug)]
pub struct BlockAssembler {
    partial: Option<Partial>,
    max_frames: usize,
    max_bytes: usize,
}

#[derive(Debug)]
struct Partial {
    /// The HEADERS or PUSH_PROMISE frame, its fragment moved into `block`.
    first: Frame,
    stream: u32,
    block: BytesMut,
    continuations: usize,
}

impl BlockAssembler {
    /// For a side that announces `max_header_list_size` and `max_frame_size`. A block may
    /// take a quarter more frames than the list's size in full frames (and 5 whatever the
    /// sizes), h2's bound: more ends the connection (`ENHANCE_YOUR_CALM`), as a peer that
    /// fills its frames never needs them. Its bytes may reach four times the list's size
    /// (h2's abuse bound), so that a list somewhat over the limit is still read and only
    /// its stream refused (431).
    pub fn new(max_header_list_size: usize, max_frame_size: usize) -> Self {
        let frames = (max_header_list_size / max_frame_size.max(1)).max(1);
        BlockAssembler {
            partial: None,
            max_frames: (frames + frames / 4).max(5),
            max_bytes: max_header_list_size.saturating_mul(4).max(16 * 1024),
        }
    }

    /// Whether a block is half read (only its CONTINUATION frames may come next).
    pub fn is_partial(&self) -> bool {
        self.partial.is_some()
    }

    /// What a frame error read from the wire is here: inside a block, any frame but a
    /// CONTINUATION ends the connection (RFC 9113 section 6.10), even one that would only
    /// have reset its stream.
    pub fn frame_error(&self, error: FrameError) -> FrameError {
        if self.is_partial() && error.stream.is_some() {
            return protocol("a frame other than CONTINUATION inside a header block");
        }
        error
    }

    /// Takes a frame as read. A HEADERS or PUSH_PROMISE frame comes back with its whole
    /// block as its fragment and `end_headers` set once the block is complete (`Ok(None)`
    /// until then); other frames come back as they are.
    pub fn push(&mut self, frame: Frame) -> Result<Option<Frame>, FrameError> {
        match (self.partial.as_mut(), frame) {
            (
                Some(partial),
                Frame::Continuation {
                    stream,
                    end_headers,
                    fragment,
                },
            ) => {
                if stream != partial.stream {
                    return Err(protocol("CONTINUATION on another stream than its block's"));
                }
                partial.continuations += 1;
                if !end_headers && partial.continuations > self.max_frames {
                    return Err(FrameError::connection(
                        Reason::ENHANCE_YOUR_CALM,
                        "a header block in too many CONTINUATION frames",
                    ));
                }
                if partial.block.len() + fragment.len() > self.max_bytes {
                    return Err(FrameError::connection(
                        Reason::ENHANCE_YOUR_CALM,
                        "a header block over four times the header list size",
                    ));
                }
                partial.block.extend_from_slice(&fragment);
                if !end_headers {
                    return Ok(None);
                }
                let Some(Partial { first, block, .. }) = self.partial.take() else {
                    return Ok(None);
                };
                Ok(Some(complete(first, block.freeze())))
            }
            (Some(_), _) => Err(protocol(
                "a frame other than CONTINUATION inside a header block",
            )),
            (None, Frame::Continuation { .. }) => {
                Err(protocol("CONTINUATION without a header block before it"))
            }
            (None, frame) => self.first(frame),
        }
    }

    fn first(&mut self, frame: Frame) -> Result<Option<Frame>, FrameError> {
        let (stream, fragment) = match &frame {
            Frame::Headers {
                stream,
                end_headers: false,
                fragment,
                ..
            }
            | Frame::PushPromise {
                stream,
                end_headers: false,
                fragment,
                ..
            } => (*stream, fragment),
            _ => return Ok(Some(frame)),
        };
        if fragment.len() > self.max_bytes {
            return Err(FrameError::connection(
                Reason::ENHANCE_YOUR_CALM,
                "a header block over four times the header list size",
            ));
        }
        self.partial = Some(Partial {
            stream,
            block: BytesMut::from(&fragment[..]),
            first: frame,
            continuations: 0,
        });
        Ok(None)
    }
}

fn protocol(what: &'static str) -> FrameError {
    FrameError::connection(Reason::PROTOCOL_ERROR, what)
}

/// The first frame with the whole block.
fn complete(first: Frame, block: Bytes) -> Frame {
    match first {
        Frame::Headers {
            stream,
            end_stream,
            priority,
            ..
        } => Frame::Headers {
            stream,
            end_stream,
            end_headers: true,
            priority,
            fragment: block,
        },
        Frame::PushPromise {
            stream, promised, ..
        } => Frame::PushPromise {
            stream,
            promised,
            end_headers: true,
            fragment: block,
        },
        other => other,
    }
}
