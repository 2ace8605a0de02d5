//! `watch: true`: the config file is looked at once a second, and reloaded when its contents
//! change; so are the TLS listeners' certificate, key and CA files, read again (as `POST
//! /reload_certs`) when theirs do. Polling the contents (not inotify) also sees files
//! replaced by rename, as editors, config-management tools and certificate agents write
//! them, and symlink flips (Kubernetes ConfigMaps and Secrets).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::LiveConfig;

const EVERY: Duration = Duration::from_secs(1);

/// Starts the watcher thread for `live`'s file. It acts only while the config in force says
/// `watch: true`, and ends with the process (or when `live` is gone).
pub(crate) fn start(live: &Arc<LiveConfig>) -> std::io::Result<()> {
    let Some(path) = live.source().map(Path::to_path_buf) else {
        return Ok(());
    };
    let live = Arc::downgrade(live);
    // Taken here, before the proxy says it is ready, not when the thread first runs: a file
    // changed in between must count as a change.
    let seen = fingerprint(&path);
    let runtime = crate::runtime::current_thread_runtime()?;
    std::thread::Builder::new()
        .name("legate-config-watch".into())
        .spawn(move || runtime.block_on(watch(live, path, seen)))?;
    Ok(())
}

async fn watch(live: Weak<LiveConfig>, path: PathBuf, mut seen: Option<u64>) {
    let mut certificates_seen = live
        .upgrade()
        .and_then(|live| certificates_fingerprint(&live.current().config));
    loop {
        tokio::time::sleep(EVERY).await;
        let Some(live) = live.upgrade() else {
            return;
        };
        if !live.current().config.watch {
            seen = fingerprint(&path);
            certificates_seen = certificates_fingerprint(&live.current().config);
            continue;
        }
        let now = fingerprint(&path);
        if now != seen {
            seen = now;
            tracing::info!(file = %path.display(), "config file changed: reloading");
            // Logged, counted and shown in /config_dump by the reload (which reads the
            // certificates too).
            let _ = live.reload().await;
            certificates_seen = certificates_fingerprint(&live.current().config);
            continue;
        }
        // `None` while a file is mid-replace: looked at again next time.
        let Some(certificates) = certificates_fingerprint(&live.current().config) else {
            continue;
        };
        if certificates_seen != Some(certificates) {
            certificates_seen = Some(certificates);
            tracing::info!("certificate files changed: reading them again");
            // Logged and counted (ssl_certificate_reload) per listener; one that fails
            // keeps its certificates.
            let _ = live.current().tls.reload_all();
        }
    }
}

/// The contents of every file the TLS listeners (and their chains) read, hashed; `None`
/// while one cannot be read.
fn certificates_fingerprint(config: &config::Config) -> Option<u64> {
    use std::hash::Hasher;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    let listeners = config
        .listeners
        .iter()
        .flat_map(|l| std::iter::once(l).chain(l.filter_chains.iter().map(|c| &*c.settings)));
    for tls in listeners.filter_map(|l| l.tls.as_ref()) {
        let sources = (tls.certificates.iter())
            .flat_map(|c| [&c.cert_chain, &c.private_key])
            .chain(tls.client_certificate.as_ref().map(|c| &c.ca));
        for source in sources {
            if let config::PemSource::File(file) = source {
                hasher.write(&std::fs::read(file).ok()?);
            }
        }
    }
    Some(hasher.finish())
}

/// The file's contents, hashed; `None` while it cannot be read (mid-replace).
fn fingerprint(path: &Path) -> Option<u64> {
    use std::hash::Hasher;
    let bytes = std::fs::read(path).ok()?;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    hasher.write(&bytes);
    Some(hasher.finish())
}
