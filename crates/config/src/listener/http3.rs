//! HTTP/3 beside a TLS listener: QUIC on the UDP port of the same number, with the listener's
//! certificates, routes and filters, and `alt-svc` on its TCP responses so clients find it.
//! With `quic_only: true` the listener serves QUIC alone (Envoy's UDP listener): no TCP
//! socket, and its filter chains picked by SNI once the handshake has shown it.
//!
//! ```yaml
//! listeners:
//!   - name: edge
//!     address: 0.0.0.0:443
//!     tls: { certificates: [...] }
//!     http3: { alt_svc_max_age: 24h }
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::ConfigError;
use crate::units::de_opt_duration;

/// How long clients may remember the `alt-svc` advertisement unless configured (a day, as
/// the RFC 7838 default).
pub const DEFAULT_ALT_SVC_MAX_AGE: Duration = Duration::from_secs(86_400);

/// A listener's HTTP/3.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Http3Config {
    /// `alt-svc: h3=":PORT"; ma=SECONDS` on the listener's TCP responses; `None`
    /// (`alt_svc_max_age: 0s`): not advertised (clients learn of it some other way, such as
    /// DNS HTTPS records).
    #[serde(serialize_with = "crate::serialize::opt_duration")]
    pub alt_svc_max_age: Option<Duration>,
    /// Only QUIC: the listener has no TCP socket (Envoy's UDP listener, which a control plane
    /// sends beside the TCP one on the same port).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub quic_only: bool,
    /// Streams a connection may have open at once; `None`: the listener's
    /// `http.max_concurrent_streams`, as HTTP/2's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<u32>,
    /// How long a QUIC connection may be silent before it is closed; `None`: the listener's
    /// `http.idle_timeout`.
    #[serde(
        serialize_with = "crate::serialize::opt_duration",
        skip_serializing_if = "Option::is_none"
    )]
    pub idle_timeout: Option<Duration>,
    /// 0-RTT: a client resuming a session may send its first requests with its first packet.
    /// Anyone who saw those packets could send them again. QUIC's sessions are then resumed
    /// from the session cache, each once, so a copy resumes nothing; and only safe methods
    /// (`GET`, `HEAD`, `OPTIONS`, `TRACE`) are served before the handshake ends, with
    /// `early-data: 1` for the upstream (RFC 8470), any other getting 425 Too Early, which the
    /// client sends again once the handshake is done. Off unless set.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub early_data: bool,
}

/// The file's form.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp3 {
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub alt_svc_max_age: Option<Duration>,
    pub quic_only: Option<bool>,
    pub max_concurrent_streams: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub idle_timeout: Option<Duration>,
    pub early_data: Option<bool>,
}

/// What the listener around it must have, checked with it.
pub(crate) struct Around {
    pub(crate) tls: bool,
    pub(crate) tcp_proxy: bool,
    pub(crate) proxy_protocol: bool,
    pub(crate) filter_chains: bool,
    /// `connection_balance: exact`.
    pub(crate) exact_balance: bool,
    /// The listener's own settings serve connections (no chains, or as the default chain).
    pub(crate) default_chain: bool,
}

pub(crate) fn check(
    raw: RawHttp3,
    around: &Around,
    path: &str,
) -> Result<Http3Config, ConfigError> {
    let refuse = |why: &str| Err(ConfigError::invalid(path.to_string(), why.to_string()));
    let quic_only = raw.quic_only.unwrap_or(false);
    // A QUIC-only listener's chains each bring their TLS (checked with each chain).
    // A QUIC-only listener's chains each bring their TLS (checked with each chain); its own
    // settings, where they serve connections no chain fits, need theirs.
    let tls_somewhere = around.tls || (quic_only && around.filter_chains && !around.default_chain);
    if !tls_somewhere {
        return refuse("QUIC is encrypted with TLS 1.3: the listener needs `tls`");
    }
    if around.tcp_proxy {
        return refuse("serves HTTP: not on a `tcp_proxy` listener");
    }
    if around.proxy_protocol {
        return refuse(
            "no PROXY protocol header comes before QUIC packets: not with `proxy_protocol`",
        );
    }
    if around.filter_chains && !quic_only {
        return refuse(
            "not beside TCP on a listener with `chains` (give HTTP/3 a listener of its own, \
             `quic_only: true`, on the same address)",
        );
    }
    if quic_only && raw.alt_svc_max_age.is_some() {
        return refuse(
            "`alt_svc_max_age` is advertised on TCP responses: a `quic_only` listener has none",
        );
    }
    if quic_only && around.exact_balance {
        return refuse(
            "`connection_balance: exact` balances TCP connections: not with `quic_only`",
        );
    }
    if raw.max_concurrent_streams == Some(0) {
        return refuse("`max_concurrent_streams: 0` would serve no request");
    }
    let alt_svc_max_age = if quic_only {
        None
    } else {
        Some(raw.alt_svc_max_age.unwrap_or(DEFAULT_ALT_SVC_MAX_AGE)).filter(|age| !age.is_zero())
    };
    Ok(Http3Config {
        alt_svc_max_age,
        quic_only,
        max_concurrent_streams: raw.max_concurrent_streams,
        idle_timeout: raw.idle_timeout.filter(|t| !t.is_zero()),
        early_data: raw.early_data.unwrap_or(false),
    })
}

/// 0-RTT resumes a session held in the session cache (not a stateless ticket, which could
/// be used again), and comes before the client could show a certificate: with `early_data`,
/// every TLS server of the listener (its own, its chains') must keep sessions and ask for no
/// client certificate.
pub(crate) fn early_data_possible(
    own: Option<&crate::ListenerTlsConfig>,
    chains: &[crate::listener::chains::FilterChainConfig],
    path: &str,
) -> Result<(), ConfigError> {
    let all = own
        .map(|tls| (tls, format!("{path}.tls")))
        .into_iter()
        .chain(chains.iter().enumerate().filter_map(|(i, c)| {
            let tls = c.settings.tls.as_ref()?;
            Some((tls, format!("{path}.chains[{i}].tls")))
        }));
    for (tls, at) in all {
        if tls.client_certificate.is_some() {
            return Err(ConfigError::invalid(
                format!("{path}.http3.early_data"),
                format!(
                    "0-RTT requests come before the client shows its certificate: not with \
                     `{at}.client_certificate`"
                ),
            ));
        }
        if tls.session_cache_size == 0 {
            return Err(ConfigError::invalid(
                format!("{path}.http3.early_data"),
                format!(
                    "0-RTT resumes only sessions held in the session cache (each once, so a \
                     first flight sent again resumes nothing), and `{at}` has none \
                     (`session_cache_size: 0`)"
                ),
            ));
        }
    }
    Ok(())
}

/// A QUIC-only listener's chains share one TLS server: only its certificate is picked per
/// chain (by SNI), and everything else of it (the client-certificate check, resumption, the
/// handshake's time) is settled before any chain is known (the version is TLS 1.3 always). It must be the
/// same in every chain.
pub(crate) fn same_tls_server(
    own: Option<&crate::ListenerTlsConfig>,
    chains: &[crate::listener::chains::FilterChainConfig],
    path: &str,
) -> Result<(), ConfigError> {
    let shared = |tls: &crate::ListenerTlsConfig| {
        (
            tls.client_certificate.clone(),
            tls.session_tickets,
            tls.session_cache_size,
            tls.handshake_timeout,
        )
    };
    let mut all = own
        .map(|tls| (shared(tls), format!("{path}.tls")))
        .into_iter()
        .chain(chains.iter().enumerate().filter_map(|(i, c)| {
            let tls = c.settings.tls.as_ref()?;
            Some((shared(tls), format!("{path}.chains[{i}].tls")))
        }));
    let Some((first, _)) = all.next() else {
        return Ok(());
    };
    match all.find(|(tls, _)| tls != &first) {
        None => Ok(()),
        Some((_, at)) => Err(ConfigError::invalid(
            at,
            "a QUIC listener's chains share one TLS server, whose settings come before any \
             chain is known: `client_certificate`, `session_tickets`, `session_cache_size` \
             and `handshake_timeout` must be the same in every chain",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn around() -> Around {
        Around {
            tls: true,
            tcp_proxy: false,
            proxy_protocol: false,
            filter_chains: false,
            exact_balance: false,
            default_chain: true,
        }
    }

    #[test]
    fn advertised_for_a_day_unless_configured() {
        let config = check(RawHttp3::default(), &around(), "l.http3").unwrap();
        assert_eq!(config.alt_svc_max_age, Some(DEFAULT_ALT_SVC_MAX_AGE));
        let off = RawHttp3 {
            alt_svc_max_age: Some(Duration::ZERO),
            ..RawHttp3::default()
        };
        assert_eq!(
            check(off, &around(), "l.http3").unwrap().alt_svc_max_age,
            None
        );
    }

    #[test]
    fn refused_where_quic_cannot_serve() {
        for (around, words) in [
            (
                Around {
                    tls: false,
                    ..around()
                },
                "needs `tls`",
            ),
            (
                Around {
                    tcp_proxy: true,
                    ..around()
                },
                "tcp_proxy",
            ),
            (
                Around {
                    proxy_protocol: true,
                    ..around()
                },
                "proxy_protocol",
            ),
            (
                Around {
                    filter_chains: true,
                    ..around()
                },
                "chains",
            ),
        ] {
            let err = check(RawHttp3::default(), &around, "l.http3").unwrap_err();
            assert!(err.to_string().contains(words), "{err}");
            assert!(err.to_string().contains("l.http3"), "{err}");
        }
    }

    #[test]
    fn quic_only_takes_chains_and_advertises_nothing() {
        let only = || RawHttp3 {
            quic_only: Some(true),
            ..RawHttp3::default()
        };
        let chains = Around {
            tls: false,
            filter_chains: true,
            default_chain: false,
            ..around()
        };
        let config = check(only(), &chains, "l.http3").unwrap();
        assert!(config.quic_only);
        assert_eq!(config.alt_svc_max_age, None);
        let with_age = RawHttp3 {
            alt_svc_max_age: Some(Duration::from_secs(60)),
            ..only()
        };
        let err = check(with_age, &chains, "l.http3").unwrap_err();
        assert!(err.to_string().contains("alt_svc_max_age"), "{err}");
        let exact = Around {
            exact_balance: true,
            ..around()
        };
        let err = check(only(), &exact, "l.http3").unwrap_err();
        assert!(err.to_string().contains("exact"), "{err}");
        // Without chains, or where its own settings serve as the default chain, the
        // listener's own TLS is still needed.
        let bare = Around {
            tls: false,
            ..around()
        };
        assert!(check(only(), &bare, "l.http3").is_err());
        let default_chain = Around {
            default_chain: true,
            ..chains
        };
        assert!(check(only(), &default_chain, "l.http3").is_err());
    }
}
