//! Envoy's locality-weighted balancing: within a priority level, a locality is drawn by its
//! effective weight, then a host of it by the policy.
//!
//! A locality's effective weight is its configured weight scaled by its health:
//! `weight * min(1, factor / 100 * available / hosts)`, where `available` counts the
//! locality's hosts of the kind being picked (healthy, or degraded) and `factor` is the
//! overprovisioning factor. A locality that loses hosts sheds load to the others only once
//! it is short even after overprovisioning; a locality without a weight gets none.

/// The effective weight of a locality of weight `weight` with `available` of its `hosts`
/// usable.
pub(crate) fn effective_weight(
    weight: u32,
    available: usize,
    hosts: usize,
    overprovisioning: u32,
) -> f64 {
    if hosts == 0 || available == 0 {
        return 0.0;
    }
    let health = f64::from(overprovisioning) / 100.0 * available as f64 / hosts as f64;
    f64::from(weight) * health.min(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_scales_the_weight_past_the_overprovisioning() {
        assert_eq!(effective_weight(10, 4, 4, 140), 10.0);
        // 3 of 4 healthy: 1.4 * 0.75 = 1.05, still whole.
        assert_eq!(effective_weight(10, 3, 4, 140), 10.0);
        // 2 of 4: 1.4 * 0.5 = 0.7.
        assert!((effective_weight(10, 2, 4, 140) - 7.0).abs() < 1e-9);
        assert_eq!(effective_weight(10, 0, 4, 140), 0.0);
        assert_eq!(effective_weight(0, 4, 4, 140), 0.0);
        assert!((effective_weight(10, 3, 4, 100) - 7.5).abs() < 1e-9);
    }
}
