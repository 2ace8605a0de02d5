//! The downstream HTTP side: bodies, header rules, local replies and the request handler.

pub(crate) mod body;
pub(crate) mod ext_authz;
pub(crate) mod handler;
pub(crate) mod headers;
pub(crate) mod local_reply;
pub(crate) mod retry;
