//! Disk quotas on the store through btrfs qgroups (linux/btrfs.h ioctls).
//!
//! Every subvolume has a level-0 qgroup `0/ID` once quotas are on. drums limits
//! two things with them:
//! - each session's subvolume, by its *exclusive* bytes (`max_excl`): what the
//!   session alone holds, i.e. what it wrote since it was created or restored,
//!   not what it shares with its checkpoints. Docker's and Podman's btrfs
//!   drivers limit referenced bytes instead; with checkpoints that would make a
//!   sibling of a full session start full, and overlayfs, left no room for its
//!   work directory, would mount its root read-only. So a sibling gets the same
//!   budget for new writes as its checkpoint granted;
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
/// BTRFS_QGROUP_LIMIT_MAX_EXCL.
const LIMIT_MAX_EXCL: u64 = 1 << 1;
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

/// Which of a qgroup's two counts a limit bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QgroupLimitKind {
    /// Every byte the qgroup's subvolumes reach, shared or not.
    Referenced,
    /// Bytes no subvolume outside the qgroup shares.
    Exclusive,
}

impl QgroupLimitKind {
    fn flag(self) -> u64 {
        match self {
            QgroupLimitKind::Referenced => LIMIT_MAX_RFER,
            QgroupLimitKind::Exclusive => LIMIT_MAX_EXCL,
        }
    }
}

/// What a new subvolume or snapshot inherits: the qgroups it joins and the
/// exclusive-bytes limit of its own qgroup. The default joins nothing and sets
/// no limit (quotas off, or a subvolume outside drums' accounting).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QgroupInherit {
    pub groups: Vec<u64>,
    pub max_exclusive: Option<u64>,
}

impl QgroupInherit {
    /// A subvolume in [`SESSIONS_QGROUP`], limited to `max_exclusive` bytes if given.
    pub fn session(max_exclusive: Option<u64>) -> QgroupInherit {
        QgroupInherit {
            groups: vec![SESSIONS_QGROUP],
            max_exclusive,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty() && self.max_exclusive.is_none()
    }

    /// struct btrfs_qgroup_inherit as u64 words: flags, num_qgroups,
    /// num_ref_copies, num_excl_copies, lim (5 words), then the qgroup ids. The
    /// copy counts stay 0: the kernel no longer accepts copies.
    pub(crate) fn to_words(&self) -> Vec<u64> {
        let lim = match self.max_exclusive {
            Some(bytes) => [LIMIT_MAX_EXCL, 0, bytes, 0, 0],
            None => [0; 5],
        };
        let flags = if self.max_exclusive.is_some() {
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

/// Limit qgroup `qgroupid` (0: the subvolume at `path` itself) to `max` bytes of
/// the `kind` count, or lift that limit with `None`.
pub fn limit_qgroup(
    path: &Path,
    qgroupid: u64,
    kind: QgroupLimitKind,
    max: Option<u64>,
) -> Result<(), StoreError> {
    let dir = open(path)?;
    // u64::MAX (the kernel's CLEAR_VALUE) lifts the limit; 0 would mean 0 bytes.
    let value = max.unwrap_or(u64::MAX);
    let mut lim = QgroupLimit {
        flags: kind.flag(),
        ..QgroupLimit::default()
    };
    match kind {
        QgroupLimitKind::Referenced => lim.max_rfer = value,
        QgroupLimitKind::Exclusive => lim.max_excl = value,
    }
    let mut args = QgroupLimitArgs { qgroupid, lim };
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
                LIMIT_MAX_EXCL,
                0,
                1 << 30,
                0,
                0,
                SESSIONS_QGROUP
            ]
        );
        assert_eq!(SESSIONS_QGROUP, 0x0001_0000_0000_0001);
    }
}
