//! Compile-time properties: the registry is shared, a recording handle stays with one thread.

use stats::{Counter, Gauge, Histogram, HistogramSnapshot, Registry, Shard, SharedGauge, Snapshot};

/// Fails to compile if `$t` implements `$trait`: with the trait, the `_` below has two
/// candidates and inference is ambiguous (the trick `static_assertions` uses).
macro_rules! assert_not_impl {
    ($t:ty, $trait:path) => {{
        trait AmbiguousIfImpl<A> {
            fn some_item() {}
        }
        impl<T: ?Sized> AmbiguousIfImpl<()> for T {}
        #[allow(dead_code)]
        struct Invalid;
        impl<T: ?Sized + $trait> AmbiguousIfImpl<Invalid> for T {}
        let _ = <$t as AmbiguousIfImpl<_>>::some_item;
    }};
}

fn send<T: Send>() {}
fn send_sync<T: Send + Sync>() {}
fn clone<T: Clone>() {}

#[test]
fn registry_and_snapshots_are_send_and_sync() {
    send_sync::<Registry>();
    clone::<Registry>();
    send_sync::<Shard>();
    send_sync::<Snapshot>();
    send_sync::<HistogramSnapshot>();
    send_sync::<SharedGauge>();
    clone::<SharedGauge>();
}

#[test]
fn recording_handles_are_send_but_neither_sync_nor_clone() {
    send::<Counter>();
    send::<Gauge>();
    send::<Histogram>();
    assert_not_impl!(Counter, Sync);
    assert_not_impl!(Gauge, Sync);
    assert_not_impl!(Histogram, Sync);
    assert_not_impl!(Counter, Clone);
    assert_not_impl!(Gauge, Clone);
    assert_not_impl!(Histogram, Clone);
}
