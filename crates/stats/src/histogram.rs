//! Latency histograms in microseconds: HDR-style log-linear buckets, 128 per power of two.
//!
//! **Buckets.** Values `0..256` us each have a bucket of their own. Above that, every power of
//! two `[2^e, 2^(e+1))` is cut into 128 equal buckets, so a bucket is never wider than 1/128
//! of the values it holds. The top bucket ends at [`MAX_TRACKED_US`] (`2^36 - 1` us, about
//! 19 hours); larger values are counted in it (their `sum`, `min` and `max` stay exact). That
//! is 3840 buckets, 30 KiB per histogram per shard, allocated by its first record.
//!
//! **Quantiles** use the nearest-rank definition (the `ceil(q * count)`-th smallest value) and
//! report the *midpoint* of the bucket holding it, clamped to the exact `[min, max]`. The
//! estimate is off by at most half a bucket: `|estimate - exact| <= exact / 256`
//! ([`RELATIVE_ERROR`]), and exact below 256 us. `count`, `sum`, `mean`, `min` and `max` are
//! exact.
//!
//! **Recording** touches one bucket and the `sum`/`min`/`max` words, all single-writer cells
//! (see the crate docs); `count` is not stored but summed from the buckets when read, which
//! also keeps it consistent with the quantiles of the same snapshot.

#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::cell::NotSync;

/// Sub-buckets per power of two, as a power of two: 2^7 = 128.
const SUB_BITS: u32 = 7;
/// Values are tracked below 2^36 us.
const TOP_BITS: u32 = 36;
/// The number of buckets: 256 one-wide ones, then 128 per power of two from 2^8 to 2^35.
pub(crate) const BUCKETS: usize = ((TOP_BITS - SUB_BITS) as usize + 1) << SUB_BITS;

/// The largest value with a bucket of its own, in microseconds (about 19 hours). Larger values
/// are counted in the top bucket; `sum`, `min` and `max` still see them exactly.
pub const MAX_TRACKED_US: u64 = (1 << TOP_BITS) - 1;

/// Bound on a quantile estimate's relative error, `|estimate - exact| / exact`, for exact
/// values up to [`MAX_TRACKED_US`]: half the widest bucket's relative width, 1/256.
pub const RELATIVE_ERROR: f64 = 1.0 / 256.0;

/// The quantiles every renderer reports, with their Prometheus label values.
/// (quantile, the Prometheus `quantile` label, the text format's name).
pub(crate) const REPORTED_QUANTILES: [(f64, &str, &str); 4] = [
    (0.5, "quantile=\"0.5\"", "P50"),
    (0.9, "quantile=\"0.9\"", "P90"),
    (0.99, "quantile=\"0.99\"", "P99"),
    (0.999, "quantile=\"0.999\"", "P99.9"),
];

/// The bucket that counts `v` microseconds.
#[inline]
pub(crate) fn bucket_index(v: u64) -> usize {
    let v = v.min(MAX_TRACKED_US);
    // `| 0xff` puts everything below 256 in the first, one-wide group (exponent 7, shift 0).
    let exponent = 63 - (v | 0xff).leading_zeros();
    let shift = exponent - SUB_BITS;
    ((shift as usize) << SUB_BITS) + (v >> shift) as usize
}

/// The smallest and largest value bucket `index` counts (inclusive).
pub(crate) fn bucket_bounds(index: usize) -> (u64, u64) {
    let sub = 1usize << SUB_BITS;
    if index < 2 * sub {
        return (index as u64, index as u64);
    }
    let shift = (index >> SUB_BITS) - 1;
    let mantissa = (index & (sub - 1)) + sub;
    let low = (mantissa as u64) << shift;
    (low, low + (1u64 << shift) - 1)
}

/// The value a quantile falling in bucket `index` reports.
fn bucket_midpoint(index: usize) -> u64 {
    let (low, high) = bucket_bounds(index);
    low + (high - low) / 2
}

/// One shard's storage for one histogram series. Single-writer: see the crate docs.
#[repr(align(128))]
pub(crate) struct HistogramCell {
    sum: AtomicU64,
    /// `u64::MAX` until the first record.
    min: AtomicU64,
    max: AtomicU64,
    /// Allocated by the first record: a series nobody records into (a cluster that takes
    /// no traffic, on a worker that never serves it) costs a pointer, not 30 KiB. A fleet's
    /// thousand clusters times the workers would otherwise hold hundreds of MiB of zeros.
    buckets: OnceLock<Box<[AtomicU64; BUCKETS]>>,
}

fn zeroed_buckets() -> Box<[AtomicU64; BUCKETS]> {
    Box::new([const { AtomicU64::new(0) }; BUCKETS])
}

impl HistogramCell {
    pub(crate) fn new() -> Self {
        Self {
            sum: AtomicU64::new(0),
            min: AtomicU64::new(u64::MAX),
            max: AtomicU64::new(0),
            buckets: OnceLock::new(),
        }
    }

    /// Single-writer record: only the cell's one writer may call this.
    #[inline]
    fn record(&self, v: u64) {
        let bucket = &self.buckets.get_or_init(zeroed_buckets)[bucket_index(v)];
        bucket.store(bucket.load(Relaxed).wrapping_add(1), Relaxed);
        self.sum
            .store(self.sum.load(Relaxed).saturating_add(v), Relaxed);
        // Release: a reader that sees the new min or max also sees the bucket above, so the
        // bucket range it reads (from min to max) always covers what it counts.
        if v < self.min.load(Relaxed) {
            self.min.store(v, Release);
        }
        if v > self.max.load(Relaxed) {
            self.max.store(v, Release);
        }
    }

    /// Reads the cell, from any thread, using `scratch` to gather the non-empty buckets.
    /// Concurrent records may or may not be included, each field being a recent value;
    /// `count` always matches the buckets read.
    pub(crate) fn read(&self, scratch: &mut Scratch) -> HistogramSnapshot {
        let max = self.max.load(Acquire);
        let min = self.min.load(Acquire);
        // The buckets were allocated before the first min or max was stored (Release).
        let (true, Some(buckets)) = (min <= max, self.buckets.get()) else {
            return HistogramSnapshot::default();
        };
        // Only the buckets between min and max can be non-zero: a scrape of a latency
        // histogram reads a few hundred words, not all 3840.
        let first = bucket_index(min);
        let found = &mut scratch.buckets;
        found.clear();
        for (i, bucket) in buckets[first..=bucket_index(max)].iter().enumerate() {
            let count = bucket.load(Relaxed);
            if count != 0 {
                found.push(Bucket {
                    index: (first + i) as u32,
                    count,
                });
            }
        }
        HistogramSnapshot::from_buckets(found, self.sum.load(Relaxed), min, max)
    }
}

/// Buffers reused over a whole snapshot, so that reading and merging allocate only the
/// result.
#[derive(Default)]
pub(crate) struct Scratch {
    buckets: Vec<Bucket>,
    /// One counter per bucket, all zero between uses.
    dense: Vec<u64>,
}

/// A non-empty bucket of a [`HistogramSnapshot`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Bucket {
    index: u32,
    count: u64,
}

/// A latency distribution in microseconds, written by the one thread that holds this handle.
///
/// Obtained once from [`Shard::histogram`](crate::Shard::histogram); `Send` but neither `Sync`
/// nor `Clone` (see the crate docs), and the recorded values outlive the handle.
///
/// ```compile_fail
/// fn shared_across_threads<T: Sync>() {}
/// shared_across_threads::<stats::Histogram>();
/// ```
pub struct Histogram {
    cell: Arc<HistogramCell>,
    _not_sync: NotSync,
}

impl Histogram {
    pub(crate) fn new(cell: Arc<HistogramCell>) -> Self {
        Self {
            cell,
            _not_sync: NotSync::default(),
        }
    }

    /// Records a value in microseconds.
    #[inline]
    pub fn record(&self, us: u64) {
        self.cell.record(us);
    }

    /// Records a duration, truncated to whole microseconds.
    #[inline]
    pub fn record_duration(&self, elapsed: Duration) {
        self.record(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    /// This handle's own values (not the series' over all shards).
    pub fn snapshot(&self) -> HistogramSnapshot {
        self.cell.read(&mut Scratch::default())
    }
}

impl fmt::Debug for Histogram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.snapshot().count())
            .finish()
    }
}

/// A histogram's values at the time of a snapshot, in microseconds; merged over shards or for
/// one shard. Empty when nothing was recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// The non-empty buckets, by increasing index: a sparse copy is small and quick to walk.
    /// Shared, so that the merged value of a series in one shard costs no copy.
    buckets: Arc<[Bucket]>,
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl HistogramSnapshot {
    fn from_buckets(buckets: &[Bucket], sum: u64, min: u64, max: u64) -> Self {
        let count = buckets.iter().fold(0u64, |a, b| a.saturating_add(b.count));
        if count == 0 {
            return Self::default();
        }
        Self {
            buckets: buckets.into(),
            count,
            sum,
            min,
            max,
        }
    }

    /// How many values were recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Whether no value was recorded.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The sum of the values, in microseconds (saturating at `u64::MAX`).
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// The smallest value, exactly; `None` when empty.
    pub fn min(&self) -> Option<u64> {
        (self.count > 0).then_some(self.min)
    }

    /// The largest value, exactly; `None` when empty.
    pub fn max(&self) -> Option<u64> {
        (self.count > 0).then_some(self.max)
    }

    /// `sum / count`, exactly; `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum as f64 / self.count as f64)
    }

    /// The `q`-quantile (`0.99` for p99): an estimate of the nearest-rank value (the
    /// `ceil(q * count)`-th smallest), within [`RELATIVE_ERROR`] of it when it is at most
    /// [`MAX_TRACKED_US`]; `None` when empty. `q` is clamped to `[0, 1]` (NaN counts as 0) and
    /// read to six decimal places. The first and last ranks (`quantile(0.0)`,
    /// `quantile(1.0)`) are the exact minimum and maximum.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        let [estimate] = self.quantiles([q]);
        estimate
    }

    /// [`quantile`](Self::quantile) of each of `qs`, in one pass over the buckets.
    pub(crate) fn quantiles<const N: usize>(&self, qs: [f64; N]) -> [Option<u64>; N] {
        let mut out = [None; N];
        if self.count == 0 {
            return out;
        }
        let ranks = qs.map(|q| self.rank(q));
        let mut order: [usize; N] = std::array::from_fn(|i| i);
        order.sort_unstable_by_key(|&i| ranks[i]);
        let mut pending = order.iter().peekable();
        let mut seen = 0u64;
        for bucket in self.buckets.iter() {
            seen = seen.saturating_add(bucket.count);
            while let Some(&at) = pending.next_if(|&&at| ranks[at] <= seen) {
                out[at] = Some(self.estimate(ranks[at], bucket.index as usize));
            }
            if pending.peek().is_none() {
                break;
            }
        }
        // Buckets read while a record was half-done may sum to less than `count`.
        for &at in pending {
            out[at] = Some(self.max);
        }
        out
    }

    /// The nearest rank of quantile `q`, from 1 to `count`. Integer arithmetic in parts per
    /// million, so that 0.99 of 100 is exactly rank 99.
    fn rank(&self, q: f64) -> u64 {
        let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
        let ppm = (q * 1e6).round() as u128;
        let count = u128::from(self.count);
        (count * ppm).div_ceil(1_000_000).clamp(1, count) as u64
    }

    /// The value reported for `rank`, which falls in bucket `index`.
    fn estimate(&self, rank: u64, index: usize) -> u64 {
        // The smallest and largest values are known exactly.
        if rank == 1 {
            self.min
        } else if rank == self.count {
            self.max
        } else {
            bucket_midpoint(index).clamp(self.min, self.max)
        }
    }

    /// For each of `bounds` (microseconds, ascending), how many values were at most that: the
    /// cumulative counts of a Prometheus histogram's `_bucket{le}` series. A bucket of this
    /// histogram that straddles a bound counts below it when its midpoint does, as quantiles
    /// read it, so a count is off only by values within 1/256 of the bound; bounds at or past
    /// the largest value count everything, and bounds below the smallest nothing, exactly.
    pub fn cumulative_counts(&self, bounds: &[u64]) -> Vec<u64> {
        let mut out = Vec::with_capacity(bounds.len());
        let mut buckets = self.buckets.iter().peekable();
        let mut seen = 0u64;
        for &bound in bounds {
            if self.count == 0 || bound < self.min {
                out.push(0);
                continue;
            }
            if bound >= self.max {
                out.push(self.count);
                continue;
            }
            while let Some(b) = buckets.next_if(|b| bucket_midpoint(b.index as usize) <= bound) {
                seen = seen.saturating_add(b.count);
            }
            out.push(seen.min(self.count));
        }
        out
    }

    /// The non-empty buckets, in increasing order, as `(lowest, highest, count)` with inclusive
    /// bounds in microseconds.
    pub fn buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.buckets.iter().map(|b| {
            let (low, high) = bucket_bounds(b.index as usize);
            (low, high, b.count)
        })
    }

    /// Adds `other`'s values to these, as if they had been recorded into one histogram.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        *self = Self::merge_all([&*self, other], &mut Scratch::default());
    }

    /// The sum of `parts`, as if their values had been recorded into one histogram.
    pub(crate) fn merge_all<'a>(
        parts: impl IntoIterator<Item = &'a HistogramSnapshot>,
        scratch: &mut Scratch,
    ) -> HistogramSnapshot {
        let mut parts = parts.into_iter().filter(|p| p.count > 0).peekable();
        let Some(&first) = parts.peek() else {
            return Self::default();
        };
        let (mut sum, mut min, mut max) = (0u64, first.min, first.max);
        // Add into one dense array, then gather the non-empty buckets: linear in the parts'
        // sizes, however many shards there are.
        let dense = &mut scratch.dense;
        dense.resize(BUCKETS, 0);
        for part in parts {
            for b in part.buckets.iter() {
                let slot = &mut dense[b.index as usize];
                *slot = slot.saturating_add(b.count);
            }
            sum = sum.saturating_add(part.sum);
            min = min.min(part.min);
            max = max.max(part.max);
        }
        let found = &mut scratch.buckets;
        found.clear();
        for (index, slot) in dense
            .iter_mut()
            .enumerate()
            .take(bucket_index(max) + 1)
            .skip(bucket_index(min))
        {
            if *slot != 0 {
                found.push(Bucket {
                    index: index as u32,
                    count: std::mem::take(slot),
                });
            }
        }
        Self::from_buckets(found, sum, min, max)
    }
}
