//! `legate demo`: a proxy on 127.0.0.1 in front of the testbed's no-op upstream and
//! authorization sidecar, started in this process. Built with the `demo` feature (on by
//! default); the container image leaves it out, and the test servers with it.

use std::num::NonZeroUsize;

use anyhow::Context;
use proxy_core::{Config, StartOptions};

use crate::{Upgrade, run};

pub(crate) fn demo(
    port: u16,
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
        "legate demo: proxy on http://127.0.0.1:{port} in front of a no-op upstream on {upstream_addr}"
    );
    println!("try, in another terminal:");
    println!("  curl -i http://127.0.0.1:{port}/hello -H 'x-noop-echo: headers'");
    println!(
        "  curl -i --http2-prior-knowledge http://127.0.0.1:{port}/slow -H 'x-noop-delay: 200ms' -H 'x-noop-status: 503'"
    );
    println!(
        "  curl -i http://127.0.0.1:{port}/private -H 'authorization: Bearer demo' -H 'x-noop-echo: headers'   # ext_authz allows (401 without the header)"
    );
    println!("stop with Ctrl-C");
    run(
        config,
        concurrency,
        StartOptions::default(),
        Upgrade::default(),
    )
}
