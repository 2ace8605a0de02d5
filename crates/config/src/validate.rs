//! Raw config -> [`Config`]: defaults filled in, references resolved, every value checked.

use std::num::NonZeroUsize;
use std::sync::Arc;

use super::raw::*;
use super::*;
use crate::values::*;

/// `origin` is the file's part of `raw` (without resources from a management server), kept
/// in the config so that those can be put together with it again. `checked`: clusters from
/// a management server, checked already (each on its own, as it arrived), after the file's.
pub(super) fn validate(
    raw: RawConfig,
    origin: Arc<RawConfig>,
    checked: Vec<Arc<ClusterConfig>>,
) -> Result<Config, ConfigError> {
    let concurrency = match raw.concurrency {
        None => Concurrency::Auto,
        Some(RawConcurrency::Word(w)) if w == "auto" => Concurrency::Auto,
        Some(RawConcurrency::Word(w)) => {
            return Err(ConfigError::invalid(
                "concurrency",
                format!("expected `auto` or a number of workers, found `{w}`"),
            ));
        }
        Some(RawConcurrency::Workers(n)) => NonZeroUsize::new(n as usize)
            .filter(|n| n.get() <= 1024)
            .map(Concurrency::Fixed)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "concurrency",
                    format!("expected `auto` or 1 to 1024 workers, found {n}"),
                )
            })?,
    };

    let mut clusters = raw
        .clusters
        .into_iter()
        .enumerate()
        .map(|(i, c)| cluster::check::cluster(c, &format!("clusters[{i}]")).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    clusters.extend(checked);
    let mut cluster_index =
        cluster::ClusterIndex::with_capacity_and_hasher(clusters.len(), Default::default());
    for (i, c) in clusters.iter().enumerate() {
        if cluster_index.insert(c.name.as_str(), i).is_some() {
            return Err(ConfigError::invalid(
                format!("clusters[{i}].name"),
                format!("duplicate cluster name `{}`", c.name),
            ));
        }
    }

    let node_locality = raw.node.as_ref().and_then(|n| n.locality.clone());
    let xds = xds::bootstrap(raw.node, raw.dynamic_resources)?;
    let local_cluster = cluster::local::local_cluster(
        raw.cluster_manager,
        node_locality.as_ref(),
        &clusters,
        xds.is_some(),
    )?;
    // With a management server, listeners may all come from it.
    if raw.listeners.is_empty() && xds.is_none() {
        return Err(ConfigError::invalid(
            "listeners",
            "expected at least one listener",
        ));
    }
    // The collector a management server names in its listeners is the process's, unless
    // the file has one: one per process, so listeners naming another are refused.
    let mut raw_tracing = raw.tracing;
    for (i, l) in raw.listeners.iter().enumerate() {
        let Some(provider) = &l.tracing_provider else {
            continue;
        };
        match &raw_tracing {
            None => raw_tracing = Some(provider.clone()),
            Some(chosen) if chosen == provider => {}
            Some(_) => {
                return Err(ConfigError::invalid(
                    format!("listeners[{i}].tracing"),
                    "its tracing provider is not the process's collector (one per process)",
                ));
            }
        }
    }
    let tracing = super::tracing::tracing(raw_tracing)?;
    let mut listeners: Vec<ListenerConfig> = Vec::with_capacity(raw.listeners.len());
    let checked_against = route::memo::Clusters::new(&clusters);
    for (i, l) in raw.listeners.into_iter().enumerate() {
        let path = format!("listeners[{i}]");
        let l = listener::check::listener(
            l,
            &path,
            &cluster_index,
            &checked_against,
            tracing.is_some(),
        )?;
        if listeners.iter().any(|other| other.name == l.name) {
            return Err(ConfigError::invalid(
                format!("{path}.name"),
                format!("duplicate listener name `{}`", l.name),
            ));
        }
        // Port 0 asks for a fresh ephemeral port each time, so it never clashes; a TCP
        // listener and a QUIC-only one may share an address (the UDP port is another port).
        if let Some(other) = listeners.iter().find(|o| o.clashes_with(&l)) {
            return Err(ConfigError::invalid(
                format!("{path}.address"),
                format!("{} is already used by listener `{}`", l.address, other.name),
            ));
        }
        listeners.push(l);
    }

    let admin = match raw.admin.unwrap_or_default() {
        RawAdmin {
            enabled: Some(false),
            address: None,
            allow: None,
            token_file: None,
            open: None,
        } => None,
        RawAdmin {
            enabled: Some(false),
            ..
        } => {
            return Err(ConfigError::invalid(
                "admin",
                "settings given but `enabled: false`",
            ));
        }
        raw => {
            let address = match &raw.address {
                Some(a) => socket_addr(a, "admin.address")?,
                None => DEFAULT_ADMIN_ADDRESS,
            };
            Some(admin::admin(address, raw)?)
        }
    };
    if let Some(admin) = &admin
        && let Some(l) = listeners
            .iter()
            .find(|l| l.address == admin.address && admin.address.port() != 0 && l.serves_tcp())
    {
        return Err(ConfigError::invalid(
            "admin.address",
            format!("{} is already used by listener `{}`", admin.address, l.name),
        ));
    }

    Ok(Config {
        concurrency,
        drain_timeout: raw.drain_timeout.unwrap_or(DEFAULT_DRAIN_TIMEOUT),
        admin,
        max_connections: limit(raw.max_connections, "max_connections")?,
        overload: super::overload::overload(raw.overload, super::OverloadEnvironment::current())?,
        watch: raw.watch,
        stats: super::stats::stats(raw.stats)?,
        tracing,
        listeners,
        clusters,
        local_cluster,
        xds,
        origin,
    })
}

#[cfg(test)]
mod tests;
