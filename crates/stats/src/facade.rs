//! The `metrics` facade's recorder (feature `metrics`): what any library records with
//! `metrics::counter!`, `gauge!` and `histogram!` lands in a [`Registry`], beside the stats the
//! process declares itself, and is rendered with them (`/stats`, Prometheus).
//!
//! The facade's handles may be used from any thread, so each one records under a small lock
//! of its own into a shard the recorder keeps: fine for a library's metrics, not for a
//! request path (the proxy's own stats stay worker-local). Gauges are whole numbers here
//! (rounded); histograms are taken as seconds (the Prometheus convention): a name ending in
//! `_seconds` is exported as is, any other as `name_seconds`. A name or label set the registry
//! cannot take (invalid, or another family's) is recorded nowhere and listed by
//! [`MetricsRecorder::refused`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata,
    SharedString, Unit,
};

use crate::{Registry, Shard};

/// A [`metrics::Recorder`] into a [`Registry`]. Install it once per process with
/// [`metrics::set_global_recorder`].
///
/// ```
/// let registry = stats::Registry::new();
/// let recorder = stats::MetricsRecorder::new(registry.clone());
/// metrics::with_local_recorder(&recorder, || {
///     metrics::counter!("jobs_done_total", "queue" => "mail").increment(3);
/// });
/// assert_eq!(registry.snapshot().counter("jobs_done_total", &["mail"]), Some(3));
/// ```
pub struct MetricsRecorder {
    registry: Registry,
    shard: Shard,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    counters: HashMap<Key, Arc<CounterCell>>,
    gauges: HashMap<Key, Arc<GaugeCell>>,
    histograms: HashMap<Key, Arc<HistogramCell>>,
    /// Names the registry refused, and why.
    refused: Vec<String>,
}

impl MetricsRecorder {
    /// A recorder into `registry`, in a shard of its own (labelled `source="metrics"` in
    /// per-shard output).
    pub fn new(registry: Registry) -> Self {
        let shard = registry.shard(&[("source", "metrics")]);
        Self {
            registry,
            shard,
            state: Mutex::new(State::default()),
        }
    }

    /// The names the registry could not take, with the reason.
    pub fn refused(&self) -> Vec<String> {
        self.lock().refused.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A key's label names and values.
fn labels(key: &Key) -> (Vec<&str>, Vec<&str>) {
    key.labels().map(|l| (l.key(), l.value())).unzip()
}

impl metrics::Recorder for MetricsRecorder {
    // Help texts: the registry takes a family's help when it is declared; a facade's family
    // is declared by its first record, with none.
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut state = self.lock();
        if let Some(cell) = state.counters.get(key) {
            return Counter::from_arc(Arc::clone(cell));
        }
        let (names, values) = labels(key);
        match self.registry.try_counter(key.name(), &names) {
            Ok(family) => {
                let cell = Arc::new(CounterCell(Mutex::new((
                    self.shard.counter(family, &values),
                    0,
                ))));
                state.counters.insert(key.clone(), Arc::clone(&cell));
                Counter::from_arc(cell)
            }
            Err(reason) => {
                state.refused.push(reason);
                Counter::noop()
            }
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut state = self.lock();
        if let Some(cell) = state.gauges.get(key) {
            return Gauge::from_arc(Arc::clone(cell));
        }
        let (names, values) = labels(key);
        match self.registry.try_gauge(key.name(), &names) {
            Ok(family) => {
                let cell = Arc::new(GaugeCell(Mutex::new((
                    self.shard.gauge(family, &values),
                    0.0,
                ))));
                state.gauges.insert(key.clone(), Arc::clone(&cell));
                Gauge::from_arc(cell)
            }
            Err(reason) => {
                state.refused.push(reason);
                Gauge::noop()
            }
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut state = self.lock();
        if let Some(cell) = state.histograms.get(key) {
            return Histogram::from_arc(Arc::clone(cell));
        }
        let (names, values) = labels(key);
        // The registry's histograms are exported as `name_seconds`.
        let name = key.name();
        let name = name.strip_suffix("_seconds").unwrap_or(name);
        match self.registry.try_histogram(name, &names) {
            Ok(family) => {
                let cell = Arc::new(HistogramCell(Mutex::new(
                    self.shard.histogram(family, &values),
                )));
                state.histograms.insert(key.clone(), Arc::clone(&cell));
                Histogram::from_arc(cell)
            }
            Err(reason) => {
                state.refused.push(reason);
                Histogram::noop()
            }
        }
    }
}

/// A counter and the total it has been given (for `absolute`).
struct CounterCell(Mutex<(crate::Counter, u64)>);

impl CounterFn for CounterCell {
    fn increment(&self, value: u64) {
        let mut cell = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        cell.0.add(value);
        cell.1 = cell.1.saturating_add(value);
    }

    fn absolute(&self, value: u64) {
        let mut cell = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // Counters only go up: a smaller total is ignored.
        if value > cell.1 {
            let more = value - cell.1;
            cell.0.add(more);
            cell.1 = value;
        }
    }
}

/// A gauge and its exact value (the registry's is that, rounded).
struct GaugeCell(Mutex<(crate::Gauge, f64)>);

impl GaugeCell {
    fn change(&self, f: impl FnOnce(f64) -> f64) {
        let mut cell = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        cell.1 = f(cell.1);
        let rounded = cell.1.round();
        // `as` saturates, and takes NaN to 0.
        cell.0.set(rounded as i64);
    }
}

impl GaugeFn for GaugeCell {
    fn increment(&self, value: f64) {
        self.change(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.change(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.change(|_| value);
    }
}

struct HistogramCell(Mutex<crate::Histogram>);

impl HistogramFn for HistogramCell {
    fn record(&self, seconds: f64) {
        // In microseconds; negative and NaN values as 0.
        let us = (seconds * 1e6).round().max(0.0) as u64;
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(us);
    }
}
