//! The HTTP filter chain of a listener, and what each route says about its filters.
//!
//! Each filter's settings are a module below holding side by side the file's form, the typed
//! form (which implements [`FilterSettings`]), the checks from one to the other, and the xDS
//! mapping where Envoy has the filter. A filter is listed once, in `http_filters!` below,
//! which writes [`HttpFilterConfig`], [`RawHttpFilter`], a route's [`RawRouteFilters`] and
//! [`RouteFilters`], and the checks of a chain and of a route's `filters:`. The module's name
//! is the filter's name in the file.

pub mod grpc_service;
pub mod rate_limit_actions;
pub mod reply;
pub(crate) mod xds;

pub use grpc_service::{GrpcService, RawGrpcService};
pub use rate_limit_actions::*;

use std::collections::BTreeMap;
use std::sync::LazyLock;

use serde::de::DeserializeOwned;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::*;

/// A filter's settings: how its entry in `http_filters` and a route's `filters:` are read
/// and checked.
pub trait FilterSettings: Sized {
    /// The listener's `- NAME: { ... }` as written (a bare `- NAME:` is `{}`).
    type Raw: DeserializeOwned + Clone + std::fmt::Debug;
    /// A route's or virtual host's `filters: { NAME: ... }` as written.
    type RawRoute: DeserializeOwned + Clone + std::fmt::Debug;
    /// What a route or virtual host says about the filter, checked; the default: as the
    /// listener configures it.
    type Route: Clone + Default + PartialEq + Serialize + std::fmt::Debug;

    /// The listener's settings, checked; `path` is their key path.
    fn check(raw: Self::Raw, path: &str, chain: &ChainCtx<'_>) -> Result<Self, ConfigError>;

    /// A route's or virtual host's entry, checked.
    fn check_route(raw: Self::RawRoute, path: &str) -> Result<Self::Route, ConfigError>;

    /// A route's or virtual host's entry that turns the filter on with the listener's
    /// settings (`on`), or off.
    fn route_switch(on: bool) -> Self::RawRoute;
}

/// What a filter's listener settings are checked against besides themselves.
pub struct ChainCtx<'a> {
    /// The listener's `per_connection_buffer_limit_bytes`.
    pub buffer_limit: u32,
    /// The clusters filters may call (a JWKS server), by name: their places in the config.
    pub cluster_index: &'a crate::cluster::ClusterIndex<'a>,
}

/// [`FilterSettings`] for a filter whose entry on a route or virtual host is `disabled` or
/// settings of its own, checked by `check(raw, path, on_route)` as the listener's are.
macro_rules! per_route_settings {
    ($settings:ty, $raw:ty, $check:expr) => {
        impl FilterSettings for $settings {
            type Raw = $raw;
            type RawRoute = RawPerRoute<$raw>;
            type Route = PerRoute<$settings>;

            fn check(raw: $raw, path: &str, _: &ChainCtx<'_>) -> Result<Self, ConfigError> {
                ($check)(raw, path, false)
            }

            fn check_route(raw: Self::RawRoute, path: &str) -> Result<Self::Route, ConfigError> {
                per_route(raw, path, |raw, at| ($check)(raw, at, true))
            }

            fn route_switch(on: bool) -> Self::RawRoute {
                RawPerRoute::Word(if on { "enabled" } else { "disabled" }.into())
            }
        }
    };
}

/// The filters, one line each: `Variant(module::Settings)`, the module named as the filter
/// is in the file, in the order `/config_dump` shows a route's settings.
macro_rules! http_filters {
    ($($(#[$doc:meta])* $variant:ident($module:ident::$settings:ident)),* $(,)?) => {
        $(pub mod $module;)*
        $(pub use $module::*;)*

        /// One filter of a listener's chain. Requests meet the filters in the order written;
        /// responses pass back through them in reverse.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum HttpFilterConfig {
            $($(#[$doc])* $variant($module::$settings),)*
        }

        impl HttpFilterConfig {
            /// The filter's name, as the config writes it (`http_filters` and a route's
            /// `filters`).
            pub fn name(&self) -> &'static str {
                match self {
                    $(HttpFilterConfig::$variant(_) => stringify!($module),)*
                }
            }

            /// Writes the settings into `map` under `key` (the filter's name in the chain).
            fn serialize_entry<M: SerializeMap>(&self, map: &mut M, key: &str) -> Result<(), M::Error> {
                match self {
                    $(HttpFilterConfig::$variant(settings) => map.serialize_entry(key, settings),)*
                }
            }
        }

        /// One entry of `http_filters`: `- NAME: { settings }`.
        #[derive(Debug, Clone)]
        pub enum RawHttpFilter {
            $($variant(<$module::$settings as FilterSettings>::Raw),)*
        }

        /// The filters `http_filters` knows, by name.
        const FILTER_NAMES: &[&str] = &[$(stringify!($module)),*];

        impl RawHttpFilter {
            pub fn name(&self) -> &'static str {
                match self {
                    $(RawHttpFilter::$variant(_) => stringify!($module),)*
                }
            }

            /// The settings of the filter called `name`.
            fn parse<E: serde::de::Error>(name: &str, settings: serde_yaml::Value) -> Result<Self, E> {
                $(if name == stringify!($module) {
                    return parse_settings(name, settings).map(RawHttpFilter::$variant);
                })*
                Err(E::custom(format!(
                    "unknown filter `{name}`; known: {}",
                    FILTER_NAMES.join(", ")
                )))
            }

            fn check(self, path: &str, chain: &ChainCtx<'_>) -> Result<HttpFilterConfig, ConfigError> {
                match self {
                    $(RawHttpFilter::$variant(raw) => {
                        <$module::$settings as FilterSettings>::check(raw, path, chain)
                            .map(HttpFilterConfig::$variant)
                    })*
                }
            }
        }

        /// A route's `filters:`, by filter name: `TYPE` for the chain's filter of that type,
        /// `TYPE/INSTANCE` for one of several.
        #[derive(Debug, Clone, Default)]
        pub struct RawRouteFilters {
            $(pub $module: Option<<$module::$settings as FilterSettings>::RawRoute>,)*
            /// The entries for named filters (`TYPE/INSTANCE`), each setting its type's field
            /// only.
            pub instances: BTreeMap<String, RawRouteFilters>,
        }

        /// The entries of a route's `filters:` named by type alone.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawFiltersByType {
            $(#[serde(default)] $module: Option<<$module::$settings as FilterSettings>::RawRoute>,)*
        }

        impl RawFiltersByType {
            fn into_filters(self) -> RawRouteFilters {
                RawRouteFilters {
                    $($module: self.$module,)*
                    instances: BTreeMap::new(),
                }
            }
        }

        impl RawRouteFilters {
            /// Drops the entries of filters not in `chain` (their names): Envoy ignores a
            /// route's settings for a filter its listener does not have.
            pub(crate) fn retain(&mut self, chain: &[&str]) {
                $(if !chain.contains(&stringify!($module)) {
                    self.$module = None;
                })*
                self.instances.retain(|name, _| chain.contains(&name.as_str()));
            }

            pub(crate) fn is_empty(&self) -> bool {
                true $(&& self.$module.is_none())* && self.instances.is_empty()
            }

            /// Whether every entry is for a filter in `chain`: [`Self::retain`] would
            /// drop none.
            pub(crate) fn only_of(&self, chain: &[&str]) -> bool {
                true $(&& (self.$module.is_none() || chain.contains(&stringify!($module))))*
                    && self.instances.keys().all(|name| chain.contains(&name.as_str()))
            }

            /// Turns the filter called `name` off here unless this level says something
            /// about it: a filter its listener has off by default.
            pub(crate) fn off_unless_set(&mut self, name: &str) {
                let (kind, filters) = self.entry_mut(name);
                $(if kind == stringify!($module) && filters.$module.is_none() {
                    filters.$module = Some(<$module::$settings as FilterSettings>::route_switch(false));
                })*
            }

            /// Turns the filter called `name` on here (with its listener's settings) or off.
            pub(crate) fn switch(&mut self, name: &str, on: bool) {
                let (kind, filters) = self.entry_mut(name);
                $(if kind == stringify!($module) {
                    filters.$module = Some(<$module::$settings as FilterSettings>::route_switch(on));
                })*
            }
        }

        /// A route's settings for its listener's filters: by default each filter applies as
        /// the listener configures it.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct RouteFilters {
            $(pub $module: <$module::$settings as FilterSettings>::Route,)*
            /// The settings for named filters (`TYPE/INSTANCE`), each in its type's field.
            pub instances: BTreeMap<String, RouteFilters>,
        }

        impl RouteFilters {
            /// Writes the entries that say something into `map`, under `key` where this is a
            /// named filter's.
            fn serialize_entries<M: SerializeMap>(&self, map: &mut M, key: Option<&str>) -> Result<(), M::Error> {
                $(if !is_default(&self.$module) {
                    map.serialize_entry(key.unwrap_or(stringify!($module)), &self.$module)?;
                })*
                for (name, filters) in &self.instances {
                    filters.serialize_entries(map, Some(name))?;
                }
                Ok(())
            }
        }

        /// A route's or virtual host's `filters:`, each named filter in the listener's chain;
        /// `instance`: the name of the one filter these are for.
        fn check_route_filters(
            raw: RawRouteFilters,
            path: &str,
            chain: &[ChainFilter],
            instance: Option<&str>,
        ) -> Result<RouteFilters, ConfigError> {
            $(in_chain(instance.unwrap_or(stringify!($module)), raw.$module.is_some(), path, chain)?;)*
            let mut instances = BTreeMap::new();
            for (name, raw) in raw.instances {
                instances.insert(name.clone(), check_route_filters(raw, path, chain, Some(&name))?);
            }
            Ok(RouteFilters {
                $($module: match raw.$module {
                    None => Default::default(),
                    Some(raw) => <$module::$settings as FilterSettings>::check_route(
                        raw,
                        &format!("{path}.{}", instance.unwrap_or(stringify!($module))),
                    )?,
                },)*
                instances,
            })
        }
    };
}

http_filters! {
    /// Ask an authorization service (Envoy's `ext_authz`).
    ExtAuthz(ext_authz::ExtAuthzConfig),
    /// A token bucket per listener, route or key (Envoy's `local_ratelimit`).
    LocalRateLimit(local_rate_limit::LocalRateLimitConfig),
    /// A request's whole body read before it goes upstream, up to a size (Envoy's `buffer`).
    Buffer(buffer::BufferConfig),
    /// Add, set and remove request and response headers.
    Headers(headers::HeaderRulesConfig),
    /// The same changes at a place of their own in the chain (Envoy's `header_mutation`).
    HeaderMutation(header_mutation::HeaderMutationConfig),
    /// gzip, brotli or zstd for responses the client accepts them for.
    Compression(compression::CompressionConfig),
    /// Cross-origin resource sharing: preflights answered, response headers added.
    Cors(cors::CorsConfig),
    /// State-changing requests from another origin refused (Envoy's `csrf`).
    Csrf(csrf::CsrfConfig),
    /// gRPC-Web requests as gRPC upstream, and the responses back (Envoy's `grpc_web`).
    GrpcWeb(grpc_web::GrpcWebConfig),
    /// Delays and aborts injected into a share of requests (Envoy's `fault`).
    Fault(fault::FaultConfig),
    /// A load balancer's probes of this proxy, answered here (Envoy's `health_check`).
    HealthCheck(health_check::ProbeConfig),
    /// Responses picked by status or header get a new status, body or headers (Envoy's
    /// `custom_response`).
    CustomResponse(custom_response::CustomResponseConfig),
    /// Requests allowed or denied by who sends them and what they ask (Envoy's `rbac`).
    Rbac(rbac::RbacConfig),
    /// JSON Web Tokens verified against providers' key sets (Envoy's `jwt_authn`).
    JwtAuthn(jwt_authn::JwtAuthnConfig),
    /// A user and password of an htpasswd list (Envoy's `basic_auth`).
    BasicAuth(basic_auth::BasicAuthConfig),
    /// An API key one of the listed clients has (Envoy's `api_key_auth`).
    ApiKeyAuth(api_key_auth::ApiKeyAuthConfig),
    /// Limits kept by a rate limit service for the whole fleet (Envoy's `ratelimit`).
    GlobalRateLimit(global_rate_limit::GlobalRateLimitConfig),
    /// An external processor sent the request's and response's headers and bodies, which it
    /// may change or answer (Envoy's `ext_proc`).
    ExtProc(ext_proc::ExtProcConfig),
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// One filter of a listener's chain and the name routes know it by.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainFilter {
    /// Its type (`ext_authz`), or `TYPE/INSTANCE` where a chain has several of a type (one
    /// authorization service per policy, say). Routes' `filters:` name it so.
    pub name: String,
    pub config: HttpFilterConfig,
}

impl Serialize for ChainFilter {
    /// As written: `NAME: { settings }`.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        self.config.serialize_entry(&mut map, &self.name)?;
        map.end()
    }
}

/// One entry of `http_filters` as written: `- TYPE: { settings }` or `- TYPE/INSTANCE: ...`.
#[derive(Debug, Clone)]
pub struct RawChainFilter {
    pub name: String,
    pub filter: RawHttpFilter,
}

impl From<RawHttpFilter> for RawChainFilter {
    /// The chain's one filter of its type.
    fn from(filter: RawHttpFilter) -> Self {
        Self {
            name: filter.name().to_owned(),
            filter,
        }
    }
}

/// A filter name's type and, for `TYPE/INSTANCE`, whether the instance is named.
fn split_name(name: &str) -> (&str, Option<&str>) {
    match name.split_once('/') {
        Some((kind, instance)) => (kind, Some(instance)),
        None => (name, None),
    }
}

impl RawRouteFilters {
    /// The entries the filter called `name` is set in, and its type: these, or its
    /// instance's.
    fn entry_mut<'a>(&mut self, name: &'a str) -> (&'a str, &mut RawRouteFilters) {
        match split_name(name) {
            (kind, None) => (kind, self),
            (kind, Some(_)) => (kind, self.instances.entry(name.to_owned()).or_default()),
        }
    }

    /// The entries for the filter called `name` (`TYPE` or `TYPE/INSTANCE`), if any.
    pub(crate) fn of_filter(&self, name: &str) -> Option<&RawRouteFilters> {
        match split_name(name) {
            (_, None) => Some(self),
            (_, Some(_)) => self.instances.get(name),
        }
    }

    /// The entries for the filter called `name` (`TYPE` or `TYPE/INSTANCE`), to set its
    /// type's field in.
    pub(crate) fn for_filter(&mut self, name: &str) -> &mut RawRouteFilters {
        self.entry_mut(name).1
    }
}

impl<'de> Deserialize<'de> for RawRouteFilters {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = serde_yaml::Mapping::deserialize(d)?;
        let mut by_type = serde_yaml::Mapping::new();
        let mut instances = BTreeMap::new();
        for (key, value) in map {
            let serde_yaml::Value::String(name) = key else {
                return Err(D::Error::custom("expected filter names as keys"));
            };
            match split_name(&name) {
                (_, None) => {
                    by_type.insert(serde_yaml::Value::String(name), value);
                }
                (_, Some("")) => {
                    return Err(D::Error::custom(format!(
                        "`{name}`: expected TYPE/INSTANCE with an instance name"
                    )));
                }
                (kind, Some(_)) => {
                    let mut one = serde_yaml::Mapping::new();
                    one.insert(serde_yaml::Value::String(kind.to_owned()), value);
                    let filters = serde_yaml::from_value::<RawFiltersByType>(one.into())
                        .map_err(|e| D::Error::custom(format!("{name}: {e}")))?;
                    instances.insert(name, filters.into_filters());
                }
            }
        }
        let mut filters = serde_yaml::from_value::<RawFiltersByType>(by_type.into())
            .map_err(D::Error::custom)?
            .into_filters();
        filters.instances = instances;
        Ok(filters)
    }
}

impl Serialize for RouteFilters {
    /// As written: an entry per filter the level says something about.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        self.serialize_entries(&mut map, None)?;
        map.end()
    }
}

impl RouteFilters {
    /// What this level says about the chain's filter called `name` (`TYPE/INSTANCE` or
    /// `TYPE`), in its type's field.
    pub fn of_filter(&self, name: &str) -> &RouteFilters {
        static NOTHING: LazyLock<RouteFilters> = LazyLock::new(RouteFilters::default);
        match split_name(name) {
            (_, None) => self,
            (_, Some(_)) => self.instances.get(name).unwrap_or(&NOTHING),
        }
    }
}

impl RouteFilters {
    /// [`RouteFilters::of_filter`], to set: a named filter's entry is made if need be.
    pub(crate) fn of_filter_mut(&mut self, name: &str) -> &mut RouteFilters {
        match split_name(name) {
            (_, None) => self,
            (_, Some(_)) => self.instances.entry(name.to_owned()).or_default(),
        }
    }

    /// Drops the named filters' entries that say nothing (a table may hold 100,000 routes).
    pub(crate) fn drop_empty_instances(&mut self) {
        self.instances.retain(|_, f| !f.is_default());
    }
}

fn in_chain(name: &str, given: bool, path: &str, chain: &[ChainFilter]) -> Result<(), ConfigError> {
    if given && !chain.iter().any(|f| f.name == name) {
        return Err(ConfigError::invalid(
            format!("{path}.{name}"),
            format!("the listener has no `{name}` filter in its http_filters"),
        ));
    }
    // Envoy gives a route's entry to every filter of the name; here each has its own.
    let repeated = format!("{name}{REPEATED}");
    if given && chain.iter().any(|f| f.name.starts_with(&repeated)) {
        return Err(ConfigError::invalid(
            format!("{path}.{name}"),
            format!(
                "the listener has several filters named `{name}` (a control plane's chain): name them apart to set them on routes"
            ),
        ));
    }
    Ok(())
}

/// The instance part of the name of a filter whose name an xDS chain repeats: its
/// `NAME/#N` here (the second is `#2`).
pub(crate) const REPEATED: &str = "/#";

fn parse_settings<T: DeserializeOwned, E: serde::de::Error>(
    name: &str,
    settings: serde_yaml::Value,
) -> Result<T, E> {
    serde_yaml::from_value(settings).map_err(|e| E::custom(format!("{name}: {e}")))
}

impl RouteFilters {
    pub(crate) fn is_default(&self) -> bool {
        *self == RouteFilters::default()
    }
}

/// How a route changes one of its listener's filters.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum PerRoute<T> {
    /// As the listener configures it.
    #[default]
    Inherit,
    /// Off for this route.
    Disabled,
    /// On for this route with the listener's settings, where a virtual host (or the
    /// listener's xDS chain) turns the filter off.
    Enabled,
    /// These settings instead of the listener's (for `headers`: in addition to them). Boxed:
    /// most routes inherit, and a table may hold 100,000 routes.
    Override(Box<T>),
}

impl<T: Serialize> Serialize for PerRoute<T> {
    /// As written: `disabled`, `enabled`, or the route's settings.
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PerRoute::Inherit => s.serialize_none(),
            PerRoute::Disabled => s.serialize_str("disabled"),
            PerRoute::Enabled => s.serialize_str("enabled"),
            PerRoute::Override(settings) => settings.serialize(s),
        }
    }
}

/// `disabled`, or settings for the route.
#[derive(Debug, Clone)]
pub enum RawPerRoute<T> {
    Word(String),
    Settings(T),
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for RawPerRoute<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Read as a value first, so that settings get their own precise error rather than
        // "did not match any variant".
        match serde_yaml::Value::deserialize(d)? {
            serde_yaml::Value::String(word) => Ok(RawPerRoute::Word(word)),
            value => serde_yaml::from_value(value)
                .map(RawPerRoute::Settings)
                .map_err(serde::de::Error::custom),
        }
    }
}

impl<'de> Deserialize<'de> for RawChainFilter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = serde_yaml::Mapping::deserialize(d)?;
        let mut entries = map.into_iter();
        let (Some((serde_yaml::Value::String(name), settings)), None) =
            (entries.next(), entries.next())
        else {
            return Err(D::Error::custom(format!(
                "expected one filter per item, written `- NAME: {{ settings }}` with NAME one of {}",
                FILTER_NAMES.join(", ")
            )));
        };
        // A bare `- compression:` means the defaults.
        let settings = match settings {
            serde_yaml::Value::Null => serde_yaml::Value::Mapping(Default::default()),
            other => other,
        };
        let filter = match split_name(&name) {
            (_, Some("")) => {
                return Err(D::Error::custom(format!(
                    "`{name}`: expected TYPE/INSTANCE with an instance name"
                )));
            }
            (kind, _) => RawHttpFilter::parse(kind, settings)?,
        };
        Ok(RawChainFilter { name, filter })
    }
}

/// A listener's `http_filters`, checked: each name at most once (a type once unless its
/// filters are named `TYPE/INSTANCE`).
pub(crate) fn http_filters(
    raw: Vec<RawChainFilter>,
    path: &str,
    buffer_limit: u32,
    cluster_index: &crate::cluster::ClusterIndex<'_>,
) -> Result<Vec<ChainFilter>, ConfigError> {
    let ctx = ChainCtx {
        buffer_limit,
        cluster_index,
    };
    let mut chain: Vec<ChainFilter> = Vec::with_capacity(raw.len());
    for (i, RawChainFilter { name, filter }) in raw.into_iter().enumerate() {
        let at = format!("{path}[{i}].{name}");
        // Routes name filters so.
        if chain.iter().any(|f| f.name == name) {
            return Err(ConfigError::invalid(
                at,
                format!(
                    "`{name}` is already in the chain; name each filter of a type as TYPE/INSTANCE"
                ),
            ));
        }
        let config = filter.check(&at, &ctx)?;
        chain.push(ChainFilter { name, config });
    }
    Ok(chain)
}

/// A route's or virtual host's `filters:`, checked against the listener's chain.
pub(crate) fn route_filters(
    raw: Option<Box<RawRouteFilters>>,
    path: &(impl std::fmt::Display + ?Sized),
    chain: &[ChainFilter],
) -> Result<RouteFilters, ConfigError> {
    match raw {
        None => Ok(RouteFilters::default()),
        Some(raw) => check_route_filters(*raw, &path.to_string(), chain, None),
    }
}

/// A route's entry for a filter whose route settings are `disabled` or its own settings.
pub(crate) fn per_route<R, T>(
    raw: RawPerRoute<R>,
    path: &str,
    settings: impl FnOnce(R, &str) -> Result<T, ConfigError>,
) -> Result<PerRoute<T>, ConfigError> {
    match raw {
        RawPerRoute::Word(word) if word == "disabled" => Ok(PerRoute::Disabled),
        RawPerRoute::Word(word) if word == "enabled" => Ok(PerRoute::Enabled),
        RawPerRoute::Word(other) => Err(ConfigError::invalid(
            path,
            format!("expected `disabled`, `enabled` or the route's settings, found `{other}`"),
        )),
        RawPerRoute::Settings(raw) => settings(raw, path).map(|s| PerRoute::Override(Box::new(s))),
    }
}
