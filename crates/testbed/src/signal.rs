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

/// A standalone server's life once it listens: signals registered first (a script may send
/// SIGTERM as soon as it reads the banner, and an unregistered one would kill the process
/// with a failure status), then `banner` on standard output, flushed (scripts wait for it on
/// a pipe, where `println!` does not flush), then SIGINT or SIGTERM awaited. `Err` after
/// saying why on standard error, naming the server `name`.
pub async fn serve_until_stopped(name: &str, banner: &str) -> Result<(), ()> {
    let stop =
        StopSignal::register().map_err(|e| eprintln!("{name}: can't watch for signals: {e}"))?;
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{banner}");
        let _ = out.flush();
    }
    stop.recv()
        .await
        .map_err(|e| eprintln!("{name}: can't wait for signals: {e}"))
}
