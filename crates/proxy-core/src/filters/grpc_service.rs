//! A worker's channel to a filter's gRPC service (the rate limit service, an external
//! processor): the one connection, the method's URI, and TLS read once per listener.

use std::sync::Arc;

use grpc_channel::{Channel, Tls, call_head};
use http::{Request, Uri};

use config::GrpcService;

/// One filter's service on one worker.
pub(crate) struct ServiceChannel {
    /// Shared with the task that connects, which outlives a call's timeout.
    channel: Arc<Channel>,
    uri: Uri,
}

impl ServiceChannel {
    /// Calls of `path` (`/package.Service/Method`) to `service`, whose `:authority` is
    /// `default_authority` unless it names one.
    pub(crate) fn new(
        service: &GrpcService,
        tls: Option<Tls>,
        default_authority: &str,
        path: &'static str,
    ) -> Self {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let uri = Uri::builder()
            .scheme(scheme)
            .authority(service.authority.as_deref().unwrap_or(default_authority))
            .path_and_query(path)
            .build()
            // The authority was checked at load; the default is a valid one.
            .unwrap_or_else(|_| Uri::from_static(path));
        let mut channel = Channel::new(service.address.clone());
        if let Some(tls) = tls {
            channel.set_tls(tls);
        }
        Self {
            channel: Arc::new(channel),
            uri,
        }
    }

    /// The head of a call.
    pub(crate) fn head(&self) -> Request<()> {
        call_head(self.uri.clone())
    }

    /// The connection, made on a task of its own when there is none: a call's timeout
    /// (Envoy's default is 20 ms for rate limits) may be shorter than a connect, which must
    /// not be cancelled with the call and tried again by the next one forever. The call then
    /// waits for it within its timeout.
    pub(crate) fn channel(&self) -> &Channel {
        if !self.channel.is_connected() {
            let channel = Arc::clone(&self.channel);
            tokio::spawn(async move { channel.connect().await });
        }
        &self.channel
    }
}

/// TLS to a filter's service, its files read once per listener and generation rather than
/// by each worker.
pub(crate) fn service_tls(service: &GrpcService, filter: &str) -> Option<Tls> {
    let spec = service.tls.as_ref()?;
    Some(crate::tls::grpc_service_tls(spec, &service.address, filter))
}
