//! A cluster's load balancing from Envoy's two forms: the `lb_policy` enum with its
//! `*_lb_config` and `common_lb_config`, and the `load_balancing_policy` extensions
//! (`envoy.extensions.load_balancing_policies.*`) that Envoy Gateway and newer control planes
//! send.

use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    CommonLbConfig, LbConfig, LbPolicy, common_lb_config,
};
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, LoadBalancingPolicy};
use envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::{
    LocalityLbConfig, locality_lb_config,
};
use envoy_types::pb::envoy::extensions::load_balancing_policies::{
    least_request::v3::LeastRequest, maglev::v3::Maglev, random::v3::Random,
    ring_hash::v3::RingHash, round_robin::v3::RoundRobin,
};
use envoy_types::pb::google::protobuf::Any;

use crate::envoy::unsupported;
use crate::envoy::{ResourceError, fields, nothing_else};
use crate::{RawLeastRequest, RawMaglev, RawRingHash, RawSlowStart, RawZoneAware};

const EXTENSIONS: &str = "type.googleapis.com/envoy.extensions.load_balancing_policies.";

/// A cluster's balancing, as the file writes it.
#[derive(Debug, Default)]
pub(crate) struct Balancing {
    pub(crate) lb_policy: &'static str,
    pub(crate) least_request: Option<RawLeastRequest>,
    pub(crate) ring_hash: Option<RawRingHash>,
    pub(crate) maglev: Option<RawMaglev>,
    pub(crate) locality_weighted: bool,
    pub(crate) zone_aware: Option<RawZoneAware>,
    pub(crate) slow_start: Option<RawSlowStart>,
    pub(crate) healthy_panic_threshold: Option<f64>,
}

/// Takes `lb_policy`, `lb_config`, `load_balancing_policy` and `common_lb_config` out of `c`.
pub(crate) fn balancing(c: &mut Cluster, at: &str) -> Result<Balancing, ResourceError> {
    let extension_form = c.load_balancing_policy.is_some();
    let mut balancing = match c.load_balancing_policy.take() {
        // As Envoy: the extension form wins over the enum.
        Some(policy) => {
            c.lb_policy = 0;
            c.lb_config = None;
            extension(policy, &format!("{at}.load_balancing_policy"))?
        }
        None => legacy(c, at)?,
    };
    if let Some(common) = c.common_lb_config.take() {
        let at = format!("{at}.common_lb_config");
        // Envoy refuses these beside the extension form (its own config says them).
        if extension_form
            && (common.locality_config_specifier.is_some()
                || common.consistent_hashing_lb_config.is_some())
        {
            return Err(ResourceError::invalid(
                at,
                "locality_weighted_lb_config, zone_aware_lb_config and consistent_hashing_lb_config cannot be combined with load_balancing_policy",
            ));
        }
        common_settings(common, &mut balancing, &at)?;
    }
    Ok(balancing)
}

/// `lb_policy` and its `lb_config`.
fn legacy(c: &mut Cluster, at: &str) -> Result<Balancing, ResourceError> {
    let policy = LbPolicy::try_from(std::mem::take(&mut c.lb_policy))
        .map_err(|_| ResourceError::invalid(format!("{at}.lb_policy"), "unknown policy"))?;
    let lb_policy = match policy {
        LbPolicy::RoundRobin => "round_robin",
        LbPolicy::LeastRequest => "least_request",
        LbPolicy::Random => "random",
        LbPolicy::RingHash => "ring_hash",
        LbPolicy::Maglev => "maglev",
        other => {
            return Err(unsupported(
                at,
                format!("lb_policy {}", other.as_str_name()),
            ));
        }
    };
    let mut balancing = Balancing {
        lb_policy,
        ..Balancing::default()
    };
    match (policy, c.lb_config.take()) {
        (_, None) => {}
        (LbPolicy::LeastRequest, Some(LbConfig::LeastRequestLbConfig(mut config))) => {
            balancing.slow_start = legacy_slow_start(config.slow_start_config.take(), at)?;
            let choice_count = config.choice_count.take().map(|v| v.value);
            let bias = config.active_request_bias.take().map(|v| v.default_value);
            if config != Default::default() {
                return Err(unsupported(
                    at,
                    "least_request_lb_config (besides choice_count, active_request_bias)",
                ));
            }
            balancing.least_request = Some(RawLeastRequest {
                choice_count,
                active_request_bias: bias,
            });
        }
        (LbPolicy::RingHash, Some(LbConfig::RingHashLbConfig(mut config))) => {
            let minimum = config.minimum_ring_size.take().map(|v| v.value);
            let maximum = config.maximum_ring_size.take().map(|v| v.value);
            if config != Default::default() {
                return Err(unsupported(
                    at,
                    "ring_hash_lb_config.hash_function (xxHash only)",
                ));
            }
            balancing.ring_hash = Some(RawRingHash {
                minimum_ring_size: minimum,
                maximum_ring_size: maximum,
            });
        }
        (LbPolicy::Maglev, Some(LbConfig::MaglevLbConfig(mut config))) => {
            let table_size = config.table_size.take().map(|v| v.value);
            if config != Default::default() {
                return Err(unsupported(at, "maglev_lb_config (besides table_size)"));
            }
            balancing.maglev = Some(RawMaglev { table_size });
        }
        (LbPolicy::RoundRobin, Some(LbConfig::RoundRobinLbConfig(mut config))) => {
            balancing.slow_start = legacy_slow_start(config.slow_start_config.take(), at)?;
            if config != Default::default() {
                return Err(unsupported(at, "round_robin_lb_config"));
            }
        }
        _ => {
            return Err(unsupported(
                at,
                "lb_config (for another policy, or slow start)",
            ));
        }
    }
    Ok(balancing)
}

/// The first policy of the list: Envoy takes the first it knows, so one not honoured here
/// is refused rather than passed over for a later one.
// `enable_full_scan` is deprecated but still sent; it is read, not ignored.
#[allow(deprecated)]
fn extension(mut policy: LoadBalancingPolicy, at: &str) -> Result<Balancing, ResourceError> {
    if policy.policies.is_empty() {
        return Err(ResourceError::invalid(at, "expected at least one policy"));
    }
    let first = policy.policies.swap_remove(0);
    let at = format!("{at}.policies[0].typed_extension_config");
    let Some(config) = first.typed_extension_config.and_then(|t| t.typed_config) else {
        return Err(ResourceError::invalid(at, "expected a typed_config"));
    };
    let kind = config
        .type_url
        .strip_prefix(EXTENSIONS)
        .unwrap_or(&config.type_url);
    let at = format!("{at} ({kind})");
    let mut balancing = Balancing::default();
    match kind {
        "round_robin.v3.RoundRobin" => {
            let mut rr: RoundRobin = decode(&config, &at)?;
            balancing.lb_policy = "round_robin";
            balancing.slow_start = slow_start(rr.slow_start_config.take(), &at)?;
            locality(rr.locality_lb_config.take(), &mut balancing, &at)?;
            nothing_else(&rr, fields::ROUND_ROBIN, &at)?;
        }
        "least_request.v3.LeastRequest" => {
            let mut lr: LeastRequest = decode(&config, &at)?;
            balancing.lb_policy = "least_request";
            balancing.slow_start = slow_start(lr.slow_start_config.take(), &at)?;
            balancing.least_request = Some(RawLeastRequest {
                choice_count: lr.choice_count.take().map(|v| v.value),
                active_request_bias: lr.active_request_bias.take().map(|v| v.default_value),
            });
            locality(lr.locality_lb_config.take(), &mut balancing, &at)?;
            // Envoy's default selection: N random choices.
            if lr.enable_full_scan.as_ref().is_some_and(|v| !v.value) {
                lr.enable_full_scan = None;
            }
            nothing_else(&lr, fields::LEAST_REQUEST, &at)?;
        }
        "random.v3.Random" => {
            let mut random: Random = decode(&config, &at)?;
            balancing.lb_policy = "random";
            locality(random.locality_lb_config.take(), &mut balancing, &at)?;
            nothing_else(&random, fields::RANDOM, &at)?;
        }
        "ring_hash.v3.RingHash" => {
            let mut ring: RingHash = decode(&config, &at)?;
            balancing.lb_policy = "ring_hash";
            balancing.ring_hash = Some(RawRingHash {
                minimum_ring_size: ring.minimum_ring_size.take().map(|v| v.value),
                maximum_ring_size: ring.maximum_ring_size.take().map(|v| v.value),
            });
            // DEFAULT_HASH and XX_HASH are xxHash.
            if ring.hash_function <= 1 {
                ring.hash_function = 0;
            }
            consistent_hashing(&mut ring.consistent_hashing_lb_config, &at)?;
            balancing.locality_weighted = ring.locality_weighted_lb_config.take().is_some();
            nothing_else(&ring, fields::RING_HASH, &at)?;
        }
        "maglev.v3.Maglev" => {
            let mut maglev: Maglev = decode(&config, &at)?;
            balancing.lb_policy = "maglev";
            balancing.maglev = Some(RawMaglev {
                table_size: maglev.table_size.take().map(|v| v.value),
            });
            consistent_hashing(&mut maglev.consistent_hashing_lb_config, &at)?;
            balancing.locality_weighted = maglev.locality_weighted_lb_config.take().is_some();
            nothing_else(&maglev, fields::MAGLEV, &at)?;
        }
        // A locality drawn by its weight, then a host by the child policy: the child with
        // locality-weighted balancing.
        "wrr_locality.v3.WrrLocality" => {
            use envoy_types::pb::envoy::extensions::load_balancing_policies::wrr_locality::v3::WrrLocality;
            let mut wrr: WrrLocality = decode(&config, &at)?;
            let at = format!("{at}.endpoint_picking_policy");
            let Some(child) = wrr.endpoint_picking_policy.take() else {
                return Err(ResourceError::invalid(at, "expected the child policy"));
            };
            balancing = extension(child, &at)?;
            if balancing.zone_aware.is_some() {
                return Err(ResourceError::invalid(
                    at,
                    "zone-aware routing inside locality-weighted balancing: one way to choose a locality",
                ));
            }
            balancing.locality_weighted = true;
        }
        other => {
            return Err(unsupported(
                &at,
                format!(
                    "load-balancing policy `{other}` (round_robin, least_request, random, ring_hash, maglev, wrr_locality)"
                ),
            ));
        }
    }
    Ok(balancing)
}

/// Slow start from the extension's `slow_start_config`.
fn slow_start(
    config: Option<
        envoy_types::pb::envoy::extensions::load_balancing_policies::common::v3::SlowStartConfig,
    >,
    at: &str,
) -> Result<Option<RawSlowStart>, ResourceError> {
    let Some(config) = config else {
        return Ok(None);
    };
    ramp(
        config.slow_start_window,
        config.aggression.map(|a| a.default_value),
        config.min_weight_percent.map(|p| p.value),
        &format!("{at}.slow_start_config"),
    )
}

/// Slow start from the legacy `*_lb_config.slow_start_config`.
fn legacy_slow_start(
    config: Option<envoy_types::pb::envoy::config::cluster::v3::cluster::SlowStartConfig>,
    at: &str,
) -> Result<Option<RawSlowStart>, ResourceError> {
    let Some(config) = config else {
        return Ok(None);
    };
    ramp(
        config.slow_start_window,
        config.aggression.map(|a| a.default_value),
        config.min_weight_percent.map(|p| p.value),
        &format!("{at}.lb_config.slow_start_config"),
    )
}

/// The aggression's runtime key is not read (no runtime here): its default value is used.
fn ramp(
    window: Option<envoy_types::pb::google::protobuf::Duration>,
    aggression: Option<f64>,
    min_weight_percent: Option<f64>,
    at: &str,
) -> Result<Option<RawSlowStart>, ResourceError> {
    let Some(window) = crate::envoy::duration(window, &format!("{at}.slow_start_window"))? else {
        // Envoy: no window, no slow start.
        return Ok(None);
    };
    if window.is_zero() {
        return Ok(None);
    }
    Ok(Some(RawSlowStart {
        window,
        aggression,
        min_weight_percent,
    }))
}

fn decode<M: prost::Message + Default>(config: &Any, at: &str) -> Result<M, ResourceError> {
    M::decode(config.value.as_slice())
        .map_err(|e| ResourceError::invalid(at, format!("cannot decode: {e}")))
}

/// The extension's `locality_lb_config`: locality-weighted balancing, or zone-aware
/// routing's settings.
// `force_locality_direct_routing` is deprecated but still sent; it is read, not ignored.
#[allow(deprecated)]
fn locality(
    config: Option<LocalityLbConfig>,
    balancing: &mut Balancing,
    at: &str,
) -> Result<(), ResourceError> {
    use locality_lb_config::zone_aware_lb_config::LocalityBasis;
    match config.and_then(|c| c.locality_config_specifier) {
        None => {}
        Some(locality_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(_)) => {
            balancing.locality_weighted = true;
        }
        Some(locality_lb_config::LocalityConfigSpecifier::ZoneAwareLbConfig(zone)) => {
            let at = format!("{at}.locality_lb_config.zone_aware_lb_config");
            let basis = LocalityBasis::try_from(zone.locality_basis).map_err(|_| {
                ResourceError::invalid(format!("{at}.locality_basis"), "unknown basis")
            })?;
            // As Envoy: force_local_zone's size (1 when not given), else the deprecated
            // flag's 1.
            let force = match zone.force_local_zone {
                Some(force) => Some(force.min_size.map_or(1, |v| v.value)),
                None if zone.force_locality_direct_routing => Some(1),
                None => None,
            };
            balancing.zone_aware = Some(RawZoneAware {
                routing_enabled: zone.routing_enabled.map(|p| p.value),
                min_cluster_size: zone.min_cluster_size.map(|v| v.value),
                force_local_zone_min_size: force,
                fail_traffic_on_panic: Some(zone.fail_traffic_on_panic),
                locality_basis: Some(
                    match basis {
                        LocalityBasis::HealthyHostsNum => "healthy_hosts_num",
                        LocalityBasis::HealthyHostsWeight => "healthy_hosts_weight",
                    }
                    .to_owned(),
                ),
            });
        }
    }
    Ok(())
}

/// The hashing options: only Envoy's defaults (hash by address, no balance factor).
fn consistent_hashing<T: prost::Message + Default + PartialEq>(
    config: &mut Option<T>,
    at: &str,
) -> Result<(), ResourceError> {
    if config.take().is_some_and(|c| c != T::default()) {
        return Err(unsupported(
            at,
            "consistent_hashing_lb_config (hostnames, balance factor, hash policies)",
        ));
    }
    Ok(())
}

/// `healthy_panic_threshold` and locality weighting; `update_merge_window` is accepted
/// (host updates apply at once here, as with a window of 0).
fn common_settings(
    mut common: CommonLbConfig,
    balancing: &mut Balancing,
    at: &str,
) -> Result<(), ResourceError> {
    // Rounded to a whole percent, as Envoy reads it.
    balancing.healthy_panic_threshold = common
        .healthy_panic_threshold
        .take()
        .map(|p| p.value.round());
    common.update_merge_window = None;
    match common.locality_config_specifier.take() {
        None => {}
        Some(common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(_)) => {
            balancing.locality_weighted = true;
        }
        Some(common_lb_config::LocalityConfigSpecifier::ZoneAwareLbConfig(zone)) => {
            balancing.zone_aware = Some(RawZoneAware {
                routing_enabled: zone.routing_enabled.map(|p| p.value),
                min_cluster_size: zone.min_cluster_size.map(|v| v.value),
                fail_traffic_on_panic: Some(zone.fail_traffic_on_panic),
                ..RawZoneAware::default()
            });
        }
    }
    if common
        .consistent_hashing_lb_config
        .take()
        .is_some_and(|c| c != Default::default())
    {
        return Err(unsupported(
            at,
            "consistent_hashing_lb_config (hostnames, balance factor, hash policies)",
        ));
    }
    nothing_else(&common, fields::COMMON_LB_CONFIG, at)
}
