//! Removing what the ledger names. Used by `drums rm`, by a failed create, at
//! daemon shutdown and by the sweep at start: one path for all four, so a crash
//! at any point is cleaned up by the same code that cleans up a normal removal.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use drums_catalog::{Resource, ResourceKind};
use drums_sys::{MntFlags, Syscall};

use crate::host::Host;
use crate::{error_chain, process, SessionError};

/// Why one resource could not be removed, with the failing call's own error.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error("kill and reap")]
    Process(#[source] process::ReapError),
    #[error("delete link")]
    Link(#[source] drums_net::NetError),
    #[error("remove its firewall port")]
    Port(#[source] drums_net::firewall::FirewallError),
    #[error("remove cgroup")]
    Cgroup(#[source] drums_cgroup::CgroupError),
    #[error("delete subvolume")]
    Subvolume(#[source] drums_store::StoreError),
    #[error("remove")]
    Dir(#[source] std::io::Error),
    #[error("umount")]
    Unmount(#[source] nix::Error),
    /// The plain unmount found it busy, and the lazy one failed too.
    #[error("umount -l")]
    Detach(#[source] nix::Error),
    #[error("remove nftables table")]
    NftTable(#[source] drums_net::firewall::FirewallError),
    #[error("teardown task")]
    Task(#[source] tokio::task::JoinError),
}

/// One resource that is still there after a removal: the ledger keeps it,
/// and the next removal or the sweep at start tries it again.
#[derive(Debug, thiserror::Error)]
#[error("{} {key}", kind.as_str())]
pub struct ResourceFailure {
    pub kind: ResourceKind,
    pub key: String,
    #[source]
    pub source: RemoveError,
}

/// A removal's failures, each with its chain, for
/// [`SessionError::Teardown`]'s message: `link v1: delete link: …; dir …`.
#[derive(Debug)]
pub struct Failures(pub Vec<ResourceFailure>);

impl fmt::Display for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            f.write_str(&error_chain(failure))?;
        }
        Ok(())
    }
}

/// Remove every resource of `owner`, newest first, forgetting each one only once
/// it is gone. Every resource is attempted even if an earlier one failed.
pub async fn remove_owned(host: &Host, owner: &str) -> Result<(), SessionError> {
    remove_owned_but(host, owner, false).await
}

/// [`remove_owned`], except that a veth's firewall port stays listed: for a
/// session rebuilt at once under its own identity (a rollback), whose new
/// veth has the same name, MAC and address. Until that veth exists the
/// element matches no device; if the rebuild fails, its clean-up removes the
/// port with the veth, and a restarted drumsd's firewall starts empty.
pub async fn remove_owned_keeping_port(host: &Host, owner: &str) -> Result<(), SessionError> {
    remove_owned_but(host, owner, true).await
}

async fn remove_owned_but(host: &Host, owner: &str, keep_port: bool) -> Result<(), SessionError> {
    let mut failures = Vec::new();
    for r in host.catalog.owned_by(owner)? {
        match remove_resource(host, &r, keep_port).await {
            Ok(()) => host.catalog.release(r.seq)?,
            Err(source) => failures.push(ResourceFailure {
                kind: r.kind,
                key: r.key,
                source,
            }),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(SessionError::Teardown {
            id: owner.to_owned(),
            failures: Failures(failures),
        })
    }
}

async fn blocking<F>(f: F) -> Result<(), RemoveError>
where
    F: FnOnce() -> Result<(), RemoveError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(RemoveError::Task)?
}

/// Remove one resource; a resource that is already gone counts as removed.
async fn remove_resource(host: &Host, r: &Resource, keep_port: bool) -> Result<(), RemoveError> {
    let key = r.key.clone();
    match r.kind {
        ResourceKind::Process => {
            blocking(move || {
                process::kill_and_reap(&key, Duration::from_secs(10)).map_err(RemoveError::Process)
            })
            .await
        }
        ResourceKind::Link => {
            host.net
                .delete_link(&key)
                .await
                .map_err(RemoveError::Link)?;
            if keep_port {
                return Ok(());
            }
            // A session's veth: its anti-spoofing and egress elements go with
            // it (a no-op for the bridge itself, which is no port).
            let bridge = host.cfg.bridge.clone();
            blocking(move || {
                drums_net::firewall::remove_port(&bridge, &key).map_err(RemoveError::Port)
            })
            .await
        }
        ResourceKind::Cgroup => {
            blocking(move || {
                match key.split_once('/') {
                    Some((parent, name)) => drums_cgroup::Cgroup::open(parent, name).remove(),
                    None => drums_cgroup::remove_parent(&key),
                }
                .map_err(RemoveError::Cgroup)
            })
            .await
        }
        ResourceKind::Subvolume => {
            blocking(move || {
                drums_store::delete_subvolume(Path::new(&key))
                    .map(|_| ())
                    .map_err(RemoveError::Subvolume)
            })
            .await
        }
        ResourceKind::Dir => match std::fs::remove_dir_all(&key) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RemoveError::Dir(e)),
            _ => Ok(()),
        },
        ResourceKind::Mount => {
            let sys = host.sys.clone();
            blocking(move || unmount(&*sys, Path::new(&key))).await
        }
        ResourceKind::NftTable => {
            blocking(move || {
                drums_net::firewall::remove(&key)
                    .map(|_| ())
                    .map_err(RemoveError::NftTable)
            })
            .await
        }
    }
}

fn unmount(sys: &dyn Syscall, path: &Path) -> Result<(), RemoveError> {
    match sys.umount2(path, MntFlags::empty()).map_err(|e| e.source) {
        // EINVAL: not a mount point (already unmounted); ENOENT: gone.
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        // Something still holds it: detach, so it goes when the last user does.
        Err(nix::Error::EBUSY) => sys
            .umount2(path, MntFlags::MNT_DETACH)
            .map_err(|e| RemoveError::Detach(e.source)),
        Err(e) => Err(RemoveError::Unmount(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drums_sys::{Call, RecordingSyscall};

    fn umount(flags: MntFlags) -> Call {
        Call::Umount {
            target: "/s/root".into(),
            flags,
        }
    }

    #[test]
    fn a_mount_is_unmounted_once_and_not_detached() {
        let sys = RecordingSyscall::new();
        unmount(&sys, Path::new("/s/root")).unwrap();
        assert_eq!(sys.calls(), [umount(MntFlags::empty())]);
    }

    #[test]
    fn a_mount_already_gone_counts_as_removed() {
        for errno in [nix::Error::EINVAL, nix::Error::ENOENT] {
            let sys = RecordingSyscall::new();
            sys.fail("umount", errno);
            unmount(&sys, Path::new("/s/root")).unwrap();
            assert_eq!(sys.attempts("umount"), 1, "{errno}: no detach");
        }
    }

    #[test]
    fn a_busy_mount_is_detached() {
        let sys = RecordingSyscall::new();
        sys.fail_nth("umount", 1, nix::Error::EBUSY);
        unmount(&sys, Path::new("/s/root")).unwrap();
        assert_eq!(sys.calls(), [umount(MntFlags::MNT_DETACH)]);
    }

    #[test]
    fn failures_name_the_unmount_and_keep_the_errno() {
        let sys = RecordingSyscall::new();
        sys.fail("umount", nix::Error::EPERM);
        assert!(matches!(
            unmount(&sys, Path::new("/s/root")),
            Err(RemoveError::Unmount(nix::Error::EPERM))
        ));
        assert_eq!(sys.attempts("umount"), 1, "no detach after EPERM");

        let sys = RecordingSyscall::new();
        sys.fail_nth("umount", 1, nix::Error::EBUSY);
        sys.fail_nth("umount", 2, nix::Error::EPERM);
        let e = unmount(&sys, Path::new("/s/root")).unwrap_err();
        assert!(matches!(e, RemoveError::Detach(nix::Error::EPERM)), "{e:?}");
        assert_eq!(error_chain(&e), "umount -l: EPERM: Operation not permitted");
        assert_eq!(sys.attempts("umount"), 2);
    }
}
