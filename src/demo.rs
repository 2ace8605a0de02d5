//! `legate demo`: a proxy on 127.0.0.1 in front of the testbed's no-op upstream and
//! authorization sidecar, started in this process: plain HTTP on one port, TLS and HTTP/3 on
//! another. Built with the `demo` feature (on by
//! default); the container image leaves it out, and the test servers with it.

use std::num::NonZeroUsize;

use anyhow::Context;
use proxy_core::{Config, StartOptions};

use crate::{Upgrade, run};

pub(crate) fn demo(
    port: u16,
    tls_port: u16,
    admin_port: u16,
    concurrency: Option<NonZeroUsize>,
) -> anyhow::Result<()> {
    let upstream = testbed::NoopUpstream::start_in_thread(([127, 0, 0, 1], 0).into())
        .context("cannot start the demo upstream")?;
    let upstream_addr = upstream.local_addr();
    // An authorization sidecar guarding /private: `authorization: Bearer demo` gets in.
    let sidecar = testbed::AuthzSidecar::start_in_thread(
        testbed::SidecarAddr::Tcp(([127, 0, 0, 1], 0).into()),
        testbed::SidecarMode::Grpc,
        testbed::AuthzRules {
            allow_if: Some(("authorization".into(), "Bearer demo".into())),
            deny_status: 401,
            deny_body: "say `authorization: Bearer demo`\n".into(),
            add_headers: vec![("x-authz-user".into(), "demo".into())],
            ..testbed::AuthzRules::default()
        },
    )
    .context("cannot start the demo authorization sidecar")?;
    let sidecar_addr = sidecar
        .local_addr()
        .context("the demo sidecar listens on TCP")?;
    // HTTP/2 and HTTP/3 over TLS on a certificate made now, for `localhost` and 127.0.0.1.
    let certified = rcgen::generate_simple_self_signed(["localhost".into(), "127.0.0.1".into()])
        .context("cannot make the demo's certificate")?;
    let indent = |pem: String| pem.replace('\n', "\n            ");
    let cert_pem = indent(certified.cert.pem());
    let key_pem = indent(certified.signing_key.serialize_pem());
    let yaml = format!(
        r#"
admin: {{ address: 127.0.0.1:{admin_port} }}
listeners:
  - name: demo
    address: 127.0.0.1:{port}
    http_filters:
      - ext_authz: {{ grpc: {{ address: {sidecar_addr} }}, timeout: 200ms }}
    routes:
      - match: {{ path: /healthz }}
        direct_response: {{ status: 200, body: "ok\n" }}
        filters: {{ ext_authz: disabled }}
      - match: {{ prefix: /private, case_sensitive: false }}
        cluster: noop
      - match: {{ prefix: / }}
        cluster: noop
        filters: {{ ext_authz: disabled }}
  - name: demo-tls
    address: 127.0.0.1:{tls_port}
    tls:
      certificates:
        - cert_chain: |
            {cert_pem}
          private_key: |
            {key_pem}
    http3: {{}}
    routes:
      - match: {{ prefix: / }}
        cluster: noop
clusters:
  - name: noop
    endpoints: [{upstream_addr}]
"#
    );
    let config = Config::from_yaml(&yaml).context("demo config")?;
    if port == 0 {
        // The system picks the port; the `listening` log line names it.
        println!(
            "legate demo: proxy on the address of the `listening` line below, in front of a no-op upstream on {upstream_addr}"
        );
        return run(
            config,
            concurrency,
            StartOptions::default(),
            Upgrade::default(),
        );
    }
    println!(
        "legate demo: proxy on http://127.0.0.1:{port} and https://127.0.0.1:{tls_port} (TCP and HTTP/3) in front of a no-op upstream on {upstream_addr}"
    );
    println!("try, in another terminal:");
    println!("  curl -i http://127.0.0.1:{port}/hello -H 'x-noop-echo: headers'");
    println!(
        "  curl -i --http2-prior-knowledge http://127.0.0.1:{port}/slow -H 'x-noop-delay: 200ms' -H 'x-noop-status: 503'"
    );
    println!(
        "  curl -i http://127.0.0.1:{port}/private -H 'authorization: Bearer demo' -H 'x-noop-echo: headers'   # ext_authz allows (401 without the header)"
    );
    println!(
        "  curl -ik https://localhost:{tls_port}/hello   # TLS (a certificate made at start), HTTP/2 by ALPN"
    );
    println!(
        "  curl -ik --http3-only https://localhost:{tls_port}/hello   # HTTP/3 on UDP {tls_port}, with a curl built with HTTP/3"
    );
    println!("stop with Ctrl-C");
    run(
        config,
        concurrency,
        StartOptions::default(),
        Upgrade::default(),
    )
}
