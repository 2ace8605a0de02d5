//! What a filter leaves on a request for the filters after it (Envoy's dynamic metadata):
//! kept in the request's extensions, so a request that no filter marks carries nothing.

use serde_json::{Map, Value};

/// The `jwt_authn` filter's namespace: each verified token's payload under its provider's
/// `payload_in_metadata` key.
#[derive(Clone, Default)]
pub(crate) struct JwtMetadata(Map<String, Value>);

impl JwtMetadata {
    /// The namespace of `req`, if a filter wrote it.
    pub(crate) fn of<B>(req: &http::Request<B>) -> Option<&Map<String, Value>> {
        req.extensions().get::<JwtMetadata>().map(|m| &m.0)
    }

    /// Sets `key` in the namespace of `req`.
    pub(crate) fn set<B>(req: &mut http::Request<B>, key: &str, value: Value) {
        let extensions = req.extensions_mut();
        match extensions.get_mut::<JwtMetadata>() {
            Some(namespace) => {
                namespace.0.insert(key.to_owned(), value);
            }
            None => {
                extensions.insert(JwtMetadata(Map::from_iter([(key.to_owned(), value)])));
            }
        }
    }
}
