//! Envoy's `BasicAuth` (the `envoy.filters.http.basic_auth` filter) and `BasicAuthPerRoute` as
//! the `basic_auth` filter's settings: Envoy Gateway's one filter per security policy, off on
//! the listener and turned on by the routes' users.

use envoy_types::pb::envoy::config::core::v3::DataSource;
use envoy_types::pb::envoy::extensions::filters::http::basic_auth::v3::{
    BasicAuth, BasicAuthPerRoute,
};
use envoy_types::pb::google::protobuf::Any;

use super::RawBasicAuth;
use crate::envoy::{ResourceError, data_source, decode, unsupported};
use crate::filters::RawPerRoute;

pub(crate) const TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuth";
pub(crate) const PER_ROUTE: &str =
    "type.googleapis.com/envoy.extensions.filters.http.basic_auth.v3.BasicAuthPerRoute";

/// The listener's filter.
pub(crate) fn settings(any: &Any, at: &str) -> Result<RawBasicAuth, ResourceError> {
    let BasicAuth {
        users,
        forward_username_header,
        authentication_header,
        allow_missing,
        emit_dynamic_metadata,
    } = decode(any, TYPE_URL, "a BasicAuth")?;
    if emit_dynamic_metadata {
        return Err(unsupported(at, "emit_dynamic_metadata"));
    }
    let (users, users_file) = users_of(users, at)?;
    let text = |s: String| Some(s).filter(|s| !s.is_empty());
    Ok(RawBasicAuth {
        users,
        users_file,
        forward_username_header: text(forward_username_header),
        authentication_header: text(authentication_header),
        allow_missing: Some(allow_missing),
    })
}

/// A route's or virtual host's users, which replace the listener's (and turn the filter on
/// there, where the listener has it off).
pub(crate) fn per_route(any: &Any, at: &str) -> Result<RawPerRoute<RawBasicAuth>, ResourceError> {
    let BasicAuthPerRoute { users } = decode(any, PER_ROUTE, "a BasicAuthPerRoute")?;
    let (users, users_file) = users_of(users, at)?;
    Ok(RawPerRoute::Settings(RawBasicAuth {
        users,
        users_file,
        ..Default::default()
    }))
}

fn users_of(
    users: Option<DataSource>,
    at: &str,
) -> Result<(Option<String>, Option<String>), ResourceError> {
    let source = users.ok_or_else(|| ResourceError::invalid(at, "expected users"))?;
    data_source(source, &format!("{at}.users"), "htpasswd lines")
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;

    use super::*;

    fn users(text: &str) -> Option<DataSource> {
        Some(DataSource {
            specifier: Some(Specifier::InlineBytes(text.as_bytes().to_vec())),
            ..Default::default()
        })
    }

    #[test]
    fn envoy_gateways_filter_and_route_users_translate() {
        let filter = BasicAuth {
            users: users("foo:{SHA}Ys23Ag/5IOWqZCw9QGaVDdHwH00=\n"),
            forward_username_header: "x-user-id".into(),
            ..Default::default()
        };
        let raw = settings(&testbed::xds::any(&filter), "f").unwrap();
        assert_eq!(raw.users.as_deref(), Some("foo:{SHA}Ys23Ag/5IOWqZCw9QGaVDdHwH00=\n"));
        assert_eq!(raw.forward_username_header.as_deref(), Some("x-user-id"));
        assert_eq!(raw.authentication_header, None);
        let route = BasicAuthPerRoute {
            users: users("user1:{SHA}tESsBmE/yNY3lb6a0L6vVQEZNqw=\n"),
        };
        let RawPerRoute::Settings(own) = per_route(&testbed::xds::any(&route), "r").unwrap() else {
            panic!("settings");
        };
        assert!(own.users.unwrap().starts_with("user1:"));
        let metadata = BasicAuth {
            users: users("a:{SHA}Ys23Ag/5IOWqZCw9QGaVDdHwH00="),
            emit_dynamic_metadata: true,
            ..Default::default()
        };
        let refused = settings(&testbed::xds::any(&metadata), "f").unwrap_err().to_string();
        assert!(refused.contains("emit_dynamic_metadata"), "{refused}");
    }
}
