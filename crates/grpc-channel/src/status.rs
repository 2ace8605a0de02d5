//! A call's outcome as gRPC states it: `grpc-status` and `grpc-message` in the answer's head
//! or trailers, or an HTTP status that is not 200.

use http::{HeaderMap, HeaderName, StatusCode};

use crate::ChannelError;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");

pub(crate) fn status(code: tonic::Code, message: impl Into<String>) -> ChannelError {
    ChannelError::Status {
        code,
        message: message.into(),
    }
}

/// `grpc-status` (and `grpc-message`) of a head or trailers: `None` if absent.
pub fn grpc_status(fields: &HeaderMap) -> Option<Result<(), ChannelError>> {
    let value = fields.get(&GRPC_STATUS)?;
    let code = value
        .to_str()
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Unknown, tonic::Code::from_i32);
    if code == tonic::Code::Ok {
        return Some(Ok(()));
    }
    let message = fields
        .get(&GRPC_MESSAGE)
        // Percent-encoded UTF-8.
        .map(|m| {
            percent_encoding::percent_decode(m.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Some(Err(status(code, message)))
}

/// The gRPC status of an answer that is not HTTP 200, as gRPC's HTTP mapping gives it.
pub fn code_of_http_status(status: StatusCode) -> tonic::Code {
    match status.as_u16() {
        400 => tonic::Code::Internal,
        401 => tonic::Code::Unauthenticated,
        403 => tonic::Code::PermissionDenied,
        404 => tonic::Code::Unimplemented,
        429 | 502..=504 => tonic::Code::Unavailable,
        _ => tonic::Code::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn grpc_status_and_message_are_read_from_the_fields() {
        let mut fields = HeaderMap::new();
        assert!(grpc_status(&fields).is_none());
        fields.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(matches!(grpc_status(&fields), Some(Ok(()))));
        fields.insert("grpc-status", HeaderValue::from_static("14"));
        fields.insert(
            "grpc-message",
            HeaderValue::from_static("down%20for%3A now%2"),
        );
        let Some(Err(ChannelError::Status { code, message })) = grpc_status(&fields) else {
            panic!("a failed status");
        };
        assert_eq!(code, tonic::Code::Unavailable);
        assert_eq!(message, "down for: now%2");
        fields.insert("grpc-status", HeaderValue::from_static("nine"));
        assert!(matches!(
            grpc_status(&fields),
            Some(Err(ChannelError::Status {
                code: tonic::Code::Unknown,
                ..
            }))
        ));
        assert_eq!(
            code_of_http_status(StatusCode::SERVICE_UNAVAILABLE),
            tonic::Code::Unavailable
        );
        assert_eq!(
            code_of_http_status(StatusCode::IM_A_TEAPOT),
            tonic::Code::Unknown
        );
    }
}
