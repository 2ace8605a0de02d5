//! A meter on an HTTP/2 connection (io.rs runs it on what it reads and writes). It reads the
//! frame headers as the bytes pass (payloads are skipped, never copied) to catch what the
//! codec has no limit or no name for:
//!
//! - PING and SETTINGS floods: each such frame costs an answer. The codec queues one answer of
//!   each at most and stops reading until it is written, so a peer that does not read cannot
//!   grow memory; a peer that does read could keep a core busy answering. More than
//!   [`CONTROL_FRAMES_PER_WINDOW`] in one [`CONTROL_WINDOW`] with no response data or headers
//!   sent between them ends the connection (gRPC clients ping once per round trip while they
//!   receive data; the count starts again with each response frame).
//! - CONTINUATION floods: the codec ends them with GOAWAY ENHANCE_YOUR_CALM, as it ends reset
//!   floods; the meter tells which one it was, for the counters.

use std::cell::Cell;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

/// PING and SETTINGS frames (not their acknowledgements) a client may send in one window.
/// A browser sends a handful per connection; a keep-alive PING every second is 10 a window.
pub(super) const CONTROL_FRAMES_PER_WINDOW: u32 = 1000;
pub(super) const CONTROL_WINDOW: Duration = Duration::from_secs(10);

/// The client connection preface, which comes before the first frame.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const CONTINUATION: u8 = 0x9;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// What flood the meter saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flood {
    /// PING or SETTINGS frames over the budget: the meter ended the connection.
    Control,
    /// More CONTINUATION frames in one header block than the codec takes (it ends the
    /// connection itself).
    Continuation,
}

/// Follows an HTTP/2 connection's input, frame header by frame header, and what the proxy
/// writes back (response data or headers end a run of control frames).
pub(super) struct FrameMeter {
    scan: Scan,
    written: Framing,
    /// What it saw, for the connection task once the codec is done.
    flood: Rc<Cell<Option<Flood>>>,
}

impl FrameMeter {
    /// `max_header_list_size`: the codec's; with the default frame size it sets how many
    /// CONTINUATION frames a header block may take.
    pub(super) fn new(max_header_list_size: usize, flood: Rc<Cell<Option<Flood>>>) -> Self {
        Self {
            scan: Scan::new(max_continuation_frames(max_header_list_size)),
            written: Framing::new(0),
            flood,
        }
    }

    /// Follows `bytes`, the next bytes read. An error ends the connection (a PING or SETTINGS
    /// flood); a CONTINUATION flood is only noted, as the codec ends it itself.
    pub(super) fn read(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.scan.bytes(bytes) {
            None => Ok(()),
            Some(Flood::Control) => {
                self.flood.set(Some(Flood::Control));
                Err(io::Error::other("HTTP/2 PING or SETTINGS flood"))
            }
            Some(flood) => {
                self.flood.set(Some(flood));
                Ok(())
            }
        }
    }

    /// Follows `bytes`, the next bytes written to the client. A client receiving responses
    /// may ping as it likes (gRPC clients ping once per round trip while data flows, to
    /// size their windows): response data or headers start the count of control frames
    /// again.
    pub(super) fn wrote(&mut self, bytes: &[u8]) {
        let scan = &mut self.scan;
        self.written.follow(bytes, |kind, _| {
            if kind == DATA || kind == HEADERS {
                scan.control_frames = 0;
            }
            false
        });
    }
}

/// The codec's own limit (h2's `calc_max_continuation_frames`, with its default 16 KiB frame
/// size, which the codecs keep): enough frames for the largest header list, plus a quarter,
/// and at least 5.
fn max_continuation_frames(max_header_list_size: usize) -> usize {
    let frames = (max_header_list_size / 16_384).max(1);
    (frames + (frames >> 2)).max(5)
}

/// Frame boundaries in a byte stream: headers gathered, payloads passed over.
struct Framing {
    /// Bytes to pass before the next frame header: the rest of a payload (or the preface).
    pass: usize,
    header: [u8; FRAME_HEADER_LEN],
    header_len: usize,
}

impl Framing {
    fn new(pass: usize) -> Self {
        Self {
            pass,
            header: [0; FRAME_HEADER_LEN],
            header_len: 0,
        }
    }

    /// Calls `frame` with the type and flags of each frame header `bytes` completes, until
    /// it returns true.
    fn follow(&mut self, mut bytes: &[u8], mut frame: impl FnMut(u8, u8) -> bool) {
        while !bytes.is_empty() {
            if self.pass > 0 {
                let n = self.pass.min(bytes.len());
                self.pass -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER_LEN - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            bytes = &bytes[n..];
            if self.header_len == FRAME_HEADER_LEN {
                self.header_len = 0;
                let [l0, l1, l2, kind, flags, ..] = self.header;
                self.pass = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
                if frame(kind, flags) {
                    return;
                }
            }
        }
    }
}

/// Where the meter is in the input, and what it counts.
struct Scan {
    framing: Framing,
    /// CONTINUATION frames in the header block being received.
    continuations: usize,
    max_continuations: usize,
    window_start: Option<Instant>,
    /// PING and SETTINGS frames in this window since the proxy last sent response data or
    /// headers.
    control_frames: u32,
}

impl Scan {
    fn new(max_continuations: usize) -> Self {
        Self {
            framing: Framing::new(PREFACE_LEN),
            continuations: 0,
            max_continuations,
            window_start: None,
            control_frames: 0,
        }
    }

    /// Follows `bytes`, the next bytes of the input.
    fn bytes(&mut self, bytes: &[u8]) -> Option<Flood> {
        let mut seen = None;
        let mut framing = std::mem::replace(&mut self.framing, Framing::new(0));
        framing.follow(bytes, |kind, flags| match self.frame(kind, flags) {
            Some(Flood::Control) => {
                seen = Some(Flood::Control);
                true
            }
            Some(flood) => {
                seen = Some(flood);
                false
            }
            None => false,
        });
        self.framing = framing;
        seen
    }

    fn frame(&mut self, kind: u8, flags: u8) -> Option<Flood> {
        match kind {
            HEADERS => self.continuations = 0,
            CONTINUATION if flags & END_HEADERS == 0 => {
                self.continuations += 1;
                if self.continuations > self.max_continuations {
                    return Some(Flood::Continuation);
                }
            }
            CONTINUATION => self.continuations = 0,
            PING | SETTINGS if flags & ACK == 0 => {
                let now = Instant::now();
                match self.window_start {
                    Some(start) if now.duration_since(start) < CONTROL_WINDOW => {}
                    _ => {
                        self.window_start = Some(now);
                        self.control_frames = 0;
                    }
                }
                self.control_frames += 1;
                if self.control_frames > CONTROL_FRAMES_PER_WINDOW {
                    return Some(Flood::Control);
                }
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, len: usize) -> Vec<u8> {
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        out.extend_from_slice(&1u32.to_be_bytes());
        out.resize(FRAME_HEADER_LEN + len, 0xaa);
        out
    }

    fn preface() -> Vec<u8> {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
    }

    #[tokio::test(start_paused = true)]
    async fn pings_over_the_budget_are_a_flood_and_the_budget_comes_back() {
        let mut scan = Scan::new(5);
        let mut input = preface();
        input.extend(frame(SETTINGS, 0, 6));
        for _ in 1..CONTROL_FRAMES_PER_WINDOW {
            input.extend(frame(PING, 0, 8));
            input.extend(frame(PING, ACK, 8)); // acknowledgements are free
        }
        assert_eq!(scan.bytes(&input), None);
        // A window later the count starts again.
        tokio::time::advance(CONTROL_WINDOW).await;
        let burst: Vec<u8> = (0..CONTROL_FRAMES_PER_WINDOW)
            .flat_map(|_| frame(PING, 0, 8))
            .collect();
        assert_eq!(scan.bytes(&burst), None);
        assert_eq!(scan.bytes(&frame(SETTINGS, 0, 0)), Some(Flood::Control));
    }

    #[tokio::test(start_paused = true)]
    async fn frames_split_anywhere_are_followed() {
        let mut scan = Scan::new(5);
        let mut input = preface();
        for _ in 0..=CONTROL_FRAMES_PER_WINDOW {
            // Large payloads that look like frame headers must be skipped, not read.
            input.extend(frame(0x0, 0, 300));
            input.extend(frame(PING, 0, 8));
        }
        let mut found = None;
        for byte in input.chunks(1) {
            if let Some(flood) = scan.bytes(byte) {
                found = Some(flood);
            }
        }
        assert_eq!(found, Some(Flood::Control));
        // Every data frame payload was passed over: one PING over the budget, exactly.
        assert_eq!(scan.control_frames, CONTROL_FRAMES_PER_WINDOW + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_header_block_of_too_many_continuations_is_named() {
        assert_eq!(max_continuation_frames(60 * 1024), 5);
        assert_eq!(max_continuation_frames(1024 * 1024), 80);
        let mut scan = Scan::new(max_continuation_frames(60 * 1024));
        let mut input = preface();
        input.extend(frame(HEADERS, 0, 10));
        for _ in 0..5 {
            input.extend(frame(CONTINUATION, 0, 1));
        }
        input.extend(frame(CONTINUATION, END_HEADERS, 1));
        assert_eq!(scan.bytes(&input), None, "five, then the end: allowed");
        let mut flood = frame(HEADERS, 0, 10);
        for _ in 0..6 {
            flood.extend(frame(CONTINUATION, 0, 0));
        }
        assert_eq!(scan.bytes(&flood), Some(Flood::Continuation));
        // Noted, and the frames after it still followed.
        assert_eq!(scan.bytes(&frame(HEADERS, END_HEADERS, 3)), None);
        assert_eq!(scan.continuations, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn response_frames_written_start_the_count_again() {
        let flood = Rc::new(Cell::new(None));
        let mut meter = FrameMeter::new(60 * 1024, Rc::clone(&flood));
        let mut input = preface();
        input.extend(frame(SETTINGS, 0, 0));
        assert!(meter.read(&input).is_ok());
        let ping = frame(PING, 0, 8);
        // A client pinging after every response frame it receives, far more than the budget.
        let response = [frame(HEADERS, END_HEADERS, 5), frame(DATA, 0, 100)].concat();
        for _ in 0..3 * CONTROL_FRAMES_PER_WINDOW {
            assert!(meter.read(&ping).is_ok());
            // Written in pieces, as a socket may take them.
            for piece in response.chunks(7) {
                meter.wrote(piece);
            }
        }
        // With nothing sent back, the same pings are a flood.
        let burst: Vec<u8> = (0..=CONTROL_FRAMES_PER_WINDOW)
            .flat_map(|_| frame(PING, 0, 8))
            .collect();
        assert!(meter.read(&burst).is_err());
        assert_eq!(flood.get(), Some(Flood::Control));
    }
}
