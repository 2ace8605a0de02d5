//! The decision a gRPC `CheckResponse` carries. (The `CheckRequest` is written by
//! `check_encoding`.)

use envoy_types::pb::envoy::config::core::v3::{
    HeaderValueOption, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::service::auth::v3::CheckResponse;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use http::{HeaderName, HeaderValue, StatusCode};

use crate::AuthzError;
use crate::decision::{Allowed, Decision, Denied, HeaderAction, HeaderMutation, is_protected};

/// An OK status allows (with the ok response's changes); any other denies with the denied
/// response's status (403 if none), headers and body; an error response is an error.
pub(crate) fn decision(response: CheckResponse) -> Result<Decision, AuthzError> {
    let code = response.status.as_ref().map_or(0, |s| s.code);
    match response.http_response {
        Some(HttpResponse::ErrorResponse(error)) => Err(AuthzError::ErrorResponse {
            status: status_or_forbidden(error.status.map(|s| s.code)),
        }),
        Some(HttpResponse::OkResponse(ok)) if code == 0 => Ok(Decision::Allow(Allowed {
            upstream_headers: mutations(&ok.headers, HeaderAction::Set),
            headers_to_remove: ok
                .headers_to_remove
                .iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .filter(|name| !is_protected(name))
                .collect(),
            response_headers: mutations(&ok.response_headers_to_add, HeaderAction::Append),
        })),
        _ if code == 0 => Ok(Decision::Allow(Allowed::default())),
        Some(HttpResponse::DeniedResponse(denied)) => Ok(Decision::Deny(Denied {
            status: status_or_forbidden(denied.status.map(|s| s.code)),
            headers: mutations(&denied.headers, HeaderAction::Set),
            body: denied.body.into(),
        })),
        _ => Ok(Decision::Deny(Denied {
            status: StatusCode::FORBIDDEN,
            headers: Vec::new(),
            body: bytes::Bytes::new(),
        })),
    }
}

fn status_or_forbidden(code: Option<i32>) -> StatusCode {
    code.and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|s| s.as_u16() >= 200)
        .unwrap_or(StatusCode::FORBIDDEN)
}

/// Header options as mutations. The deprecated `append` flag wins when given; otherwise the
/// action, where the proto's default (`APPEND_IF_EXISTS_OR_ADD`) means `default_action`:
/// Envoy documents ok-response headers as replacing by default.
#[allow(deprecated)]
fn mutations(options: &[HeaderValueOption], default_action: HeaderAction) -> Vec<HeaderMutation> {
    options
        .iter()
        .filter_map(|option| {
            let header = option.header.as_ref()?;
            let name = HeaderName::from_bytes(header.key.as_bytes())
                .ok()
                .filter(|name| !is_protected(name))?;
            let raw = if header.raw_value.is_empty() {
                header.value.as_bytes()
            } else {
                &header.raw_value
            };
            let value = HeaderValue::from_bytes(raw).ok()?;
            let action = match option.append.as_ref().map(|a| a.value) {
                Some(true) => HeaderAction::Append,
                Some(false) => HeaderAction::Set,
                None => match HeaderAppendAction::try_from(option.append_action) {
                    Ok(HeaderAppendAction::AddIfAbsent) => HeaderAction::AddIfAbsent,
                    Ok(HeaderAppendAction::OverwriteIfExistsOrAdd) => HeaderAction::Set,
                    Ok(HeaderAppendAction::OverwriteIfExists) => HeaderAction::OverwriteIfExists,
                    _ => default_action,
                },
            };
            Some(HeaderMutation {
                name,
                value,
                action,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::HeaderValue as PbHeader;
    use envoy_types::pb::envoy::service::auth::v3::{DeniedHttpResponse, OkHttpResponse};
    use envoy_types::pb::envoy::r#type::v3::HttpStatus;
    use envoy_types::pb::google::rpc::Status;

    fn option(key: &str, value: &str, action: HeaderAppendAction) -> HeaderValueOption {
        HeaderValueOption {
            header: Some(PbHeader {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        }
    }

    #[test]
    fn an_ok_answer_carries_its_header_changes() {
        let response = CheckResponse {
            status: Some(Status::default()),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers: vec![
                    option("x-user", "alice", HeaderAppendAction::AppendIfExistsOrAdd),
                    option("x-tag", "t", HeaderAppendAction::AddIfAbsent),
                    option("bad header", "x", HeaderAppendAction::AddIfAbsent),
                ],
                headers_to_remove: vec!["authorization".into()],
                response_headers_to_add: vec![option(
                    "x-auth",
                    "ok",
                    HeaderAppendAction::AppendIfExistsOrAdd,
                )],
                ..Default::default()
            })),
            ..Default::default()
        };
        let Ok(Decision::Allow(allowed)) = decision(response) else {
            panic!("expected an allow");
        };
        assert_eq!(
            allowed.upstream_headers.len(),
            2,
            "the invalid name is skipped"
        );
        assert_eq!(allowed.upstream_headers[0].action, HeaderAction::Set);
        assert_eq!(
            allowed.upstream_headers[1].action,
            HeaderAction::AddIfAbsent
        );
        assert_eq!(allowed.headers_to_remove, [http::header::AUTHORIZATION]);
        assert_eq!(allowed.response_headers[0].action, HeaderAction::Append);
    }

    #[test]
    fn a_denial_carries_status_headers_and_body_and_defaults_to_403() {
        let denied = CheckResponse {
            status: Some(Status {
                code: tonic::Code::PermissionDenied as i32,
                ..Default::default()
            }),
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                status: Some(HttpStatus { code: 401 }),
                headers: vec![option(
                    "www-authenticate",
                    "Bearer",
                    HeaderAppendAction::AppendIfExistsOrAdd,
                )],
                body: "who are you?".into(),
            })),
            ..Default::default()
        };
        let Ok(Decision::Deny(d)) = decision(denied) else {
            panic!("expected a denial");
        };
        assert_eq!(d.status, StatusCode::UNAUTHORIZED);
        assert_eq!(d.headers[0].name, "www-authenticate");
        assert_eq!(d.body, "who are you?");
        let bare = CheckResponse {
            status: Some(Status {
                code: tonic::Code::PermissionDenied as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(
            matches!(decision(bare), Ok(Decision::Deny(d)) if d.status == StatusCode::FORBIDDEN)
        );
        let error = CheckResponse {
            http_response: Some(HttpResponse::ErrorResponse(DeniedHttpResponse::default())),
            ..Default::default()
        };
        assert!(matches!(
            decision(error),
            Err(AuthzError::ErrorResponse { .. })
        ));
    }

    #[test]
    fn framing_and_hop_by_hop_headers_are_never_taken_from_the_service() {
        // A `content-length` beside a body of another length would desynchronise the client
        // (a denial) or the upstream (an allow).
        let framing = |name: &str| option(name, "5", HeaderAppendAction::OverwriteIfExistsOrAdd);
        let allow = CheckResponse {
            status: Some(Status::default()),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers: vec![framing("content-length"), framing("x-user")],
                headers_to_remove: vec!["transfer-encoding".into(), "x-gone".into()],
                response_headers_to_add: vec![framing("Transfer-Encoding"), framing("x-auth")],
                ..Default::default()
            })),
            ..Default::default()
        };
        let Ok(Decision::Allow(allowed)) = decision(allow) else {
            panic!("expected an allow");
        };
        assert_eq!(allowed.upstream_headers.len(), 1);
        assert_eq!(allowed.upstream_headers[0].name, "x-user");
        assert_eq!(allowed.headers_to_remove, ["x-gone"]);
        assert_eq!(allowed.response_headers.len(), 1);
        assert_eq!(allowed.response_headers[0].name, "x-auth");
        let deny = CheckResponse {
            status: Some(Status {
                code: tonic::Code::PermissionDenied as i32,
                ..Default::default()
            }),
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                headers: [
                    "content-length",
                    "connection",
                    "keep-alive",
                    "host",
                    "x-why",
                ]
                .into_iter()
                .map(framing)
                .collect(),
                body: "a body of another length".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let Ok(Decision::Deny(denied)) = decision(deny) else {
            panic!("expected a denial");
        };
        let names: Vec<_> = denied.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["x-why"]);
    }
}
