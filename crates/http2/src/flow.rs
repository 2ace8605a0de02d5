//! Flow-control windows (RFC 9113 section 6.9): what a side may still send, and when a
//! receiver gives credit back.

use crate::frame::{MAX_WINDOW, Reason};

/// HTTP/2's initial window, for the connection and for each stream.
pub const DEFAULT_WINDOW: u32 = 65_535;

/// Why a window change breaks the rules (a `FLOW_CONTROL_ERROR`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FlowError {
    #[error("a WINDOW_UPDATE or SETTINGS change that takes a window over 2^31-1")]
    Overflow,
    #[error("more DATA than the window allowed")]
    Exceeded,
}

impl FlowError {
    pub fn reason(self) -> Reason {
        Reason::FLOW_CONTROL_ERROR
    }
}

/// A window. It can go below zero: a smaller `SETTINGS_INITIAL_WINDOW_SIZE` shrinks the
/// windows of open streams by the difference (RFC 9113 section 6.9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window(i64);

impl Window {
    pub fn new(size: u32) -> Self {
        Window(i64::from(size))
    }

    /// What may be sent now.
    pub fn available(self) -> u32 {
        self.0.clamp(0, i64::from(MAX_WINDOW)) as u32
    }

    /// `n` bytes sent or received. Receiving more than the window allowed is the peer's
    /// error.
    pub fn consume(&mut self, n: u32) -> Result<(), FlowError> {
        if i64::from(n) > self.0 {
            return Err(FlowError::Exceeded);
        }
        self.0 -= i64::from(n);
        Ok(())
    }

    /// A WINDOW_UPDATE's increment.
    pub fn grow(&mut self, increment: u32) -> Result<(), FlowError> {
        self.adjust(i64::from(increment))
    }

    /// A change of `SETTINGS_INITIAL_WINDOW_SIZE` from `old` to `new`, on a stream's window.
    pub fn resize(&mut self, old: u32, new: u32) -> Result<(), FlowError> {
        self.adjust(i64::from(new) - i64::from(old))
    }

    fn adjust(&mut self, delta: i64) -> Result<(), FlowError> {
        let next = self.0 + delta;
        if next > i64::from(MAX_WINDOW) {
            return Err(FlowError::Overflow);
        }
        self.0 = next;
        Ok(())
    }
}

/// A receiver's side of one window: the peer's credit, and the data taken by the
/// application since the last WINDOW_UPDATE. Credit goes back once half the target is
/// used, in one update, so that a stream of small DATA frames costs few updates.
#[derive(Debug, Clone, Copy)]
pub struct Credit {
    /// What the peer may still send.
    window: Window,
    /// The window this side keeps open.
    target: u32,
    /// Bytes the application has taken and not yet given back.
    released: u32,
}

impl Credit {
    /// Credit for a window the peer sees at `target` already: a stream's under this
    /// side's acknowledged settings. The connection's window starts at 65,535 whatever is
    /// announced: one larger is opened with a first WINDOW_UPDATE of the difference.
    pub fn new(target: u32) -> Self {
        Credit {
            window: Window::new(target),
            target,
            released: 0,
        }
    }

    /// DATA arrived (its whole payload, padding included).
    pub fn received(&mut self, n: u32) -> Result<(), FlowError> {
        self.window.consume(n)
    }

    /// The application took `n` bytes: the increment to send now, if any (never 0, which
    /// the peer would take for a `PROTOCOL_ERROR`).
    pub fn release(&mut self, n: u32) -> Option<u32> {
        self.released = self.released.saturating_add(n);
        if self.released == 0 || self.released < self.target / 2 {
            return None;
        }
        // Within bounds: the window plus what was released is at most the target.
        self.window.grow(self.released).ok()?;
        Some(std::mem::take(&mut self.released))
    }

    /// This side's `SETTINGS_INITIAL_WINDOW_SIZE` changed from `old` to `new` (a stream's
    /// window, once the peer acknowledged it).
    pub fn resize(&mut self, old: u32, new: u32) -> Result<(), FlowError> {
        self.target = new;
        self.window.resize(old, new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_spent_grown_and_shrunk_below_zero() {
        let mut window = Window::new(DEFAULT_WINDOW);
        assert_eq!(window.consume(65_000), Ok(()));
        assert_eq!(window.available(), 535);
        assert_eq!(window.consume(536), Err(FlowError::Exceeded));
        // The peer lowers the initial window from 65,535 to 0: the window is 535 - 65,535,
        // and a WINDOW_UPDATE of 1,000 leaves it below zero still.
        assert_eq!(window.resize(DEFAULT_WINDOW, 0), Ok(()));
        assert_eq!(window.available(), 0);
        assert_eq!(window.grow(1_000), Ok(()));
        assert_eq!(window.available(), 0);
        assert_eq!(window.grow(64_465), Ok(()));
        assert_eq!(window.available(), 465);
        assert_eq!(window.grow(MAX_WINDOW), Err(FlowError::Overflow));
        assert_eq!(FlowError::Overflow.reason(), Reason::FLOW_CONTROL_ERROR);
    }

    #[test]
    fn credit_goes_back_in_one_update_once_half_is_used() {
        let mut credit = Credit::new(DEFAULT_WINDOW);
        for _ in 0..3 {
            assert_eq!(credit.received(10_000), Ok(()));
            assert_eq!(credit.release(10_000), None);
        }
        assert_eq!(credit.received(10_000), Ok(()));
        assert_eq!(credit.release(10_000), Some(40_000));
        // The window is whole again less what is held: 25,535 + 40,000.
        assert_eq!(credit.received(65_535), Ok(()));
        assert_eq!(credit.received(1), Err(FlowError::Exceeded));
        // Nothing taken, nothing to give back, even for a tiny window.
        assert_eq!(Credit::new(1).release(0), None);
        // A larger initial window for the streams.
        assert_eq!(credit.resize(DEFAULT_WINDOW, 1 << 20), Ok(()));
        assert_eq!(credit.received((1 << 20) - DEFAULT_WINDOW), Ok(()));
    }
}
