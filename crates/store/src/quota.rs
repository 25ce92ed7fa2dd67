//! Disk quotas on the store through btrfs qgroups (linux/btrfs.h ioctls).
//!
//! Every subvolume has a level-0 qgroup `0/ID` once quotas are on. drums limits
//! two things with them:
//! - each session's subvolume, by its *referenced* bytes (`max_rfer`), like
//!   Docker's and Podman's btrfs drivers: the limit is the size of the session's
//!   writable layer as the session sees it, shared extents included, so a restored
//!   sibling starts with exactly the usage its checkpoint had;
//! - all of drums' subvolumes together, through one level-1 qgroup
//!   ([`SESSIONS_QGROUP`]) that every session subvolume and every checkpoint
//!   snapshot joins at birth. Its limit is the store's size minus a reserve, so
//!   sessions run out of quota (EDQUOT) before the file system runs out of space,
//!   and drumsd's own subvolume creates, snapshots and deletes always have room.
//!
//! Membership and the session's limit are given in the create or snapshot ioctl
//! itself (`btrfs_qgroup_inherit`), so no subvolume ever exists unlimited or
//! outside the group, and the kernel never has to rescan: a snapshot joins the
//! group its source is already in.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::errno::Errno;

use crate::btrfs::BTRFS_IOCTL_MAGIC;
use crate::StoreError;

/// BTRFS_QUOTA_CTL_ENABLE.
const QUOTA_CTL_ENABLE: u64 = 1;
/// BTRFS_QGROUP_LIMIT_MAX_RFER.
const LIMIT_MAX_RFER: u64 = 1 << 0;
/// BTRFS_QGROUP_INHERIT_SET_LIMITS: the new qgroup takes `lim`.
const INHERIT_SET_LIMITS: u64 = 1 << 0;
/// The level-1 qgroup `1/1` that holds every subvolume drums makes.
pub const SESSIONS_QGROUP: u64 = (1 << 48) | 1;

/// struct btrfs_ioctl_quota_ctl_args.
#[repr(C)]
pub(crate) struct QuotaCtlArgs {
    pub cmd: u64,
    pub status: u64,
}

/// struct btrfs_qgroup_limit.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct QgroupLimit {
    pub flags: u64,
    pub max_rfer: u64,
    pub max_excl: u64,
    pub rsv_rfer: u64,
    pub rsv_excl: u64,
}

/// struct btrfs_ioctl_qgroup_limit_args.
#[repr(C)]
pub(crate) struct QgroupLimitArgs {
    pub qgroupid: u64,
    pub lim: QgroupLimit,
}

/// struct btrfs_ioctl_qgroup_create_args.
#[repr(C)]
pub(crate) struct QgroupCreateArgs {
    pub create: u64,
    pub qgroupid: u64,
}

const _: () = assert!(std::mem::size_of::<QuotaCtlArgs>() == 16);
const _: () = assert!(std::mem::size_of::<QgroupLimitArgs>() == 48);
const _: () = assert!(std::mem::size_of::<QgroupCreateArgs>() == 16);

mod ioctl {
    use super::{QgroupCreateArgs, QgroupLimitArgs, QuotaCtlArgs, BTRFS_IOCTL_MAGIC};

    nix::ioctl_readwrite!(quota_ctl, BTRFS_IOCTL_MAGIC, 40, QuotaCtlArgs);
    nix::ioctl_write_ptr!(qgroup_create, BTRFS_IOCTL_MAGIC, 42, QgroupCreateArgs);
    // The kernel header declares QGROUP_LIMIT with _IOR although it only reads.
    nix::ioctl_read!(qgroup_limit, BTRFS_IOCTL_MAGIC, 43, QgroupLimitArgs);
    nix::ioctl_none!(quota_rescan_wait, BTRFS_IOCTL_MAGIC, 46);
}

/// What a new subvolume or snapshot inherits: the qgroups it joins and the
/// referenced-bytes limit of its own qgroup. The default joins nothing and sets
/// no limit (quotas off, or a subvolume outside drums' accounting).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QgroupInherit {
    pub groups: Vec<u64>,
    pub max_referenced: Option<u64>,
}

impl QgroupInherit {
    /// A subvolume in [`SESSIONS_QGROUP`], limited to `max_referenced` bytes if given.
    pub fn session(max_referenced: Option<u64>) -> QgroupInherit {
        QgroupInherit {
            groups: vec![SESSIONS_QGROUP],
            max_referenced,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.max_referenced.is_none()
    }

    /// struct btrfs_qgroup_inherit as u64 words: flags, num_qgroups,
    /// num_ref_copies, num_excl_copies, lim (5 words), then the qgroup ids. The
    /// copy counts stay 0: the kernel no longer accepts copies.
    pub(crate) fn to_words(&self) -> Vec<u64> {
        let lim = match self.max_referenced {
            Some(bytes) => [LIMIT_MAX_RFER, bytes, 0, 0, 0],
            None => [0; 5],
        };
        let flags = if self.max_referenced.is_some() {
            INHERIT_SET_LIMITS
        } else {
            0
        };
        let mut words = vec![flags, self.groups.len() as u64, 0, 0];
        words.extend(lim);
        words.extend(&self.groups);
        words
    }
}

/// Turn quotas on for the btrfs file system holding `root` and wait until its
/// accounting is consistent. Already on: a no-op. On a file system with data the
/// kernel rescans it once, which this waits for, so limits set afterwards are
/// enforced against true numbers.
pub fn enable_quota(root: &Path) -> Result<(), StoreError> {
    let dir = open(root)?;
    let mut args = QuotaCtlArgs {
        cmd: QUOTA_CTL_ENABLE,
        status: 0,
    };
    // SAFETY: `dir` is an open fd for the call's duration and `args` is a
    // btrfs_ioctl_quota_ctl_args (size checked above) that the kernel reads and
    // may write back.
    unsafe { ioctl::quota_ctl(dir.as_raw_fd(), &mut args) }
        .map_err(ioctl_err("enable quotas on", root))?;
    // SAFETY: `dir` is an open fd; the ioctl takes no argument.
    match unsafe { ioctl::quota_rescan_wait(dir.as_raw_fd()) } {
        // ENOTCONN: quotas went off meanwhile; EINVAL on kernels that report
        // "no rescan running" that way. Either way there is nothing to wait for.
        Ok(_) | Err(Errno::ENOTCONN) | Err(Errno::EINVAL) => Ok(()),
        Err(errno) => Err(ioctl_err("wait for the quota rescan of", root)(errno)),
    }
}

/// Create qgroup `qgroupid` on the file system of `root` if it does not exist.
pub fn ensure_qgroup(root: &Path, qgroupid: u64) -> Result<(), StoreError> {
    let dir = open(root)?;
    let args = QgroupCreateArgs {
        create: 1,
        qgroupid,
    };
    // SAFETY: `dir` is an open fd and `args` a btrfs_ioctl_qgroup_create_args the
    // kernel only reads.
    match unsafe { ioctl::qgroup_create(dir.as_raw_fd(), &args) } {
        Ok(_) | Err(Errno::EEXIST) => Ok(()),
        Err(errno) => Err(ioctl_err("create qgroup on", root)(errno)),
    }
}

/// Limit qgroup `qgroupid` (0: the subvolume at `path` itself) to `max_referenced`
/// bytes, or lift its limit with `None`.
pub fn limit_qgroup(
    path: &Path,
    qgroupid: u64,
    max_referenced: Option<u64>,
) -> Result<(), StoreError> {
    let dir = open(path)?;
    let mut args = QgroupLimitArgs {
        qgroupid,
        lim: QgroupLimit {
            // Setting the flag with 0 would mean "0 bytes"; clearing it means
            // "no limit".
            flags: LIMIT_MAX_RFER,
            max_rfer: max_referenced.unwrap_or(u64::MAX),
            ..QgroupLimit::default()
        },
    };
    // SAFETY: `dir` is an open fd and `args` a btrfs_ioctl_qgroup_limit_args
    // (size checked above) that the kernel reads.
    unsafe { ioctl::qgroup_limit(dir.as_raw_fd(), &mut args) }
        .map_err(ioctl_err("limit qgroup of", path))?;
    Ok(())
}

fn open(path: &Path) -> Result<File, StoreError> {
    File::open(path).map_err(|source| StoreError::Open {
        path: path.into(),
        source,
    })
}

fn ioctl_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> StoreError + 'a {
    move |errno| StoreError::Ioctl {
        op,
        path: path.into(),
        source: io::Error::from(errno),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_headers() {
        // _IOWR(0x94, 40, 16 bytes), _IOW(0x94, 42, 16), _IOR(0x94, 43, 48), _IO(0x94, 46).
        assert_eq!(
            nix::request_code_readwrite!(BTRFS_IOCTL_MAGIC, 40, 16),
            0xc010_9428
        );
        assert_eq!(
            nix::request_code_write!(BTRFS_IOCTL_MAGIC, 42, 16),
            0x4010_942a
        );
        assert_eq!(
            nix::request_code_read!(BTRFS_IOCTL_MAGIC, 43, 48),
            0x8030_942b
        );
        assert_eq!(nix::request_code_none!(BTRFS_IOCTL_MAGIC, 46), 0x942e);
    }

    #[test]
    fn inherit_layout() {
        assert_eq!(QgroupInherit::default().to_words(), vec![0; 9]);
        let w = QgroupInherit::session(Some(1 << 30)).to_words();
        assert_eq!(
            w,
            vec![
                INHERIT_SET_LIMITS,
                1,
                0,
                0,
                LIMIT_MAX_RFER,
                1 << 30,
                0,
                0,
                0,
                SESSIONS_QGROUP
            ]
        );
        assert_eq!(SESSIONS_QGROUP, 0x0001_0000_0000_0001);
    }
}
