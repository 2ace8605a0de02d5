//! Token buckets for the local rate limit: lock-free, shared by workers when the limit is for
//! the whole process, and keyed by client IP or header value when asked (the map of keys is
//! behind 16 mutexes, each held for one lookup).
//!
//! A bucket starts full; every `fill_interval` (counted from its creation) it gets
//! `tokens_per_fill` back, up to `max_tokens`. Fills happen at whole intervals, not
//! continuously, so "N per interval" holds exactly: a burst inside one interval gets the
//! tokens there are, and the rest are refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use config::TokenBucketConfig;

/// One bucket. The state is `(fill index << 32) | tokens` in one atomic, so taking a token
/// and accounting the fills since the last take are one compare-and-swap.
pub(crate) struct TokenBucket {
    config: TokenBucketConfig,
    epoch: Instant,
    state: AtomicU64,
}

/// What taking a token found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) allowed: bool,
    /// Tokens left after this request.
    pub(crate) remaining: u32,
    /// Until the next fill.
    pub(crate) reset: Duration,
}

impl TokenBucket {
    pub(crate) fn new(config: TokenBucketConfig, now: Instant) -> Self {
        Self {
            config,
            epoch: now,
            state: AtomicU64::new(u64::from(config.max_tokens)),
        }
    }

    /// Whole fill intervals since the bucket was made, and the time left in the current one.
    fn fill_index(&self, now: Instant) -> (u32, Duration) {
        let elapsed = now.saturating_duration_since(self.epoch).as_nanos();
        let interval = self.config.fill_interval.as_nanos().max(1);
        // Truncated to 32 bits: indexes are compared by wrapping difference.
        let index = (elapsed / interval) as u32;
        let reset = Duration::from_nanos((interval - elapsed % interval) as u64);
        (index, reset)
    }

    /// The tokens a state holds at fill index `now`, with the index to store.
    fn refill(&self, state: u64, now: u32) -> (u32, u32) {
        let (index, tokens) = ((state >> 32) as u32, state as u32);
        // A worker's clock read just before another's may be an index behind: no fill then,
        // and never a wrap-around into a full bucket.
        let fills = now.wrapping_sub(index) as i32;
        if fills <= 0 {
            return (index, tokens);
        }
        let refilled = u64::from(tokens) + fills as u64 * u64::from(self.config.tokens_per_fill);
        (now, refilled.min(u64::from(self.config.max_tokens)) as u32)
    }

    pub(crate) fn try_take(&self, now: Instant) -> Taken {
        let (now_index, reset) = self.fill_index(now);
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            let (index, tokens) = self.refill(state, now_index);
            let (left, allowed) = match tokens.checked_sub(1) {
                Some(left) => (left, true),
                None => (0, false),
            };
            let next = (u64::from(index) << 32) | u64::from(left);
            if next == state {
                return Taken {
                    allowed,
                    remaining: left,
                    reset,
                };
            }
            // AcqRel: takes on different workers are ordered by this word alone.
            match self
                .state
                .compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Taken {
                        allowed,
                        remaining: left,
                        reset,
                    };
                }
                Err(actual) => state = actual,
            }
        }
    }

    /// Whether the bucket is back to full: it holds nothing worth remembering.
    fn is_full(&self, now: Instant) -> bool {
        let (now_index, _) = self.fill_index(now);
        let (_, tokens) = self.refill(self.state.load(Ordering::Relaxed), now_index);
        tokens >= self.config.max_tokens
    }
}

const SHARDS: usize = 16;

/// Keys (the bytes of an IP or a header value) and their buckets.
type Shard = HashMap<Box<[u8]>, Arc<TokenBucket>>;

/// A bucket per key (a client IP, a header value), created on first sight. At most
/// `max_keys` are kept: past that, buckets that have refilled are forgotten first (they hold
/// nothing), then any. A client spraying keys can thus reset other keys' buckets, but never
/// grow memory without bound.
pub(crate) struct KeyedBuckets {
    config: TokenBucketConfig,
    max_per_shard: usize,
    shards: [Mutex<Shard>; SHARDS],
}

impl KeyedBuckets {
    pub(crate) fn new(config: TokenBucketConfig, max_keys: usize) -> Self {
        Self {
            config,
            max_per_shard: max_keys.div_ceil(SHARDS).max(1),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    pub(crate) fn try_take(&self, key: &[u8], now: Instant) -> Taken {
        let shard = &self.shards[shard_of(key)];
        let bucket = {
            let mut map = shard.lock().unwrap_or_else(PoisonError::into_inner);
            match map.get(key) {
                Some(bucket) => Arc::clone(bucket),
                None => {
                    if map.len() >= self.max_per_shard {
                        // Idle keys first: a full bucket limits nobody.
                        map.retain(|_, bucket| !bucket.is_full(now));
                        if map.len() >= self.max_per_shard {
                            // None idle: room for a batch of new keys at once, so a stream of
                            // new keys does not scan the shard for each one.
                            let mut evict =
                                map.len() + 1 - self.max_per_shard + self.max_per_shard / 8;
                            map.retain(|_, _| {
                                if evict == 0 {
                                    return true;
                                }
                                evict -= 1;
                                false
                            });
                        }
                    }
                    let bucket = Arc::new(TokenBucket::new(self.config, now));
                    map.insert(key.into(), Arc::clone(&bucket));
                    bucket
                }
            }
        };
        // Taken outside the lock: the lock guards the map, the bucket is lock-free.
        bucket.try_take(now)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

/// FNV-1a over the key: spreads keys over the shards, nothing more.
fn shard_of(key: &[u8]) -> usize {
    let mut hash: u32 = 0x811c_9dc5;
    for b in key {
        hash = (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    hash as usize % SHARDS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max: u32, per_fill: u32, ms: u64) -> TokenBucketConfig {
        TokenBucketConfig {
            max_tokens: max,
            tokens_per_fill: per_fill,
            fill_interval: Duration::from_millis(ms),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_gives_its_tokens_then_refills_at_each_interval() {
        let bucket = TokenBucket::new(config(3, 2, 1000), Instant::now());
        let take = || bucket.try_take(Instant::now());
        assert_eq!(take().remaining, 2);
        assert!(take().allowed);
        assert!(take().allowed);
        let refused = take();
        assert!(!refused.allowed);
        assert_eq!(refused.reset, Duration::from_secs(1));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(!take().allowed, "no fill before the interval ends");
        assert_eq!(take().reset, Duration::from_millis(1));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(take().allowed);
        assert!(take().allowed);
        assert!(!take().allowed, "two tokens per fill");
        tokio::time::advance(Duration::from_secs(60)).await;
        let full = (0..10).filter(|_| take().allowed).count();
        assert_eq!(full, 3, "never more than max_tokens");
    }

    #[tokio::test(start_paused = true)]
    async fn a_clock_read_late_neither_refills_nor_loses_a_fill() {
        let start = Instant::now();
        let bucket = TokenBucket::new(config(1, 1, 100), start);
        tokio::time::advance(Duration::from_millis(250)).await;
        let now = Instant::now();
        assert!(bucket.try_take(now).allowed);
        // Another worker read the clock a fill earlier and takes after: no refill for it.
        assert!(!bucket.try_take(now - Duration::from_millis(150)).allowed);
        assert!(!bucket.try_take(now).allowed);
        assert!(bucket.try_take(now + Duration::from_millis(60)).allowed);
    }

    #[test]
    fn concurrent_takes_get_exactly_the_tokens() {
        let bucket = Arc::new(TokenBucket::new(
            config(1000, 1000, 3_600_000),
            Instant::now(),
        ));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let bucket = Arc::clone(&bucket);
                std::thread::spawn(move || {
                    (0..1000)
                        .filter(|_| bucket.try_take(Instant::now()).allowed)
                        .count()
                })
            })
            .collect();
        let allowed: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(allowed, 1000);
    }

    #[tokio::test(start_paused = true)]
    async fn keys_have_their_own_buckets_and_idle_ones_are_forgotten_first() {
        // Two keys per shard; three keys that land in the same shard.
        let keyed = KeyedBuckets::new(config(1, 1, 1000), 2 * SHARDS);
        let shard = shard_of(b"a");
        let same: Vec<[u8; 4]> = (0..u32::MAX)
            .map(u32::to_be_bytes)
            .filter(|k| shard_of(k) == shard)
            .take(2)
            .collect();
        let (b, c) = (&same[0][..], &same[1][..]);
        let start = Instant::now();
        assert!(keyed.try_take(b"a", start).allowed);
        assert!(!keyed.try_take(b"a", start).allowed);
        // `a` refills (idle); `b` is drained after it.
        let later = start + Duration::from_millis(1500);
        assert!(keyed.try_take(b, later).allowed);
        // The shard is full: `c` takes the place of the idle `a`, not of the drained `b`.
        assert!(keyed.try_take(c, later).allowed);
        assert!(!keyed.try_take(b, later).allowed, "b was forgotten");
        assert_eq!(keyed.len(), 2);
        // Many new keys that stay drained: the map stays bounded.
        for i in 0..1000u32 {
            keyed.try_take(&i.to_be_bytes(), later);
        }
        assert!(keyed.len() <= 2 * SHARDS, "bounded: {}", keyed.len());
    }
}
