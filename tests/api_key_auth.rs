//! The `api_key_auth` filter on the real binary: keys from a header, a query parameter and a
//! cookie; the client's name sent upstream and the key hidden from every source; a route's
//! allowed clients (403), and a route's own keys and sources in place of the listener's.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;

use common::*;

fn config(upstream: SocketAddr) -> String {
    format!(
        r#"
admin: {{ address: 127.0.0.1:0 }}
listeners:
  - name: main
    address: 127.0.0.1:0
    http_filters:
      - api_key_auth:
          credentials:
            - {{ key: key-one, client: one }}
            - {{ key: key-two, client: two }}
          key_sources: [{{ header: x-api-key }}, {{ query: api_key }}, {{ cookie: key }}]
          forwarding: {{ header: x-client-id, hide_credentials: true }}
    routes:
      - match: {{ prefix: /only-two }}
        cluster: backend
        filters: {{ api_key_auth: {{ allowed_clients: [two] }} }}
      - match: {{ prefix: /own }}
        cluster: backend
        filters:
          api_key_auth:
            credentials: [{{ key: key-three, client: three }}]
            key_sources: [{{ header: x-other-key }}]
      - match: {{ prefix: /open }}
        cluster: backend
        filters: {{ api_key_auth: disabled }}
      - match: {{ prefix: / }}
        cluster: backend
clusters:
  - name: backend
    endpoints: [{upstream}]
"#
    )
}

/// Status and body of a GET whose upstream echoes the request line and headers.
async fn call(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut all = vec![("x-noop-echo", "headers")];
    all.extend_from_slice(headers);
    let response = send_h1(addr, get(path, &all)).await;
    let status = response.status().as_u16();
    (
        status,
        text(response.into_body()).await.to_ascii_lowercase(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_checked_forwarded_as_clients_and_hidden() {
    let upstream = testbed::NoopUpstream::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let proxy = Proxy::start(&config(upstream.local_addr()), 1);
    let admin = proxy.admin.unwrap();
    let addr = proxy.addr();

    // No key, a key not listed, an empty one: 401 with Envoy's text.
    for headers in [vec![], vec![("x-api-key", "nope")], vec![("x-api-key", "")]] {
        let (status, body) = call(addr, "/", &headers).await;
        assert_eq!(
            (status, body.as_str()),
            (401, "client authentication failed."),
            "{headers:?}"
        );
    }

    // From a header (after `Bearer `): the client's name goes upstream, over a forged one,
    // and the key does not.
    let (status, echoed) = call(
        addr,
        "/a",
        &[("x-api-key", "Bearer key-one"), ("x-client-id", "admin")],
    )
    .await;
    assert_eq!(status, 200, "{echoed}");
    assert!(echoed.contains("x-client-id: one"), "{echoed}");
    assert!(
        !echoed.contains("admin") && !echoed.contains("key-one"),
        "{echoed}"
    );

    // From a query parameter, removed from the path; from a cookie, removed from the cookies.
    let (status, echoed) = call(addr, "/b?x=1&api_key=key-two", &[]).await;
    assert_eq!(status, 200);
    assert!(echoed.starts_with("get /b?x=1 "), "{echoed}");
    assert!(echoed.contains("x-client-id: two"), "{echoed}");
    let (status, echoed) = call(addr, "/c", &[("cookie", "theme=dark; key=key-one")]).await;
    assert_eq!(status, 200);
    assert!(echoed.contains("cookie: theme=dark"), "{echoed}");
    assert!(!echoed.contains("key-one"), "{echoed}");

    // A route that lets one client on: the other's key is forbidden.
    let (status, body) = call(addr, "/only-two", &[("x-api-key", "key-one")]).await;
    assert_eq!((status, body.as_str()), (403, "client is forbidden."));
    assert_eq!(
        call(addr, "/only-two", &[("x-api-key", "key-two")]).await.0,
        200
    );

    // A route's own keys and sources replace the listener's; its forwarding is the listener's.
    assert_eq!(call(addr, "/own", &[("x-api-key", "key-one")]).await.0, 401);
    let (status, echoed) = call(addr, "/own", &[("x-other-key", "key-three")]).await;
    assert_eq!(status, 200);
    assert!(
        echoed.contains("x-client-id: three") && !echoed.contains("key-three"),
        "{echoed}"
    );

    // Off for a route.
    assert_eq!(call(addr, "/open", &[]).await.0, 200);

    assert_eq!(stat(admin, "http_api_key_auth_allowed"), 5);
    assert_eq!(stat(admin, "http_api_key_auth_unauthorized"), 4);
    assert_eq!(stat(admin, "http_api_key_auth_forbidden"), 1);
}
