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
    // Taken here, before the proxy says it is ready, not when the thread first runs: a file
    // changed in between must count as a change.
    let seen = fingerprint(&path);
    let certificates_seen = certificates_fingerprint(&live.current().config);
    let live = Arc::downgrade(live);
    let runtime = crate::runtime::current_thread_runtime()?;
    std::thread::Builder::new()
        .name("legate-config-watch".into())
        .spawn(move || runtime.block_on(watch(live, path, seen, certificates_seen)))?;
    Ok(())
}

async fn watch(
    live: Weak<LiveConfig>,
    path: PathBuf,
    mut seen: Option<u64>,
    mut certificates_seen: u64,
) {
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
            // Logged, counted and shown in /config_dump by the reload, which reads the
            // certificates too; if it fails, changed certificates are read below.
            if live.reload().await.is_ok() {
                certificates_seen = certificates_fingerprint(&live.current().config);
                continue;
            }
        }
        let certificates = certificates_fingerprint(&live.current().config);
        if certificates_seen != certificates {
            certificates_seen = certificates;
            tracing::info!("certificate files changed: reading them again");
            // Logged and counted (ssl_certificate_reload) per listener; one that fails
            // keeps its certificates.
            let _ = live.current().tls.reload_all();
        }
    }
}

/// The contents of every file the TLS listeners (and their chains) read, hashed. A file that
/// cannot be read (gone, mid-replace) hashes as such: its coming back is a change too.
fn certificates_fingerprint(config: &config::Config) -> u64 {
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
                match std::fs::read(file) {
                    Ok(bytes) => {
                        hasher.write_u8(1);
                        hasher.write(&bytes);
                    }
                    Err(_) => hasher.write_u8(0),
                }
            }
        }
    }
    hasher.finish()
}

/// The file's contents, hashed; `None` while it cannot be read (mid-replace).
fn fingerprint(path: &Path) -> Option<u64> {
    use std::hash::Hasher;
    let bytes = std::fs::read(path).ok()?;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    hasher.write(&bytes);
    Some(hasher.finish())
}
