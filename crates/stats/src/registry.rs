//! [`Registry`]: the metric families, declared once, and every shard's cells; [`Shard`]: one
//! worker's factory of recording handles.
//!
//! The registry's mutex is taken only to declare a family, create a shard or a handle (start
//! up, config swap), to take a snapshot and to retire series: never to record.
//!
//! **Retirement.** A series lives as long as something may record into it: a handle on one of
//! its cells. Once none is left (its cluster, host or listener was removed and the last
//! connection using it closed), [`Registry::retire_unheld`] removes it after a grace period:
//! it vanishes from snapshots and its cells and labels are freed. A handle made for it later
//! starts a new series from zero.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::cell::Slot;
use crate::histogram::HistogramCell;
use crate::naming::{self, MetricKind};
use crate::{Counter, Gauge, Histogram, SharedGauge};

/// Tells one registry's family ids from another's.
static NEXT_REGISTRY_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FamilyId {
    registry: u64,
    index: usize,
}

/// A counter family, from [`Registry::counter`]; pass it to [`Shard::counter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CounterFamily(FamilyId);

/// A gauge family, from [`Registry::gauge`]; pass it to [`Shard::gauge`] or
/// [`Shard::shared_gauge`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GaugeFamily(FamilyId);

/// A histogram family, from [`Registry::histogram`]; pass it to [`Shard::histogram`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HistogramFamily(FamilyId);

/// Which shard a value came from, in a [`Snapshot`](crate::Snapshot): shards are numbered from 0 in the order
/// [`Registry::shard`] created them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId(pub(crate) usize);

impl ShardId {
    /// The shard's number.
    pub fn index(self) -> usize {
        self.0
    }
}

/// A series' label values, in the family's label order, and rendered once for the renderers.
pub(crate) struct SeriesLabels {
    pub(crate) values: Box<[Box<str>]>,
    /// `name="value",...` with the values escaped, no braces: a scrape copies it as it is.
    pub(crate) rendered: Box<str>,
}

/// A shard's own labels, as (name, value), and rendered as for [`SeriesLabels`].
pub(crate) struct ShardLabels {
    pub(crate) labels: Box<[(Box<str>, Box<str>)]>,
    pub(crate) rendered: Box<str>,
}

pub(crate) struct FamilyMeta {
    pub(crate) name: Box<str>,
    pub(crate) help: Box<str>,
    pub(crate) kind: MetricKind,
    pub(crate) label_names: Box<[Box<str>]>,
    /// Exported to Prometheus once per shard, with the shard's labels, instead of merged.
    pub(crate) per_shard: bool,
}

/// A shard's cell for one series. The registry keeps a reference so values outlive handles.
pub(crate) enum CellRef {
    Counter(Arc<Slot>),
    Gauge(Arc<Slot>),
    SharedGauge(Arc<Slot>),
    Histogram(Arc<HistogramCell>),
}

pub(crate) struct CellEntry {
    pub(crate) shard: usize,
    pub(crate) cell: CellRef,
}

pub(crate) struct Series {
    pub(crate) labels: Arc<SeriesLabels>,
    /// Sorted by shard.
    pub(crate) cells: Vec<CellEntry>,
    /// When a retirement sweep first found no handle on any cell; `None` while one is held.
    pub(crate) unheld_since: Option<Instant>,
}

impl CellRef {
    /// Whether a handle holds this cell (the registry's own reference aside). Exact under the
    /// registry's lock: handles are only made under it, and only a held cell can be cloned.
    fn held(&self) -> bool {
        match self {
            CellRef::Counter(slot) | CellRef::Gauge(slot) | CellRef::SharedGauge(slot) => {
                Arc::strong_count(slot) > 1
            }
            CellRef::Histogram(hist) => Arc::strong_count(hist) > 1,
        }
    }
}

/// What a retirement sweep did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retired {
    /// Series removed by this sweep.
    pub series: usize,
    /// Series without a handle still in their grace period.
    pub pending: usize,
}

pub(crate) struct Family {
    pub(crate) meta: Arc<FamilyMeta>,
    /// Series by label values.
    pub(crate) series: BTreeMap<Box<[Box<str>]>, Series>,
}

pub(crate) struct State {
    pub(crate) families: Vec<Family>,
    pub(crate) shards: Vec<Arc<ShardLabels>>,
}

struct Inner {
    id: u64,
    state: Mutex<State>,
}

/// The set of metric families and the shards recording them: `Send + Sync`, and cloning it is
/// cheap and shares it.
///
/// Declare each family once with [`counter`](Self::counter), [`gauge`](Self::gauge) or
/// [`histogram`](Self::histogram), giving its fixed label names; give each worker a
/// [`shard`](Self::shard); read everything with [`snapshot`](Self::snapshot).
///
/// Names must match `[a-zA-Z_:][a-zA-Z0-9_:]*` and label names `[a-zA-Z_][a-zA-Z0-9_]*` (not
/// starting with `__`): they are Prometheus names, and the proxy's own constants, so a bad one
/// is a bug and panics.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                id: NEXT_REGISTRY_ID.fetch_add(1, Ordering::Relaxed),
                state: Mutex::new(State {
                    families: Vec::new(),
                    shards: Vec::new(),
                }),
            }),
        }
    }

    /// Declares a counter family. Declaring the same name again with the same kind and label
    /// names returns the same family.
    ///
    /// # Panics
    ///
    /// On an invalid or repeated name, or one taken by another kind or other label names.
    pub fn counter(&self, name: &str, help: &str, label_names: &[&str]) -> CounterFamily {
        CounterFamily(self.define(MetricKind::Counter, name, help, label_names, false))
    }

    /// Declares a counter family that Prometheus sees per shard: one series per shard, with
    /// the shard's labels (`worker="0"`), instead of one merged series. For the few stats whose
    /// point is the balance between workers.
    ///
    /// # Panics
    ///
    /// As [`counter`](Self::counter).
    pub fn per_shard_counter(&self, name: &str, help: &str, label_names: &[&str]) -> CounterFamily {
        CounterFamily(self.define(MetricKind::Counter, name, help, label_names, true))
    }

    /// Declares a gauge family exported per shard; as [`per_shard_counter`](Self::per_shard_counter).
    ///
    /// # Panics
    ///
    /// As [`counter`](Self::counter).
    pub fn per_shard_gauge(&self, name: &str, help: &str, label_names: &[&str]) -> GaugeFamily {
        GaugeFamily(self.define(MetricKind::Gauge, name, help, label_names, true))
    }

    /// Declares a gauge family; as [`counter`](Self::counter).
    ///
    /// # Panics
    ///
    /// As [`counter`](Self::counter).
    pub fn gauge(&self, name: &str, help: &str, label_names: &[&str]) -> GaugeFamily {
        GaugeFamily(self.define(MetricKind::Gauge, name, help, label_names, false))
    }

    /// Declares a histogram family of microsecond values; as [`counter`](Self::counter).
    ///
    /// Name it without a unit (Envoy's `upstream_rq_time`): the text renderer shows
    /// microseconds under that name, and the Prometheus renderer exports seconds under the
    /// name plus `_seconds`.
    ///
    /// # Panics
    ///
    /// As [`counter`](Self::counter); also on a label named `quantile`.
    pub fn histogram(&self, name: &str, help: &str, label_names: &[&str]) -> HistogramFamily {
        HistogramFamily(self.define(MetricKind::Histogram, name, help, label_names, false))
    }

    /// A new shard, for one worker, with labels that tell it apart (`[("worker", "0")]`).
    /// Its series are merged with the other shards' in snapshots, and also shown per shard.
    ///
    /// # Panics
    ///
    /// On an invalid or repeated label name.
    pub fn shard(&self, labels: &[(&str, &str)]) -> Shard {
        check_label_names(labels.iter().map(|&(name, _)| name));
        let mut rendered = String::new();
        naming::render_labels(&mut rendered, labels.iter().copied());
        let labels = ShardLabels {
            labels: labels
                .iter()
                .map(|&(name, value)| (Box::from(name), Box::from(value)))
                .collect(),
            rendered: rendered.into(),
        };
        let mut state = self.lock();
        state.shards.push(Arc::new(labels));
        Shard {
            registry: self.clone(),
            id: ShardId(state.shards.len() - 1),
        }
    }

    /// Removes every series that no handle has held for at least `grace`, as seen by this and
    /// earlier sweeps: the first sweep that finds a series unheld starts its grace period, a
    /// sweep that finds it held again ends it. Call it every fraction of `grace`; a series
    /// goes between `grace` and `grace` plus the sweep period after its last handle.
    ///
    /// A removed series leaves every later snapshot, and its cells and labels are freed once
    /// no snapshot holds them. Series made by the `metrics` facade's recorder are
    /// held by it for good.
    pub fn retire_unheld(&self, grace: Duration) -> Retired {
        self.retire_unheld_at(grace, Instant::now())
    }

    /// [`retire_unheld`](Self::retire_unheld) as if it ran at `now`.
    pub fn retire_unheld_at(&self, grace: Duration, now: Instant) -> Retired {
        let mut done = Retired::default();
        let mut retired = Vec::new();
        let mut state = self.lock();
        for family in &mut state.families {
            let due: Vec<Box<[Box<str>]>> = family
                .series
                .iter_mut()
                .filter_map(|(key, series)| {
                    if series.cells.iter().any(|entry| entry.cell.held()) {
                        series.unheld_since = None;
                        return None;
                    }
                    let since = *series.unheld_since.get_or_insert(now);
                    if now.saturating_duration_since(since) < grace {
                        done.pending += 1;
                        return None;
                    }
                    Some(key.clone())
                })
                .collect();
            for key in due {
                retired.extend(family.series.remove(&key));
            }
        }
        drop(state);
        done.series = retired.len();
        // Freed with the lock released: handles are made meanwhile.
        drop(retired);
        done
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics half-way through a change of State, so a poisoned one is whole.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn define(
        &self,
        kind: MetricKind,
        name: &str,
        help: &str,
        label_names: &[&str],
        per_shard: bool,
    ) -> FamilyId {
        self.try_define(kind, name, help, label_names, per_shard)
            .unwrap_or_else(|e| panic!("stats: {e}"))
    }

    /// A counter family, or what is wrong with the name or labels (names that come from
    /// elsewhere: the `metrics` facade).
    #[cfg(feature = "metrics")]
    pub(crate) fn try_counter(&self, name: &str, labels: &[&str]) -> Result<CounterFamily, String> {
        self.try_define(MetricKind::Counter, name, "", labels, false)
            .map(CounterFamily)
    }

    /// As [`try_counter`](Self::try_counter), a gauge family.
    #[cfg(feature = "metrics")]
    pub(crate) fn try_gauge(&self, name: &str, labels: &[&str]) -> Result<GaugeFamily, String> {
        self.try_define(MetricKind::Gauge, name, "", labels, false)
            .map(GaugeFamily)
    }

    /// As [`try_counter`](Self::try_counter), a histogram family.
    #[cfg(feature = "metrics")]
    pub(crate) fn try_histogram(
        &self,
        name: &str,
        labels: &[&str],
    ) -> Result<HistogramFamily, String> {
        self.try_define(MetricKind::Histogram, name, "", labels, false)
            .map(HistogramFamily)
    }

    /// [`define`](Self::define), saying what is wrong instead of panicking.
    fn try_define(
        &self,
        kind: MetricKind,
        name: &str,
        help: &str,
        label_names: &[&str],
        per_shard: bool,
    ) -> Result<FamilyId, String> {
        if !is_metric_name(name) {
            return Err(format!("invalid metric name {name:?}"));
        }
        label_names_error(label_names.iter().copied()).map_or(Ok(()), Err)?;
        if kind == MetricKind::Histogram && label_names.contains(&"quantile") {
            return Err(format!(
                "histogram {name:?} may not have a label named \"quantile\""
            ));
        }
        let mut state = self.lock();
        if let Some(index) = state.families.iter().position(|f| &*f.meta.name == name) {
            let meta = &state.families[index].meta;
            let same = meta.kind == kind
                && meta.per_shard == per_shard
                && meta
                    .label_names
                    .iter()
                    .map(|l| &**l)
                    .eq(label_names.iter().copied());
            if !same {
                return Err(format!(
                    "{name:?} is already a {} with labels {:?}",
                    meta.kind, meta.label_names
                ));
            }
            return Ok(FamilyId {
                registry: self.inner.id,
                index,
            });
        }
        let exposed = naming::exposed_names(kind, name);
        for family in &state.families {
            for taken in naming::exposed_names(family.meta.kind, &family.meta.name) {
                if exposed.contains(&taken) {
                    return Err(format!(
                        "{name:?} would export {taken:?}, which {:?} exports",
                        family.meta.name
                    ));
                }
            }
        }
        state.families.push(Family {
            meta: Arc::new(FamilyMeta {
                name: name.into(),
                help: help.into(),
                kind,
                label_names: label_names.iter().map(|&l| Box::from(l)).collect(),
                per_shard,
            }),
            series: BTreeMap::new(),
        });
        Ok(FamilyId {
            registry: self.inner.id,
            index: state.families.len() - 1,
        })
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("Registry")
            .field("families", &state.families.len())
            .field("shards", &state.shards.len())
            .finish()
    }
}

/// One worker's part of a [`Registry`]: it creates the worker's recording handles.
///
/// Create one per worker with [`Registry::shard`], then a handle per (family, label values)
/// when the worker starts or swaps its config; record through the handles. Each handle gets a
/// cell of its own, so handles never contend, whichever thread holds them. Label values are
/// copied here, never on the recording path.
///
/// # Panics
///
/// The handle constructors panic on a family from another registry, on a number of label
/// values different from the family's label names, and when the shard has a label of the
/// same name as one of the family's.
///
/// A clone is the same shard: handles made through it record into the same cells.
#[derive(Clone)]
pub struct Shard {
    registry: Registry,
    id: ShardId,
}

impl Shard {
    /// This shard's id in snapshots.
    pub fn id(&self) -> ShardId {
        self.id
    }

    /// A handle on the counter series `family{label_values}` in this shard.
    pub fn counter(&self, family: CounterFamily, label_values: &[&str]) -> Counter {
        Counter::new(self.obtain(
            family.0,
            MetricKind::Counter,
            label_values,
            |cell| match cell {
                CellRef::Counter(slot) => claim(slot),
                _ => None,
            },
            || {
                let slot = Arc::new(Slot::default());
                (CellRef::Counter(Arc::clone(&slot)), slot)
            },
        ))
    }

    /// A handle on the gauge series `family{label_values}` in this shard.
    pub fn gauge(&self, family: GaugeFamily, label_values: &[&str]) -> Gauge {
        Gauge::new(self.obtain(
            family.0,
            MetricKind::Gauge,
            label_values,
            |cell| match cell {
                CellRef::Gauge(slot) => claim(slot),
                _ => None,
            },
            || {
                let slot = Arc::new(Slot::default());
                (CellRef::Gauge(Arc::clone(&slot)), slot)
            },
        ))
    }

    /// A handle on the gauge series `family{label_values}` in this shard that any number of
    /// threads may update (with `fetch_add`). Every call for the same series returns the same
    /// cell.
    pub fn shared_gauge(&self, family: GaugeFamily, label_values: &[&str]) -> SharedGauge {
        SharedGauge::new(self.obtain(
            family.0,
            MetricKind::Gauge,
            label_values,
            |cell| match cell {
                CellRef::SharedGauge(slot) => Some(Arc::clone(slot)),
                _ => None,
            },
            || {
                let slot = Arc::new(Slot::default());
                (CellRef::SharedGauge(Arc::clone(&slot)), slot)
            },
        ))
    }

    /// A handle on the histogram series `family{label_values}` in this shard.
    pub fn histogram(&self, family: HistogramFamily, label_values: &[&str]) -> Histogram {
        Histogram::new(self.obtain(
            family.0,
            MetricKind::Histogram,
            label_values,
            |cell| match cell {
                CellRef::Histogram(hist) => claim(hist),
                _ => None,
            },
            || {
                let hist = Arc::new(HistogramCell::new());
                (CellRef::Histogram(Arc::clone(&hist)), hist)
            },
        ))
    }

    /// Finds a cell of this shard for the series that `reuse` accepts, or adds the one
    /// `create` makes.
    fn obtain<T>(
        &self,
        family: FamilyId,
        kind: MetricKind,
        label_values: &[&str],
        reuse: impl Fn(&mut CellRef) -> Option<T>,
        create: impl FnOnce() -> (CellRef, T),
    ) -> T {
        assert_eq!(
            family.registry, self.registry.inner.id,
            "stats: family used with another registry"
        );
        let mut state = self.registry.lock();
        let state = &mut *state;
        let shard_labels = &state.shards[self.id.0];
        let family = &mut state.families[family.index];
        let meta = &family.meta;
        debug_assert_eq!(meta.kind, kind);
        assert_eq!(
            label_values.len(),
            meta.label_names.len(),
            "stats: {} has labels {:?}, given values {label_values:?}",
            meta.name,
            meta.label_names
        );
        for (name, _) in shard_labels.labels.iter() {
            assert!(
                !meta.label_names.contains(name),
                "stats: shard label {name:?} is also a label of {}",
                meta.name
            );
        }
        let key: Box<[Box<str>]> = label_values.iter().map(|&v| Box::from(v)).collect();
        let series = family.series.entry(key).or_insert_with_key(|values| {
            let mut rendered = String::new();
            let names = meta.label_names.iter().map(|n| &**n);
            naming::render_labels(&mut rendered, names.zip(label_values.iter().copied()));
            Series {
                labels: Arc::new(SeriesLabels {
                    values: values.clone(),
                    rendered: rendered.into(),
                }),
                cells: Vec::new(),
                unheld_since: None,
            }
        });
        // In use again: a grace period starts afresh once this handle is gone.
        series.unheld_since = None;
        let cells = &mut series.cells;
        let shard = self.id.0;
        if let Some(found) = cells
            .iter_mut()
            .filter(|entry| entry.shard == shard)
            .find_map(|entry| reuse(&mut entry.cell))
        {
            return found;
        }
        let (cell, handle) = create();
        let at = cells.partition_point(|entry| entry.shard <= shard);
        cells.insert(at, CellEntry { shard, cell });
        handle
    }
}

impl fmt::Debug for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shard").field("id", &self.id.0).finish()
    }
}

/// Hands a cell to a new single-writer handle if no live handle holds it: only the registry's
/// reference is left. `Arc::get_mut` checks that with Acquire, which pairs with the Release of
/// the old handle's drop, so the new writer starts from the old one's last store.
fn claim<C>(cell: &mut Arc<C>) -> Option<Arc<C>> {
    Arc::get_mut(cell)?;
    Some(Arc::clone(cell))
}

fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !name.starts_with("__")
}

fn check_label_names<'a>(names: impl Iterator<Item = &'a str> + Clone) {
    if let Some(error) = label_names_error(names) {
        panic!("stats: {error}");
    }
}

/// What is wrong with a list of label names, if anything.
fn label_names_error<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Option<String> {
    for (i, name) in names.clone().enumerate() {
        if !is_label_name(name) {
            return Some(format!("invalid label name {name:?}"));
        }
        if names.clone().take(i).any(|earlier| earlier == name) {
            return Some(format!("label {name:?} given twice"));
        }
    }
    None
}
