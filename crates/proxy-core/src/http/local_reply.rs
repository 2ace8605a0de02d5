//! Responses the proxy writes itself: direct responses and error replies.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};

use super::ResponseBody;
use crate::filters::LocalReply;

/// A response with a plain-text body.
pub(crate) fn text(status: StatusCode, body: Bytes) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::local(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// A 307 to `location`: `escaped_slashes: unescape_and_redirect` sends the client to the path
/// with its escaped slashes unescaped.
pub(crate) fn redirect(location: HeaderValue) -> Response<ResponseBody> {
    let mut reply = text(StatusCode::TEMPORARY_REDIRECT, Bytes::new());
    reply.headers_mut().insert(http::header::LOCATION, location);
    reply
}

/// A filter's answer (a denial, a 429, a CORS preflight) as a response. Its own headers win
/// over the default content type, and an empty body gets none.
pub(crate) fn from_filter(reply: LocalReply) -> Response<ResponseBody> {
    let empty = reply.body.is_empty();
    let mut response = text(reply.status, reply.body);
    let headers = response.headers_mut();
    if empty || reply.headers.contains_key(CONTENT_TYPE) {
        headers.remove(CONTENT_TYPE);
    }
    for (name, value) in reply.headers.iter() {
        headers.append(name.clone(), value.clone());
    }
    response
}
