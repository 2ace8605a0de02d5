//! Stopping a standalone test server the way scripts stop it.

/// SIGINT, and on Unix SIGTERM, registered up front.
pub struct StopSignal {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl StopSignal {
    pub fn register() -> std::io::Result<Self> {
        Ok(Self {
            #[cfg(unix)]
            term: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?,
        })
    }

    /// Resolves on SIGINT or (on Unix) SIGTERM.
    pub async fn recv(mut self) -> std::io::Result<()> {
        #[cfg(unix)]
        {
            tokio::select! {
                res = tokio::signal::ctrl_c() => res,
                _ = self.term.recv() => Ok(()),
            }
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c().await
        }
    }
}
