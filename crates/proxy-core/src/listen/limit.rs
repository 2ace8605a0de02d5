//! Connection limits: per listener (over all workers) and for the whole process. A connection
//! past a limit is closed as soon as it is accepted and counted as an overflow, so clients go
//! elsewhere instead of piling up on one proxy (lesson L5).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One limit and the connections it currently counts.
#[derive(Debug)]
pub(crate) struct Limit {
    active: AtomicUsize,
    max: usize,
}

impl Limit {
    pub(crate) fn new(max: usize) -> Arc<Limit> {
        Arc::new(Limit {
            active: AtomicUsize::new(0),
            max,
        })
    }

    fn try_take(self: &Arc<Self>) -> Option<Taken> {
        // Relaxed: the count only has to be exact, not ordered with other memory.
        let before = self.active.fetch_add(1, Ordering::Relaxed);
        if before >= self.max {
            self.active.fetch_sub(1, Ordering::Relaxed);
            None
        } else {
            Some(Taken(Arc::clone(self)))
        }
    }
}

/// One place in one limit, given back on drop (also when a later limit refuses).
#[derive(Debug)]
struct Taken(Arc<Limit>);

impl Drop for Taken {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The limits one listener's connections are admitted under.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionLimits {
    pub(crate) process: Option<Arc<Limit>>,
    pub(crate) listener: Option<Arc<Limit>>,
}

/// Held by an admitted connection; frees its place in every limit when dropped.
#[must_use]
#[derive(Debug)]
pub(crate) struct ConnPermit {
    _taken: [Option<Taken>; 2],
}

impl ConnectionLimits {
    /// A permit, or `None` when the process or the listener is full.
    pub(crate) fn try_admit(&self) -> Option<ConnPermit> {
        let process = match &self.process {
            Some(limit) => Some(limit.try_take()?),
            None => None,
        };
        let listener = match &self.listener {
            // Returning here drops `process`, which gives its place back.
            Some(limit) => Some(limit.try_take()?),
            None => None,
        };
        Some(ConnPermit {
            _taken: [process, listener],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_up_to_the_limit_and_frees_on_drop() {
        let limits = ConnectionLimits {
            process: Some(Limit::new(3)),
            listener: Some(Limit::new(2)),
        };
        let a = limits.try_admit().unwrap();
        let _b = limits.try_admit().unwrap();
        assert!(limits.try_admit().is_none(), "listener full");
        // The refused attempt gave its process place back.
        assert_eq!(
            limits
                .process
                .as_ref()
                .unwrap()
                .active
                .load(Ordering::Relaxed),
            2
        );
        drop(a);
        assert!(limits.try_admit().is_some());
    }

    #[test]
    fn no_limits_admit_everything() {
        let limits = ConnectionLimits::default();
        let permits: Vec<_> = (0..1000).map(|_| limits.try_admit().unwrap()).collect();
        assert_eq!(permits.len(), 1000);
    }
}
