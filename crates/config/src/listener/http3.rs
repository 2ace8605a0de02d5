//! HTTP/3 beside a TLS listener: QUIC on the UDP port of the same number, with the listener's
//! certificates, routes and filters, and `alt-svc` on its TCP responses so clients find it.
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
}

/// The file's form.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp3 {
    #[serde(default, deserialize_with = "de_opt_duration")]
    pub alt_svc_max_age: Option<Duration>,
}

/// What the listener around it must have, checked with it.
pub(crate) struct Around {
    pub(crate) tls: bool,
    pub(crate) tcp_proxy: bool,
    pub(crate) proxy_protocol: bool,
    pub(crate) filter_chains: bool,
}

pub(crate) fn check(
    raw: RawHttp3,
    around: &Around,
    path: &str,
) -> Result<Http3Config, ConfigError> {
    let refuse = |why: &str| Err(ConfigError::invalid(path.to_string(), why.to_string()));
    if !around.tls {
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
    if around.filter_chains {
        return refuse(
            "not on a listener with `chains` (HTTP/3 serves the listener's own settings)",
        );
    }
    Ok(Http3Config {
        alt_svc_max_age: Some(raw.alt_svc_max_age.unwrap_or(DEFAULT_ALT_SVC_MAX_AGE))
            .filter(|age| !age.is_zero()),
    })
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
        }
    }

    #[test]
    fn advertised_for_a_day_unless_configured() {
        let config = check(RawHttp3::default(), &around(), "l.http3").unwrap();
        assert_eq!(config.alt_svc_max_age, Some(DEFAULT_ALT_SVC_MAX_AGE));
        let off = RawHttp3 {
            alt_svc_max_age: Some(Duration::ZERO),
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
}
