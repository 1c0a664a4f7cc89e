//! Hot reload of policies and of the listener's TLS certificate: on
//! SIGHUP, and when any file under the configured policy paths, or the
//! certificate or key file, changes (polled: no platform file-watching API
//! to fail).
//!
//! A reload compiles every policy first and swaps the whole set in only if
//! all of it compiles; otherwise the running policies stay and each error
//! is logged with its file:line:column. Responses already being rewritten
//! finish under the policies they started with. A certificate is swapped
//! in only if it loads and matches its key; new handshakes use it, and
//! established connections keep going (TLS does not re-check a
//! certificate mid-connection).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tracing::{error, info, warn};

use crate::policy::PolicySet;
use crate::proxy::Shared;

/// Extensions of policy and schema files.
const WATCHED: &[&str] = &["yaml", "yml", "json", "avsc", "proto"];

/// How often policy files are checked for changes.
const POLL: Duration = Duration::from_secs(1);

/// A cheap picture of the policy files: every file's path, size and
/// modification time. A policy file's own folder is included, since schema
/// files usually sit next to (or below) the policies that name them; only
/// files with a policy or schema extension count ([`WATCHED`]), so logs or
/// other files written next to the policies do not cause reloads (each
/// reload also empties the verdict cache).
pub fn fingerprint(paths: &[PathBuf]) -> Stamp {
    let mut out = Vec::new();
    for p in paths {
        let root = if p.is_dir() {
            p.as_path()
        } else {
            p.parent().unwrap_or(Path::new("."))
        };
        walk(root, 0, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// The policy and schema files as [`fingerprint`] saw them: path, size,
/// modification time.
pub type Stamp = Vec<(PathBuf, u64, Option<SystemTime>)>;

fn walk(dir: &Path, depth: usize, out: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
    // Bounded: a misconfigured path such as `/` must not hang the proxy.
    if depth > 4 || out.len() > 10_000 {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        // Follow symlinks: a policy linked to a file elsewhere changes when
        // its target does, not the link. (A Kubernetes ConfigMap swaps its
        // `..data` link: seen either way, through the timestamped folder.)
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            walk(&path, depth + 1, out);
        } else if path
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| WATCHED.contains(&x))
        {
            out.push((path, meta.len(), meta.modified().ok()));
        }
    }
}

/// The listener's certificate and key files as they are now: path, the
/// file a symlink resolves to (a Kubernetes Secret swaps `..data`), size
/// and modification time.
type FileStamp = (PathBuf, Option<PathBuf>, u64, Option<SystemTime>);

fn cert_files(shared: &Shared) -> Vec<FileStamp> {
    match &shared.config.listen.tls {
        Some(tls) => stamps(&[&tls.cert, &tls.key]),
        None => Vec::new(),
    }
}

fn stamps(paths: &[&PathBuf]) -> Vec<FileStamp> {
    paths
        .iter()
        .map(|p| {
            let meta = std::fs::metadata(p).ok();
            (
                p.to_path_buf(),
                std::fs::canonicalize(p).ok(),
                meta.as_ref().map_or(0, |m| m.len()),
                meta.and_then(|m| m.modified().ok()),
            )
        })
        .collect()
}

/// Load and swap in the listener's certificate; keep the running one on
/// any error. True when there is no TLS listener.
pub fn reload_certificate(shared: &Shared, why: &str) -> bool {
    let (Some(server), Some(cfg)) = (&shared.tls, &shared.config.listen.tls) else {
        return true;
    };
    match server.certificates.reload(cfg) {
        Ok(sha256) => {
            info!(why, %sha256, "listener certificate reloaded; new TLS handshakes use it");
            true
        }
        Err(e) => {
            error!(
                why,
                error = %e,
                running_sha256 = %server.certificates.fingerprint(),
                "listener certificate reload rejected; the running certificate stays in use"
            );
            false
        }
    }
}

/// Load and swap in the policies; keep the running ones on any error.
pub fn reload(shared: &Shared, why: &str) -> bool {
    match PolicySet::load(&shared.config.policies) {
        Ok(set) if set.uses_registry() && shared.config.schema_registry.is_none() => {
            error!(why, "policy reload rejected: a policy sets `registry: true` but the config has no `schema_registry`; the running policies stay in force");
            false
        }
        Ok(set) => {
            info!(why, policies = set.len(), "policies reloaded");
            shared.fetch_filter.replace_policies(set);
            true
        }
        Err(errors) => {
            for e in &errors {
                error!("{e}");
            }
            warn!(
                why,
                errors = errors.len(),
                "policy reload rejected; the running policies stay in force"
            );
            false
        }
    }
}

/// Reload on SIGHUP and on file changes until shutdown. `loaded`: the
/// files as they were just before the running policies were read, so a
/// change made while the proxy was starting is seen at the first poll.
pub async fn watch(shared: Arc<Shared>, loaded: Stamp) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGHUP; reload on file change only");
            None
        }
    };
    let paths = shared.config.policies.clone();
    let mut last = loaded;
    let mut last_certs = cert_files(&shared);
    loop {
        let sighup = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = shared.shutdown.cancelled() => return,
            _ = sighup => {
                reload(&shared, "SIGHUP");
                reload_certificate(&shared, "SIGHUP");
                last = fingerprint(&paths);
                last_certs = cert_files(&shared);
            }
            _ = tokio::time::sleep(POLL) => {
                let now = fingerprint(&paths);
                if now != last {
                    last = now;
                    reload(&shared, "policy files changed");
                }
                // A rejected certificate is not retried until its files
                // change again (a key written after its certificate does).
                let now = cert_files(&shared);
                if now != last_certs {
                    last_certs = now;
                    reload_certificate(&shared, "certificate files changed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_policy_and_schema_files_count_as_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let policy = dir.path().join("p.yaml");
        std::fs::write(&policy, "policies: []\n").unwrap();
        std::fs::write(dir.path().join("proxy.log"), "a").unwrap();
        std::fs::create_dir(dir.path().join("schemas")).unwrap();
        let paths = vec![policy];
        let before = fingerprint(&paths);
        std::fs::write(dir.path().join("proxy.log"), "a longer log line").unwrap();
        assert_eq!(fingerprint(&paths), before, "a log file is not a policy");
        std::fs::write(dir.path().join("schemas/x.avsc"), "{}").unwrap();
        assert_ne!(fingerprint(&paths), before, "a new schema file is");
    }

    #[test]
    fn a_changed_symlink_target_counts_as_a_change() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("elsewhere.txt");
        std::fs::write(&target, "policies: []\n").unwrap();
        let policies = dir.path().join("policies");
        std::fs::create_dir(&policies).unwrap();
        std::os::unix::fs::symlink(&target, policies.join("p.yaml")).unwrap();
        let paths = vec![policies];
        let before = fingerprint(&paths);
        std::fs::write(&target, "policies: [] # edited in place\n").unwrap();
        assert_ne!(fingerprint(&paths), before);
    }

    #[test]
    fn a_configmap_data_swap_counts_as_a_change() {
        // The kubelet's layout: `p.yaml -> ..data/p.yaml`, `..data -> ..<stamp>`;
        // an update writes a new stamp folder and renames a new `..data` over the old.
        let dir = tempfile::tempdir().expect("tempdir");
        let mount = dir.path();
        std::fs::create_dir(mount.join("..1")).unwrap();
        std::fs::write(mount.join("..1/p.yaml"), "policies: []\n").unwrap();
        std::os::unix::fs::symlink("..1", mount.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/p.yaml", mount.join("p.yaml")).unwrap();
        let paths = vec![mount.to_path_buf()];
        let before = fingerprint(&paths);
        std::fs::create_dir(mount.join("..2")).unwrap();
        std::fs::write(mount.join("..2/p.yaml"), "policies: []\n").unwrap();
        std::os::unix::fs::symlink("..2", mount.join("..data_tmp")).unwrap();
        std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
        std::fs::remove_dir_all(mount.join("..1")).unwrap();
        assert_ne!(fingerprint(&paths), before, "same content, new data folder");
    }

    #[test]
    fn a_secret_swap_to_an_identical_looking_file_counts_as_a_change() {
        // A Kubernetes Secret: `tls.crt -> ..data/tls.crt`, `..data -> ..<stamp>`.
        // Same size and modification time in the new folder: only the
        // resolved path tells the two apart.
        let dir = tempfile::tempdir().expect("tempdir");
        let mount = dir.path();
        for stamp in ["..1", "..2"] {
            std::fs::create_dir(mount.join(stamp)).unwrap();
            std::fs::write(mount.join(stamp).join("tls.crt"), "same size").unwrap();
        }
        let when = std::fs::metadata(mount.join("..1/tls.crt"))
            .unwrap()
            .modified()
            .unwrap();
        let second = std::fs::File::options()
            .write(true)
            .open(mount.join("..2/tls.crt"))
            .unwrap();
        second.set_modified(when).unwrap();
        std::os::unix::fs::symlink("..1", mount.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/tls.crt", mount.join("tls.crt")).unwrap();
        let cert = mount.join("tls.crt");
        let before = stamps(&[&cert]);
        std::os::unix::fs::symlink("..2", mount.join("..data_tmp")).unwrap();
        std::fs::rename(mount.join("..data_tmp"), mount.join("..data")).unwrap();
        let after = stamps(&[&cert]);
        assert_eq!((before[0].2, before[0].3), (after[0].2, after[0].3));
        assert_ne!(before, after);
    }
}
