//! [`Snapshot`]: every series' value at scrape time, merged over shards and per shard.
//!
//! Merging rules: counters and gauges add up over shards (a gauge's total is the sum of the
//! workers' values); histograms add their buckets. A snapshot taken while workers record is
//! not atomic across series: each value is a recent one.

use std::sync::Arc;

use crate::histogram::{HistogramSnapshot, Scratch};
use crate::naming::MetricKind;
use crate::registry::{
    CellRef, FamilyMeta, Registry, Series, SeriesLabels, ShardId, ShardLabels, State,
};

/// The value of one series (or of one shard's part of it).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A counter's count.
    Counter(u64),
    /// A gauge's value.
    Gauge(i64),
    /// A histogram's distribution, in microseconds.
    Histogram(HistogramSnapshot),
}

impl Value {
    /// The count, if this is a counter.
    pub fn as_counter(&self) -> Option<u64> {
        match *self {
            Value::Counter(v) => Some(v),
            _ => None,
        }
    }

    /// The value, if this is a gauge.
    pub fn as_gauge(&self) -> Option<i64> {
        match *self {
            Value::Gauge(v) => Some(v),
            _ => None,
        }
    }

    /// The distribution, if this is a histogram.
    pub fn as_histogram(&self) -> Option<&HistogramSnapshot> {
        match self {
            Value::Histogram(h) => Some(h),
            _ => None,
        }
    }

    fn zero(kind: MetricKind) -> Self {
        match kind {
            MetricKind::Counter => Value::Counter(0),
            MetricKind::Gauge => Value::Gauge(0),
            MetricKind::Histogram => Value::Histogram(HistogramSnapshot::default()),
        }
    }

    fn merge(&mut self, other: &Value) {
        match (self, other) {
            (Value::Counter(a), Value::Counter(b)) => *a = a.saturating_add(*b),
            (Value::Gauge(a), Value::Gauge(b)) => *a = a.wrapping_add(*b),
            (Value::Histogram(a), Value::Histogram(b)) => a.merge(b),
            // A family's cells all have its kind.
            _ => debug_assert!(false, "merging values of different kinds"),
        }
    }
}

impl CellRef {
    fn read(&self, scratch: &mut Scratch) -> Value {
        match self {
            CellRef::Counter(slot) => Value::Counter(slot.get()),
            CellRef::Gauge(slot) | CellRef::SharedGauge(slot) => Value::Gauge(slot.get() as i64),
            CellRef::Histogram(cell) => Value::Histogram(cell.read(scratch)),
        }
    }
}

/// One series: a family's label values, its value over all shards, and each shard's part.
#[derive(Clone, Debug)]
pub struct SeriesSnapshot {
    labels: Arc<SeriesLabels>,
    value: Value,
    per_shard: Vec<(ShardId, Value)>,
}

impl SeriesSnapshot {
    /// The label values, in the order of the family's label names.
    pub fn label_values(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.labels.values.iter().map(|v| &**v)
    }

    /// The value merged over all shards.
    pub fn value(&self) -> &Value {
        &self.value
    }

    /// Each shard's value, by increasing shard id, for the shards that have this series.
    pub fn per_shard(&self) -> &[(ShardId, Value)] {
        &self.per_shard
    }

    /// One shard's value, if that shard has this series.
    pub fn shard_value(&self, shard: ShardId) -> Option<&Value> {
        self.per_shard
            .binary_search_by_key(&shard, |&(id, _)| id)
            .ok()
            .map(|i| &self.per_shard[i].1)
    }

    /// `name="value",...`, escaped, without braces.
    pub(crate) fn rendered_labels(&self) -> &str {
        &self.labels.rendered
    }

    /// The series as the `/stats` text names it, `family{labels}`: what a filter looks at.
    pub fn text_key(&self, family: &str) -> String {
        let mut key = String::new();
        crate::naming::write_key(&mut key, family, &[self.rendered_labels()]);
        key
    }
}

/// One family: its name, help, kind, label names, and its series sorted by label values.
#[derive(Clone, Debug)]
pub struct FamilySnapshot {
    meta: Arc<FamilyMeta>,
    series: Vec<SeriesSnapshot>,
}

impl FamilySnapshot {
    /// Whether Prometheus sees it per shard (declared with `per_shard_counter`/`_gauge`).
    pub fn is_per_shard(&self) -> bool {
        self.meta.per_shard
    }

    /// The name it was declared with.
    pub fn name(&self) -> &str {
        &self.meta.name
    }

    /// The help text it was declared with.
    pub fn help(&self) -> &str {
        &self.meta.help
    }

    /// Counter, gauge or histogram.
    pub fn kind(&self) -> MetricKind {
        self.meta.kind
    }

    /// The label names it was declared with.
    pub fn label_names(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.meta.label_names.iter().map(|n| &**n)
    }

    /// Every series some shard created a handle for, sorted by label values.
    pub fn series(&self) -> &[SeriesSnapshot] {
        &self.series
    }

    /// The series with these label values (in label-name order).
    pub fn get(&self, label_values: &[&str]) -> Option<&SeriesSnapshot> {
        self.series
            .binary_search_by(|s| s.label_values().cmp(label_values.iter().copied()))
            .ok()
            .map(|i| &self.series[i])
    }
}

impl std::fmt::Debug for SeriesLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.values.fmt(f)
    }
}

impl std::fmt::Debug for ShardLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.labels.fmt(f)
    }
}

impl std::fmt::Debug for FamilyMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Family")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("label_names", &self.label_names)
            .finish()
    }
}

/// Every family's series at the time of [`Registry::snapshot`](crate::Registry::snapshot).
#[derive(Clone, Debug)]
pub struct Snapshot {
    families: Vec<FamilySnapshot>,
    shards: Vec<Arc<ShardLabels>>,
}

impl Snapshot {
    pub(crate) fn collect(state: &State) -> Snapshot {
        let mut scratch = Scratch::default();
        let families = state
            .families
            .iter()
            .map(|family| FamilySnapshot {
                meta: Arc::clone(&family.meta),
                series: family
                    .series
                    .values()
                    .map(|series| collect_series(family.meta.kind, series, &mut scratch))
                    .collect(),
            })
            .collect();
        Snapshot {
            families,
            shards: state.shards.clone(),
        }
    }

    /// Every family, in declaration order.
    pub fn families(&self) -> &[FamilySnapshot] {
        &self.families
    }

    /// The family declared with this name.
    pub fn family(&self, name: &str) -> Option<&FamilySnapshot> {
        self.families.iter().find(|f| f.name() == name)
    }

    /// The merged value of a counter series.
    pub fn counter(&self, name: &str, label_values: &[&str]) -> Option<u64> {
        self.value(name, label_values)?.as_counter()
    }

    /// The merged value of a gauge series.
    pub fn gauge(&self, name: &str, label_values: &[&str]) -> Option<i64> {
        self.value(name, label_values)?.as_gauge()
    }

    /// The merged distribution of a histogram series.
    pub fn histogram(&self, name: &str, label_values: &[&str]) -> Option<&HistogramSnapshot> {
        self.value(name, label_values)?.as_histogram()
    }

    fn value(&self, name: &str, label_values: &[&str]) -> Option<&Value> {
        Some(self.family(name)?.get(label_values)?.value())
    }

    /// How many shards the registry had.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// A shard's labels as (name, value), as given to [`Registry::shard`](crate::Registry::shard).
    pub fn shard_labels(&self, shard: ShardId) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        self.shards
            .get(shard.0)
            .map_or(&[][..], |shard| &shard.labels[..])
            .iter()
            .map(|(name, value)| (&**name, &**value))
    }

    /// A shard's labels as `name="value",...`, escaped, without braces.
    pub(crate) fn rendered_shard_labels(&self, shard: ShardId) -> &str {
        self.shards.get(shard.0).map_or("", |shard| &shard.rendered)
    }
}

fn collect_series(kind: MetricKind, series: &Series, scratch: &mut Scratch) -> SeriesSnapshot {
    let mut per_shard: Vec<(ShardId, Value)> = Vec::with_capacity(series.cells.len());
    for entry in &series.cells {
        let value = entry.cell.read(scratch);
        match per_shard.last_mut() {
            // Cells are sorted by shard: a shard's cells (one per handle it made) are adjacent.
            Some((id, sum)) if id.0 == entry.shard => sum.merge(&value),
            _ => per_shard.push((ShardId(entry.shard), value)),
        }
    }
    let value = match per_shard.as_slice() {
        [(_, only)] => only.clone(),
        all if kind == MetricKind::Histogram => Value::Histogram(HistogramSnapshot::merge_all(
            all.iter().filter_map(|(_, v)| v.as_histogram()),
            scratch,
        )),
        all => {
            let mut total = Value::zero(kind);
            for (_, value) in all {
                total.merge(value);
            }
            total
        }
    };
    SeriesSnapshot {
        labels: Arc::clone(&series.labels),
        value,
        per_shard,
    }
}

impl Registry {
    /// Reads every series of every family, merged over shards and per shard. Costs a walk over
    /// all cells; recording goes on meanwhile.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::collect(&self.lock())
    }
}
