//! A session's user namespace: its uid and gid 0 are an unprivileged host
//! range, and host uid 0 is not mapped at all (docs/security.md, "User
//! namespace").
//!
//! Files keep owners that make sense inside without copying or chowning
//! anything, through two idmapped layers under the session's overlay:
//! - the image (read-only), whose owners 0..65535 on disk appear as the
//!   session's range;
//! - the session's subvolume (upper and work), whose owners on disk are
//!   [`DISK_BASE`] + k for the session's id k, whatever its range. A snapshot
//!   is therefore range-free, and each restored sibling gets a range of its
//!   own. The subvolume's map also sends 0 to 0: overlayfs creates its work
//!   directory with the credentials of its mounter, host root, which an
//!   idmapped mount must be able to represent (EOVERFLOW otherwise).

use std::os::fd::AsFd;
use std::path::Path;

use drums_catalog::IdPool;
use drums_sys::idmap::{self, Extent};
use drums_sys::{MsFlags, Syscall};

use crate::SessionError;

/// Ids per session: all 16-bit ids, as in a container's /etc/subuid range.
pub const RANGE: u32 = 65536;
/// Where the session ids of stored files live on disk: above every id a
/// Debian host hands out (and above /etc/subuid's usual 100000 + n * 65536
/// ranges), and never any session's range.
pub const DISK_BASE: u32 = 1 << 30;
/// Session ranges start right after the disk range; 8192 slots end below
/// 2^31, so no id is ever read as negative.
pub const POOL: IdPool = IdPool {
    first: DISK_BASE + RANGE,
    size: RANGE,
    slots: 8192,
};

/// The session's own map (and its image layer's): uid k inside is `base + k`.
pub fn session_map(base: u32) -> [Extent; 1] {
    [Extent {
        inside: 0,
        outside: base,
        count: RANGE,
    }]
}

/// The subvolume layer's map: on-disk `DISK_BASE + k` is the session's `k`,
/// and on-disk 0 is host root (overlayfs's own work files).
pub fn store_map(base: u32) -> [Extent; 2] {
    [
        Extent {
            inside: 0,
            outside: 0,
            count: 1,
        },
        Extent {
            inside: DISK_BASE,
            outside: base,
            count: RANGE,
        },
    ]
}

/// Mount the session's root at `root` on the host: an overlay of `lower`
/// (the image) and `sv/upper` with `sv/work`. With a range (`base`), both
/// layers are idmapped; without one (a privileged session), it is a plain
/// overlay. The layers are detached mounts that only the overlay holds, so
/// unmounting `root` leaves nothing.
pub fn mount_root(
    sys: &dyn Syscall,
    root: &Path,
    lower: &Path,
    sv: &Path,
    base: Option<u32>,
) -> Result<(), SessionError> {
    let overlay = |data: String| {
        sys.mount(
            Some("overlay"),
            root,
            Some("overlay"),
            MsFlags::empty(),
            Some(data.as_str()),
        )
        .map_err(|e| SessionError::Io {
            op: "mount overlay",
            path: root.to_owned(),
            source: e.source.into(),
        })
    };
    // xino=on: the image and the store are different file systems, and
    // without it a file of the image shows `stat` its lower layer's device
    // while the kernel's own view of the inode (what an inotify watch
    // reports, and what CRIU matches a watch's path against) has the
    // overlay's: no watched image file could be checkpointed. With it every
    // file has the overlay's device and one inode number everywhere.
    let Some(base) = base else {
        return overlay(format!(
            "lowerdir={},upperdir={},workdir={},xino=on",
            lower.display(),
            sv.join("upper").display(),
            sv.join("work").display()
        ));
    };
    let session_ns = sys.user_namespace(&session_map(base))?;
    let store_ns = sys.user_namespace(&store_map(base))?;
    let image = idmap::idmapped_tree_with(sys, lower, session_ns.as_fd(), true)?;
    let store = idmap::idmapped_tree_with(sys, sv, store_ns.as_fd(), false)?;
    let store_path = idmap::fd_path(store.as_fd());
    overlay(format!(
        "lowerdir={},upperdir={store_path}/upper,workdir={store_path}/work,xino=on",
        idmap::fd_path(image.as_fd()),
    ))
}

/// A new subvolume's upper directory belongs to the session's root: on disk,
/// [`DISK_BASE`] (or 0, without a user namespace).
pub fn own_upper(upper: &Path, base: Option<u32>) -> Result<(), SessionError> {
    let id = base.map(|_| DISK_BASE).unwrap_or(0);
    std::os::unix::fs::chown(upper, Some(id), Some(id)).map_err(|source| SessionError::Io {
        op: "chown",
        path: upper.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drums_sys::idmap::{OPEN_TREE_CLOEXEC, OPEN_TREE_CLONE};
    use drums_sys::{Call, RecordingSyscall};

    fn mount_at(sys: &RecordingSyscall, base: Option<u32>) -> Result<(), SessionError> {
        mount_root(
            sys,
            Path::new("/s/root"),
            Path::new("/img/rootfs"),
            Path::new("/store/sessions/a"),
            base,
        )
    }

    #[test]
    fn a_privileged_root_is_a_plain_overlay() {
        let sys = RecordingSyscall::new();
        mount_at(&sys, None).unwrap();
        assert_eq!(
            sys.calls(),
            [Call::Mount {
                source: Some("overlay".into()),
                target: "/s/root".into(),
                fstype: Some("overlay".into()),
                flags: MsFlags::empty(),
                data: Some(
                    "lowerdir=/img/rootfs,upperdir=/store/sessions/a/upper,\
                     workdir=/store/sessions/a/work,xino=on"
                        .into()
                ),
            }]
        );
    }

    /// Two id maps, the image cloned and idmapped read-only with the
    /// session's map, the subvolume cloned and idmapped writable with the
    /// store's map, and only then the overlay, of the two detached trees.
    #[test]
    fn an_unprivileged_root_is_an_overlay_of_idmapped_trees() {
        let sys = RecordingSyscall::new();
        let base = POOL.first;
        mount_at(&sys, Some(base)).unwrap();
        let calls = sys.calls();
        let fd = |i: usize| match &calls[i] {
            Call::UserNamespace { fd, .. } | Call::OpenTree { fd, .. } => *fd,
            other => panic!("call {i} is {other:?}"),
        };
        let (session_ns, store_ns, image, store) = (fd(0), fd(1), fd(2), fd(4));
        assert_eq!(
            calls,
            [
                Call::UserNamespace {
                    map: session_map(base).to_vec(),
                    fd: session_ns,
                },
                Call::UserNamespace {
                    map: store_map(base).to_vec(),
                    fd: store_ns,
                },
                Call::OpenTree {
                    path: "/img/rootfs".into(),
                    flags: OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
                    fd: image,
                },
                Call::MountSetattr {
                    tree: image,
                    idmap: Some(session_ns),
                    read_only: true,
                },
                Call::OpenTree {
                    path: "/store/sessions/a".into(),
                    flags: OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC,
                    fd: store,
                },
                Call::MountSetattr {
                    tree: store,
                    idmap: Some(store_ns),
                    read_only: false,
                },
                Call::Mount {
                    source: Some("overlay".into()),
                    target: "/s/root".into(),
                    fstype: Some("overlay".into()),
                    flags: MsFlags::empty(),
                    data: Some(format!(
                        "lowerdir=/proc/self/fd/{image},upperdir=/proc/self/fd/{store}/upper,\
                         workdir=/proc/self/fd/{store}/work,xino=on"
                    )),
                },
            ]
        );
    }

    /// A failure at each step is an error naming that step, and no later
    /// call is made (the detached trees and namespaces made so far close
    /// with their descriptors).
    #[test]
    fn a_failure_at_each_step_stops_there_and_names_it() {
        let steps: [(&str, usize, usize, &str); 7] = [
            ("user_namespace", 1, 0, "user_namespace CLONE_NEWUSER"),
            ("user_namespace", 2, 1, "user_namespace CLONE_NEWUSER"),
            ("open_tree", 1, 2, "open_tree /img/rootfs"),
            ("mount_setattr", 1, 3, "mount_setattr idmap /img/rootfs"),
            ("open_tree", 2, 4, "open_tree /store/sessions/a"),
            (
                "mount_setattr",
                2,
                5,
                "mount_setattr idmap /store/sessions/a",
            ),
            ("mount", 1, 6, "mount overlay /s/root"),
        ];
        for (op, nth, made, message) in steps {
            let sys = RecordingSyscall::new();
            sys.fail_nth(op, nth, nix::Error::EPERM);
            let e = mount_at(&sys, Some(POOL.first)).unwrap_err();
            let text = match &e {
                SessionError::Ids(e) => format!("{} {}", e.op, e.target),
                other => other.to_string(),
            };
            assert_eq!(text, message, "{op} #{nth}");
            let source = std::error::Error::source(&e).expect("a source");
            assert!(
                source.to_string().contains("Operation not permitted"),
                "{op} #{nth}: {source}"
            );
            assert_eq!(
                sys.calls().len(),
                made,
                "{op} #{nth}: calls after the failure"
            );
        }
    }
}
