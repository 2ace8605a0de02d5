use super::*;

#[test]
fn there_are_3840_buckets_ending_at_2_pow_36() {
    assert_eq!(BUCKETS, 3840);
    assert_eq!(bucket_index(MAX_TRACKED_US), BUCKETS - 1);
    assert_eq!(bucket_bounds(BUCKETS - 1).1, MAX_TRACKED_US);
    assert_eq!(bucket_index(u64::MAX), BUCKETS - 1);
}

#[test]
fn values_below_256_have_buckets_of_their_own() {
    for v in 0..256u64 {
        assert_eq!(bucket_index(v), v as usize);
        assert_eq!(bucket_bounds(v as usize), (v, v));
    }
}

#[test]
fn buckets_tile_the_range_without_gaps() {
    let mut next = 0u64;
    for i in 0..BUCKETS {
        let (low, high) = bucket_bounds(i);
        assert_eq!(low, next, "bucket {i}");
        assert!(high >= low);
        assert_eq!(bucket_index(low), i);
        assert_eq!(bucket_index(high), i);
        next = high + 1;
    }
    assert_eq!(next, MAX_TRACKED_US + 1);
}

#[test]
fn no_bucket_is_wider_than_a_128th_of_its_values() {
    for i in 0..BUCKETS {
        let (low, high) = bucket_bounds(i);
        let width = high - low + 1;
        assert!(
            width == 1 || width * 128 <= low,
            "bucket {i}: {low}..={high}"
        );
    }
}

#[test]
fn midpoint_is_within_the_stated_error_of_every_value_in_its_bucket() {
    for i in 0..BUCKETS {
        let (low, high) = bucket_bounds(i);
        let mid = bucket_midpoint(i);
        for v in [low, high] {
            let error = mid.abs_diff(v) as f64;
            assert!(
                error <= v as f64 * RELATIVE_ERROR,
                "bucket {i}: {v} -> {mid}"
            );
        }
    }
}

#[test]
fn an_untouched_cell_reads_empty() {
    let cell = HistogramCell::new();
    let snap = cell.read(&mut Scratch::default());
    assert!(snap.is_empty());
    assert_eq!(snap.quantile(0.5), None);
    assert_eq!(snap.mean(), None);
    assert_eq!(snap.min(), None);
    assert_eq!(snap.max(), None);
    assert!(
        cell.buckets.get().is_none(),
        "no buckets held before a record"
    );
    cell.record(300);
    assert!(cell.buckets.get().is_some());
    assert_eq!(cell.read(&mut Scratch::default()).count(), 1);
}

#[test]
fn merging_joins_disjoint_ranges() {
    let a = HistogramCell::new();
    let b = HistogramCell::new();
    a.record(10);
    a.record(20);
    b.record(1_000_000);
    let mut merged = b.read(&mut Scratch::default());
    merged.merge(&a.read(&mut Scratch::default()));
    assert_eq!(merged.count(), 3);
    assert_eq!(merged.sum(), 1_000_030);
    assert_eq!(merged.min(), Some(10));
    assert_eq!(merged.max(), Some(1_000_000));
    assert_eq!(merged.quantile(0.0), Some(10));
    assert_eq!(merged.quantile(0.5), Some(20));
    assert_eq!(merged.quantile(1.0), Some(1_000_000));
    let buckets: Vec<u64> = merged.buckets().map(|(_, _, c)| c).collect();
    assert_eq!(buckets, [1, 1, 1]);

    let mut empty = HistogramSnapshot::default();
    empty.merge(&merged);
    assert_eq!(empty, merged);
    merged.merge(&HistogramSnapshot::default());
    assert_eq!(empty, merged);
}

#[test]
fn quantile_ranks_are_exact_for_round_fractions() {
    let cell = HistogramCell::new();
    for v in 1..=100 {
        cell.record(v);
    }
    let snap = cell.read(&mut Scratch::default());
    assert_eq!(snap.quantile(0.5), Some(50));
    assert_eq!(snap.quantile(0.9), Some(90));
    assert_eq!(snap.quantile(0.99), Some(99));
    assert_eq!(snap.quantile(0.999), Some(100));
    assert_eq!(snap.quantile(-1.0), Some(1));
    assert_eq!(snap.quantile(f64::NAN), Some(1));
    assert_eq!(snap.quantile(7.0), Some(100));
}

#[test]
fn quantiles_in_one_pass_match_one_at_a_time_in_any_order() {
    let cell = HistogramCell::new();
    for v in 0..50_000u64 {
        cell.record(v * v % 1_000_003);
    }
    let snap = cell.read(&mut Scratch::default());
    let qs = [0.999, 0.0, 0.5, 1.0, 0.25, 0.5];
    let together = snap.quantiles(qs);
    for (q, got) in qs.into_iter().zip(together) {
        assert_eq!(got, snap.quantile(q), "q={q}");
    }
    assert_eq!(HistogramSnapshot::default().quantiles(qs), [None; 6]);
}
