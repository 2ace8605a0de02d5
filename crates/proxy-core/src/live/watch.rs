//! `watch: true`: the config file is looked at once a second, and reloaded when its contents
//! change. Polling the contents (not inotify) also sees files replaced by rename, as editors
//! and config-management tools write them, and symlink flips (Kubernetes ConfigMaps).

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
    loop {
        tokio::time::sleep(EVERY).await;
        let Some(live) = live.upgrade() else {
            return;
        };
        if !live.current().config.watch {
            seen = fingerprint(&path);
            continue;
        }
        let now = fingerprint(&path);
        if now == seen {
            continue;
        }
        seen = now;
        tracing::info!(file = %path.display(), "config file changed: reloading");
        // Logged, counted and shown in /config_dump by the reload.
        let _ = live.reload().await;
    }
}

/// The file's contents, hashed; `None` while it cannot be read (mid-replace).
fn fingerprint(path: &Path) -> Option<u64> {
    use std::hash::Hasher;
    let bytes = std::fs::read(path).ok()?;
    let mut hasher = twox_hash::XxHash64::with_seed(0);
    hasher.write(&bytes);
    Some(hasher.finish())
}
