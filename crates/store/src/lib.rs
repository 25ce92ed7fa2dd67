//! The btrfs store that holds every session's writable layer.
//!
//! Each session's overlay upper layer is a btrfs subvolume, so a checkpoint is an
//! O(1) snapshot instead of a copy. [`Store::open`] finds or makes a btrfs filesystem
//! under the daemon's state directory: the directory itself when it already lies on
//! btrfs, otherwise a sparse image file attached to an autoclearing loop device and
//! mounted at `state_dir/store`. The free functions ([`create_subvolume`],
//! [`snapshot`], [`delete_subvolume`], ...) work on any path inside a btrfs
//! filesystem through the kernel's ioctls, without forking `btrfs`.

mod btrfs;
mod loopdev;
mod mountinfo;
mod quota;
mod written;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use drums_sys::{LinuxSyscall, MntFlags, MsFlags, Syscall};
use nix::errno::Errno;
use nix::sys::statfs::{statfs, BTRFS_SUPER_MAGIC};

pub use btrfs::{
    create_subvolume, create_subvolume_with, delete_subvolume, ino_paths, is_subvolume, snapshot,
    snapshot_with, subvolume_changed, subvolume_generation, subvolume_info, SubvolumeInfo,
};
pub use quota::{
    enable_quota, ensure_qgroup, limit_qgroup, QgroupInherit, QgroupLimitKind, SESSIONS_QGROUP,
};
pub use written::{written_since, Written};

/// Where the btrfs superblock's magic lives in a device: the primary superblock
/// starts at 64 KiB and its `magic` field at offset 0x40 within it.
const SUPERBLOCK_MAGIC_OFFSET: u64 = 0x1_0040;
const SUPERBLOCK_MAGIC: &[u8; 8] = b"_BHRfS_M";
/// mkfs.btrfs refuses devices below roughly 110 MiB (the exact floor depends on the
/// btrfs-progs version); checking first gives a clearer error than its output.
pub const MIN_IMAGE_SIZE: u64 = 128 << 20;

/// A failed store operation: what was being done, on which path, and why.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("create directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("stat {path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("statfs {path}")]
    Statfs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("open {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("create image {path} of {size} bytes")]
    CreateImage {
        path: PathBuf,
        size: u64,
        #[source]
        source: io::Error,
    },
    #[error("store image size {size} bytes is below the minimum of 128 MiB")]
    ImageTooSmall { size: u64 },
    #[error("run mkfs.btrfs on {path}")]
    MkfsSpawn {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mkfs.btrfs on {path} failed ({status}): {stderr}")]
    Mkfs {
        path: PathBuf,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("attach {image} to {device}")]
    LoopAttach {
        device: PathBuf,
        image: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("mount {device} at {path}")]
    Mount {
        device: PathBuf,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unmount {path}")]
    Unmount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is already a {fstype} mount point, not btrfs")]
    ForeignMount { path: PathBuf, fstype: String },
    #[error("{op} {path}")]
    Ioctl {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("snapshot {src} to {dst}")]
    Snapshot {
        src: PathBuf,
        dst: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a btrfs subvolume")]
    NotSubvolume { path: PathBuf },
    #[error("invalid subvolume path {path}: {reason}")]
    InvalidPath { path: PathBuf, reason: &'static str },
}

/// What the store's filesystem lives on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// The state directory is on btrfs already; the store is a plain directory in it.
    Native,
    /// An image file on a loop device, mounted at the store root.
    Loop { image: PathBuf, device: PathBuf },
}

/// An open store: a directory on btrfs where subvolumes can be made.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    backing: Backing,
}

impl Store {
    /// Open the store under `state_dir`, creating what is missing.
    ///
    /// If `state_dir` is on btrfs, the store is `state_dir/store` (a plain directory).
    /// Otherwise it is the image `state_dir/store.img` (a sparse file of `size_bytes`,
    /// made and formatted if absent) attached to an autoclearing loop device and
    /// mounted at `state_dir/store`. A btrfs mount already at `state_dir/store`, left
    /// by a daemon that crashed, is reused as it is.
    pub fn open(state_dir: &Path, size_bytes: u64) -> Result<Store, StoreError> {
        Self::open_with(&LinuxSyscall, state_dir, size_bytes)
    }

    /// [`Store::open`], mounting through `sys`.
    pub fn open_with(
        sys: &dyn Syscall,
        state_dir: &Path,
        size_bytes: u64,
    ) -> Result<Store, StoreError> {
        std::fs::create_dir_all(state_dir).map_err(|source| StoreError::CreateDir {
            path: state_dir.into(),
            source,
        })?;
        // mountinfo lists absolute, symlink-free paths; compare like with like.
        let state_dir = std::fs::canonicalize(state_dir).map_err(|source| StoreError::Stat {
            path: state_dir.into(),
            source,
        })?;
        let root = state_dir.join("store");
        mkdir(&root)?;

        if on_btrfs(&state_dir)? {
            tracing::info!(root = %root.display(), "store on native btrfs");
            return Ok(Store {
                root,
                backing: Backing::Native,
            });
        }

        let image = state_dir.join("store.img");
        if let Some(mount) = mountinfo::mount_at(&root)? {
            if mount.fstype != "btrfs" {
                return Err(StoreError::ForeignMount {
                    path: root,
                    fstype: mount.fstype,
                });
            }
            let device = PathBuf::from(mount.source);
            tracing::info!(root = %root.display(), device = %device.display(), "reusing mounted store");
            return Ok(Store {
                root,
                backing: Backing::Loop { image, device },
            });
        }

        prepare_image(&image, size_bytes)?;
        // The device fd must stay open until the mount holds the device: with
        // autoclear, closing the last reference detaches it. If the mount fails,
        // dropping the fd detaches it, which is the clean-up we want.
        let (device, device_fd) = loopdev::attach(&image)?;
        mount_image(sys, &device, &root)?;
        drop(device_fd);
        tracing::info!(root = %root.display(), device = %device.display(), image = %image.display(), "mounted store");
        Ok(Store {
            root,
            backing: Backing::Loop { image, device },
        })
    }

    /// The directory under which subvolumes are made.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn backing(&self) -> &Backing {
        &self.backing
    }

    /// Unmount a loop-backed store; the loop device then detaches itself. Nothing to
    /// do for a native one.
    pub fn close(self) -> Result<(), StoreError> {
        self.close_with(&LinuxSyscall)
    }

    /// [`Store::close`], unmounting through `sys`.
    pub fn close_with(self, sys: &dyn Syscall) -> Result<(), StoreError> {
        let Backing::Loop { image, device } = &self.backing else {
            return Ok(());
        };
        unmount(sys, &self.root)?;
        // Autoclear runs when the filesystem lets go of the device, normally during
        // the unmount. Waiting a moment for it makes "closed" mean "device gone",
        // which callers (and tests) can rely on. If another mount namespace still has
        // the filesystem, the device goes when that namespace does: not an error.
        let deadline = Instant::now() + Duration::from_secs(2);
        while loopdev::backing_file(device).is_some_and(|f| same_file_name(&f, image)) {
            if Instant::now() >= deadline {
                tracing::warn!(device = %device.display(), image = %image.display(),
                    "loop device still attached after unmount; another mount namespace may hold the store");
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!(root = %self.root.display(), "closed store");
        Ok(())
    }
}

fn mkdir(path: &Path) -> Result<(), StoreError> {
    match std::fs::create_dir(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(StoreError::CreateDir {
            path: path.into(),
            source,
        }),
    }
}

fn on_btrfs(path: &Path) -> Result<bool, StoreError> {
    let fs = statfs(path).map_err(|errno| StoreError::Statfs {
        path: path.into(),
        source: errno.into(),
    })?;
    Ok(fs.filesystem_type() == BTRFS_SUPER_MAGIC)
}

/// Make `image` a btrfs image of (at least) `size` bytes: create it sparse if absent
/// and format it if it carries no btrfs superblock yet. An existing image keeps its
/// size and contents.
fn prepare_image(image: &Path, size: u64) -> Result<(), StoreError> {
    let file = match OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(image)
    {
        Ok(file) => Some(file),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => None,
        Err(source) => {
            return Err(StoreError::CreateImage {
                path: image.into(),
                size,
                source,
            })
        }
    };
    let file = match file {
        Some(file) => file,
        None => File::open(image).map_err(|source| StoreError::Open {
            path: image.into(),
            source,
        })?,
    };
    if has_btrfs_superblock(&file, image)? {
        return Ok(());
    }
    // Unformatted: either new, or left behind by a crash before or during mkfs. In
    // both cases nothing in it is worth keeping, and it gets the requested size.
    if size < MIN_IMAGE_SIZE {
        return Err(StoreError::ImageTooSmall { size });
    }
    drop(file);
    let file = OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(|source| StoreError::Open {
            path: image.into(),
            source,
        })?;
    file.set_len(size)
        .map_err(|source| StoreError::CreateImage {
            path: image.into(),
            size,
            source,
        })?;
    drop(file);
    tracing::info!(image = %image.display(), size, "formatting store image");
    let output = Command::new(mkfs_btrfs())
        .arg("-q")
        .arg(image)
        .output()
        .map_err(|source| StoreError::MkfsSpawn {
            path: image.into(),
            source,
        })?;
    if !output.status.success() {
        return Err(StoreError::Mkfs {
            path: image.into(),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

fn has_btrfs_superblock(file: &File, path: &Path) -> Result<bool, StoreError> {
    let mut magic = [0u8; 8];
    match file.read_exact_at(&mut magic, SUPERBLOCK_MAGIC_OFFSET) {
        Ok(()) => Ok(&magic == SUPERBLOCK_MAGIC),
        // Shorter than the superblock offset: certainly not formatted.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(source) => Err(StoreError::Read {
            path: path.into(),
            source,
        }),
    }
}

/// mkfs.btrfs lives in sbin, which a daemon started with a minimal PATH may lack.
fn mkfs_btrfs() -> PathBuf {
    let in_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("mkfs.btrfs").is_file())
    });
    if !in_path {
        for dir in ["/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
            let candidate = Path::new(dir).join("mkfs.btrfs");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    PathBuf::from("mkfs.btrfs")
}

/// Mount the btrfs image attached at `device` on `root`.
fn mount_image(sys: &dyn Syscall, device: &Path, root: &Path) -> Result<(), StoreError> {
    sys.mount(
        Some(&device.to_string_lossy()),
        root,
        Some("btrfs"),
        // Without noatime every read would dirty metadata and so unshare it
        // from the snapshots that checkpoints take. nosuid and nodev: the
        // store holds what sessions wrote, and no setuid file or device
        // node a session made may work for anyone on the host.
        MsFlags::MS_NOATIME | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None,
    )
    .map_err(|e| StoreError::Mount {
        device: device.to_owned(),
        path: root.to_owned(),
        source: e.source.into(),
    })
}

fn unmount(sys: &dyn Syscall, root: &Path) -> Result<(), StoreError> {
    // A process that just left the store (a session's last file handle, a shell
    // whose cwd was there) can make it busy for a moment.
    const ATTEMPTS: u32 = 10;
    for attempt in 1..=ATTEMPTS {
        match sys.umount2(root, MntFlags::empty()).map_err(|e| e.source) {
            Ok(()) => return Ok(()),
            // Not a mount point (any more): already unmounted, which is the goal.
            Err(Errno::EINVAL) => {
                tracing::debug!(root = %root.display(), "store was not mounted");
                return Ok(());
            }
            Err(Errno::EBUSY) if attempt < ATTEMPTS => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(errno) => {
                return Err(StoreError::Unmount {
                    path: root.into(),
                    source: errno.into(),
                })
            }
        }
    }
    unreachable!("the last attempt always returns")
}

/// sysfs shows the backing file's path, with " (deleted)" appended if it was unlinked.
fn same_file_name(reported: &Path, image: &Path) -> bool {
    let reported = reported.as_os_str().to_string_lossy();
    let image = image.as_os_str().to_string_lossy();
    reported == image || reported.strip_suffix(" (deleted)") == Some(&*image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_backing_file_still_matches() {
        let image = Path::new("/var/lib/drums/store.img");
        assert!(same_file_name(Path::new("/var/lib/drums/store.img"), image));
        assert!(same_file_name(
            Path::new("/var/lib/drums/store.img (deleted)"),
            image
        ));
        assert!(!same_file_name(Path::new("/other.img"), image));
    }

    use drums_sys::{Call, RecordingSyscall};

    #[test]
    fn the_image_is_mounted_btrfs_noatime_nosuid_nodev() {
        let sys = RecordingSyscall::new();
        mount_image(&sys, Path::new("/dev/loop7"), Path::new("/s/store")).unwrap();
        assert_eq!(
            sys.calls(),
            [Call::Mount {
                source: Some("/dev/loop7".into()),
                target: "/s/store".into(),
                fstype: Some("btrfs".into()),
                flags: MsFlags::MS_NOATIME | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                data: None,
            }]
        );
    }

    #[test]
    fn a_failed_mount_names_device_and_path_and_keeps_the_errno() {
        let sys = RecordingSyscall::new();
        sys.fail("mount", Errno::EPERM);
        let e = mount_image(&sys, Path::new("/dev/loop7"), Path::new("/s/store")).unwrap_err();
        assert_eq!(e.to_string(), "mount /dev/loop7 at /s/store");
        let source = std::error::Error::source(&e).unwrap().to_string();
        assert_eq!(source, io::Error::from(Errno::EPERM).to_string());
        assert!(sys.calls().is_empty());
    }

    #[test]
    fn unmount_retries_a_busy_store_then_succeeds() {
        let sys = RecordingSyscall::new();
        sys.fail_nth("umount", 1, Errno::EBUSY);
        sys.fail_nth("umount", 2, Errno::EBUSY);
        unmount(&sys, Path::new("/s/store")).unwrap();
        assert_eq!(sys.attempts("umount"), 3);
        assert_eq!(
            sys.calls(),
            [Call::Umount {
                target: "/s/store".into(),
                flags: MntFlags::empty(),
            }],
            "never a lazy unmount: the loop device must be free when close returns"
        );
    }

    #[test]
    fn unmount_of_a_store_not_mounted_is_done() {
        let sys = RecordingSyscall::new();
        sys.fail("umount", Errno::EINVAL);
        unmount(&sys, Path::new("/s/store")).unwrap();
        assert_eq!(sys.attempts("umount"), 1);
    }

    #[test]
    fn unmount_fails_at_once_on_other_errors_and_after_ten_busy_tries() {
        let sys = RecordingSyscall::new();
        sys.fail("umount", Errno::EPERM);
        let e = unmount(&sys, Path::new("/s/store")).unwrap_err();
        assert_eq!(e.to_string(), "unmount /s/store");
        assert_eq!(sys.attempts("umount"), 1);

        let sys = RecordingSyscall::new();
        sys.fail("umount", Errno::EBUSY);
        let e = unmount(&sys, Path::new("/s/store")).unwrap_err();
        assert!(matches!(&e, StoreError::Unmount { source, .. }
            if source.raw_os_error() == Some(libc::EBUSY)));
        assert_eq!(sys.attempts("umount"), 10);
    }

    #[test]
    fn closing_a_native_store_unmounts_nothing() {
        let sys = RecordingSyscall::new();
        let store = Store {
            root: "/s/store".into(),
            backing: Backing::Native,
        };
        store.close_with(&sys).unwrap();
        assert_eq!(sys.attempts("umount"), 0);
    }

    #[test]
    fn closing_a_loop_store_unmounts_its_root() {
        let sys = RecordingSyscall::new();
        let store = Store {
            root: "/s/store".into(),
            backing: Backing::Loop {
                image: "/s/store.img".into(),
                // No loop device of this name exists: nothing to wait for.
                device: "/dev/drums-no-such-loop".into(),
            },
        };
        store.close_with(&sys).unwrap();
        assert_eq!(
            sys.calls(),
            [Call::Umount {
                target: "/s/store".into(),
                flags: MntFlags::empty(),
            }]
        );
    }

    #[test]
    fn error_messages_name_the_operation_and_path() {
        let err = StoreError::NotSubvolume {
            path: "/s/x".into(),
        };
        assert_eq!(err.to_string(), "/s/x is not a btrfs subvolume");
        let err = StoreError::ImageTooSmall { size: 1000 };
        assert_eq!(
            err.to_string(),
            "store image size 1000 bytes is below the minimum of 128 MiB"
        );
    }
}
