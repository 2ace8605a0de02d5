//! The floods a client can send with frames that are each valid, and the limits that end
//! the connection (GOAWAY `ENHANCE_YOUR_CALM`) when one is passed.

use std::time::{Duration, Instant};

/// Which limit a client passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flood {
    /// Streams reset by the client before they were served (rapid reset, CVE-2023-44487).
    Reset,
    /// Streams this side reset for the client's protocol errors.
    StreamErrors,
    /// A header block in more CONTINUATION frames than its size needs.
    Continuation,
    /// PING and SETTINGS frames, each of which costs an answer.
    Control,
}

/// The limits. The defaults are h2's for resets and Envoy's for premature resets.
#[derive(Debug, Clone)]
pub struct FloodLimits {
    /// Streams the client may reset before the application took their requests, with no
    /// request taken between (h2's `max_pending_accept_reset_streams`).
    pub resets_before_taken: u32,
    /// Streams this side may reset for the client's errors over the connection's life (h2's
    /// `max_local_error_reset_streams`).
    pub local_error_resets: u32,
    /// Once a connection has opened this many streams, it ends when at least half of them
    /// were reset by the client within [`FloodLimits::premature_reset_age`] of opening and
    /// before their response ended (Envoy's premature-reset rule).
    pub premature_reset_streams: u32,
    pub premature_reset_age: Duration,
    /// PING and SETTINGS frames (not acknowledgements) a client may send in one
    /// [`FloodLimits::control_window`] with no response HEADERS or DATA sent between them.
    /// gRPC clients ping once per round trip while they receive data: response frames start
    /// the count again.
    pub control_frames: u32,
    pub control_window: Duration,
}

impl Default for FloodLimits {
    fn default() -> Self {
        FloodLimits {
            resets_before_taken: 20,
            local_error_resets: 1024,
            premature_reset_streams: 500,
            premature_reset_age: Duration::from_secs(1),
            control_frames: 1000,
            control_window: Duration::from_secs(10),
        }
    }
}

/// What a connection counts.
#[derive(Debug, Default)]
pub(super) struct Counters {
    resets_before_taken: u32,
    local_error_resets: u32,
    streams: u32,
    premature_resets: u32,
    control_window_start: Option<Instant>,
    control_frames: u32,
}

impl Counters {
    pub(super) fn request_taken(&mut self) {
        self.resets_before_taken = 0;
    }

    pub(super) fn stream_opened(&mut self) {
        self.streams = self.streams.saturating_add(1);
    }

    /// The client reset a stream. `taken`: the application had its request; `premature`:
    /// young and its response unfinished.
    pub(super) fn peer_reset(
        &mut self,
        taken: bool,
        premature: bool,
        limits: &FloodLimits,
    ) -> Result<(), Flood> {
        if !taken {
            self.resets_before_taken += 1;
            if self.resets_before_taken > limits.resets_before_taken {
                return Err(Flood::Reset);
            }
        }
        if premature {
            self.premature_resets += 1;
        }
        if self.streams >= limits.premature_reset_streams
            && u64::from(self.premature_resets) * 2 >= u64::from(self.streams)
        {
            return Err(Flood::Reset);
        }
        Ok(())
    }

    /// This side reset a stream for the client's error.
    pub(super) fn local_error_reset(&mut self, limits: &FloodLimits) -> Result<(), Flood> {
        self.local_error_resets += 1;
        if self.local_error_resets > limits.local_error_resets {
            return Err(Flood::StreamErrors);
        }
        Ok(())
    }

    /// A PING or SETTINGS frame (not an acknowledgement) arrived.
    pub(super) fn control_frame(
        &mut self,
        now: Instant,
        limits: &FloodLimits,
    ) -> Result<(), Flood> {
        let start = *self.control_window_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= limits.control_window {
            self.control_window_start = Some(now);
            self.control_frames = 0;
        }
        self.control_frames += 1;
        if self.control_frames > limits.control_frames {
            return Err(Flood::Control);
        }
        Ok(())
    }

    /// Response HEADERS or DATA went out.
    pub(super) fn response_frame_sent(&mut self) {
        self.control_frames = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resets_before_the_application_took_the_requests() {
        let limits = FloodLimits::default();
        let mut counters = Counters::default();
        for _ in 0..20 {
            counters.stream_opened();
            assert_eq!(counters.peer_reset(false, true, &limits), Ok(()));
        }
        // A request taken starts the count again.
        counters.request_taken();
        for _ in 0..20 {
            assert_eq!(counters.peer_reset(false, true, &limits), Ok(()));
        }
        assert_eq!(counters.peer_reset(false, true, &limits), Err(Flood::Reset));
    }

    #[test]
    fn premature_resets_of_half_the_streams_once_there_are_enough() {
        let limits = FloodLimits::default();
        let mut counters = Counters::default();
        // Served streams, each reset at once after it was taken: a browser cancelling
        // everything it opens.
        for i in 1..=500 {
            counters.stream_opened();
            let premature = i % 2 == 0;
            let result = counters.peer_reset(true, premature, &limits);
            if i < 500 {
                assert_eq!(result, Ok(()), "stream {i}");
            } else {
                assert_eq!(result, Err(Flood::Reset));
            }
        }
        // Resets that were not premature never add up.
        let mut patient = Counters::default();
        for _ in 0..2000 {
            patient.stream_opened();
            assert_eq!(patient.peer_reset(true, false, &limits), Ok(()));
        }
    }

    #[test]
    fn control_frames_count_per_window_and_responses_start_again() {
        let limits = FloodLimits {
            control_frames: 3,
            ..FloodLimits::default()
        };
        let start = Instant::now();
        let mut counters = Counters::default();
        for _ in 0..3 {
            assert_eq!(counters.control_frame(start, &limits), Ok(()));
        }
        counters.response_frame_sent();
        for _ in 0..3 {
            assert_eq!(counters.control_frame(start, &limits), Ok(()));
        }
        assert_eq!(counters.control_frame(start, &limits), Err(Flood::Control));
        // A new window.
        let later = start + limits.control_window;
        assert_eq!(counters.control_frame(later, &limits), Ok(()));
        let mut errors = Counters::default();
        let few = FloodLimits {
            local_error_resets: 1,
            ..FloodLimits::default()
        };
        assert_eq!(errors.local_error_reset(&few), Ok(()));
        assert_eq!(errors.local_error_reset(&few), Err(Flood::StreamErrors));
    }
}
