//! A session's root on an OCI image, the two ways drums could make it
//! (docs/oci.md, "A session's root"), measured on the pulled image's top
//! layer in drumsd's own store, with the same primitives drumsd uses:
//!
//! - **overlay** (what drumsd does): an empty subvolume for `upper` and
//!   `work`, the layer idmapped read-only as the lower, the subvolume
//!   idmapped, one overlay mount;
//! - **snapshot**: a writable snapshot of the layer's subvolume, idmapped,
//!   attached as the root.
//!
//! And what a checkpoint does to the root in each: a read-only snapshot of
//! the subvolume that holds the session's changes (the upper, or the whole
//! root), then `written_since` over it, which is what a files-only version
//! measures. CRIU itself never reads the root's files: it dumps the
//! processes, and drumsd mounts the root before a restore, so its own time
//! is the same on either.
//!
//! The id maps are drumsd's (`drums_session::ids`), with the last slot of
//! its id pool, which no session gets before 8191 others.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::Instant;

use drums_store::StoreError;
use drums_sys::idmap::{self, Extent};
use drums_sys::{LinuxSyscall, SysError, Syscall};

use super::Arms;

/// A round of a session's root: each step names itself in `op`.
#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("root, {arm}")]
    Arm {
        arm: &'static str,
        #[source]
        source: Box<RootError>,
    },
    #[error("{op}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}")]
    Store {
        op: &'static str,
        #[source]
        source: StoreError,
    },
    #[error("{op}")]
    Idmap {
        op: &'static str,
        #[source]
        source: SysError,
    },
    #[error("mount the overlay")]
    Mount(#[source] SysError),
    #[error("attach the idmapped root")]
    Attach(#[source] SysError),
    #[error("written_since saw {0} bytes")]
    Unseen(u64),
}

type Result<T, E = RootError> = std::result::Result<T, E>;

fn io(op: &'static str) -> impl FnOnce(std::io::Error) -> RootError {
    move |source| RootError::Io { op, source }
}

fn store(op: &'static str) -> impl FnOnce(StoreError) -> RootError {
    move |source| RootError::Store { op, source }
}

fn idmapping(op: &'static str) -> impl FnOnce(SysError) -> RootError {
    move |source| RootError::Idmap { op, source }
}

/// `drums_session::ids`: where stored session ids live on disk, and the
/// size of a range.
const DISK_BASE: u32 = 1 << 30;
const RANGE: u32 = 65536;
/// The last slot of drumsd's pool (`drums_session::ids::POOL`).
const BASE: u32 = DISK_BASE + RANGE + 8191 * RANGE;

fn session_map() -> [Extent; 1] {
    [Extent {
        inside: 0,
        outside: BASE,
        count: RANGE,
    }]
}

fn store_map() -> [Extent; 2] {
    [
        Extent {
            inside: 0,
            outside: 0,
            count: 1,
        },
        Extent {
            inside: DISK_BASE,
            outside: BASE,
            count: RANGE,
        },
    ]
}

/// `rounds` rounds, the arms alternating first, after one unmeasured.
/// `top` is the image's top layer subvolume, `scratch` a directory on the
/// same btrfs (the store's `oci/tmp`).
pub fn rounds(top: &Path, scratch: &Path, rounds: usize) -> Result<Arms> {
    let mut arms = Arms::default();
    for round in 0..=rounds {
        for k in 0..2 {
            let snapshot = (round + k) % 2 == 1;
            let m = once(top, scratch, snapshot).map_err(|e| RootError::Arm {
                arm: if snapshot { "snapshot" } else { "overlay" },
                source: Box::new(e),
            })?;
            if round > 0 {
                let arm = if snapshot { "snapshot" } else { "overlay" };
                arms.push(leak(format!("{arm}.mount")), m.mount);
                arms.push(leak(format!("{arm}.checkpoint_snapshot")), m.checkpoint);
                arms.push(leak(format!("{arm}.written_since")), m.scan);
            }
        }
    }
    Ok(arms)
}

/// Arm keys are few and fixed; `Arms` keys are `&'static str`.
fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

struct Once {
    mount: f64,
    checkpoint: f64,
    scan: f64,
}

fn once(top: &Path, scratch: &Path, snapshot: bool) -> Result<Once> {
    let sv = scratch.join(format!("bench-root-{}", std::process::id()));
    let snap = scratch.join(format!("bench-root-{}-ck", std::process::id()));
    let root = scratch.join(format!("bench-root-{}-mnt", std::process::id()));
    std::fs::create_dir_all(&root).map_err(io("create the mount point"))?;
    // The seam every privileged call of drums goes through.
    let sys = LinuxSyscall;
    let result = (|| {
        let t = Instant::now();
        let changes = if snapshot {
            drums_store::snapshot(top, &sv, false).map_err(store("snapshot the layer"))?;
            let ns =
                idmap::user_namespace(&session_map()).map_err(idmapping("the session's userns"))?;
            let tree = idmap::idmapped_tree(&sv, ns.as_fd(), false)
                .map_err(idmapping("idmap the snapshot"))?;
            sys.move_mount(tree.as_fd(), &root)
                .map_err(RootError::Attach)?;
            sv.clone()
        } else {
            drums_store::create_subvolume(&sv).map_err(store("create the upper's subvolume"))?;
            for d in ["upper", "work"] {
                std::fs::create_dir(sv.join(d)).map_err(io("create upper and work"))?;
            }
            std::os::unix::fs::chown(sv.join("upper"), Some(DISK_BASE), Some(DISK_BASE))
                .map_err(io("chown the upper"))?;
            let session_ns =
                idmap::user_namespace(&session_map()).map_err(idmapping("the session's userns"))?;
            let store_ns =
                idmap::user_namespace(&store_map()).map_err(idmapping("the store's userns"))?;
            let image = idmap::idmapped_tree(top, session_ns.as_fd(), true)
                .map_err(idmapping("idmap the layer"))?;
            let store = idmap::idmapped_tree(&sv, store_ns.as_fd(), false)
                .map_err(idmapping("idmap the upper's subvolume"))?;
            let store_path = idmap::fd_path(store.as_fd());
            sys.mount(
                Some("overlay"),
                &root,
                Some("overlay"),
                drums_sys::MsFlags::empty(),
                Some(
                    format!(
                        "lowerdir={},upperdir={store_path}/upper,workdir={store_path}/work",
                        idmap::fd_path(image.as_fd())
                    )
                    .as_str(),
                ),
            )
            .map_err(RootError::Mount)?;
            sv.clone()
        };
        let mount = t.elapsed().as_secs_f64();
        // What a version counts from: the generation after a commit, as a
        // session's previous version leaves it (not timed).
        nix::unistd::sync();
        let gen = drums_store::subvolume_generation(&changes)
            .map_err(store("the changes' generation"))?;
        // A turn's worth of change: a file written, one edited. Host root
        // has no id in the snapshot's idmapped mount (the session's range
        // only), so it writes that subvolume directly; the overlay's upper
        // maps host root, so it writes through the mount, copying up.
        let at = if snapshot { &sv } else { &root };
        std::fs::write(at.join("etc/drums-bench-turn"), vec![b'x'; 64 << 10])
            .map_err(io("write a turn's file"))?;
        std::fs::write(at.join("etc/hostname"), b"bench\n").map_err(io("edit a file"))?;
        nix::unistd::sync();
        let t = Instant::now();
        drums_store::snapshot(&changes, &snap, true).map_err(store("snapshot the changes"))?;
        let checkpoint = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let w = drums_store::written_since(&snap, gen).map_err(store("written_since"))?;
        let scan = t.elapsed().as_secs_f64();
        if w.bytes < 64 << 10 {
            return Err(RootError::Unseen(w.bytes));
        }
        Ok(Once {
            mount,
            checkpoint,
            scan,
        })
    })();
    let _ = sys.umount2(&root, drums_sys::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(&root);
    let _ = drums_store::delete_subvolume(&snap);
    let _ = drums_store::delete_subvolume(&sv);
    result
}
