//! The capabilities a session keeps: runc's default set, and nothing else.
//!
//! Applied to the bounding set (and the inheritable and ambient sets) just
//! before stage 1 re-executes itself as stage 2: at that `execve` a root
//! process's permitted and effective sets become the bounding set, so PID 1,
//! the guest agent and everything they start hold these 14 and can never
//! regain another. CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_PTRACE,
//! CAP_SYS_MODULE, CAP_DAC_READ_SEARCH and the rest are gone.

use caps::{CapSet, Capability, CapsHashSet};

/// runc's (and Docker's) default: what a root process inside a container
/// needs to act as root on its own files and processes, and no more.
pub const KEPT: &[Capability] = &[
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_FSETID,
    Capability::CAP_FOWNER,
    Capability::CAP_MKNOD,
    Capability::CAP_NET_RAW,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETFCAP,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_KILL,
    Capability::CAP_AUDIT_WRITE,
];

#[derive(Debug, thiserror::Error)]
#[error("capabilities: {op}")]
pub struct CapsError {
    op: String,
    #[source]
    source: caps::errors::CapsError,
}

fn op(op: impl Into<String>) -> impl FnOnce(caps::errors::CapsError) -> CapsError {
    let op = op.into();
    move |source| CapsError { op, source }
}

/// Drop every capability but [`KEPT`] from the bounding set, and make the
/// inheritable set [`KEPT`] and the ambient set empty. Needs CAP_SETPCAP,
/// which stage 1 still has.
pub fn restrict() -> Result<(), CapsError> {
    let kept: CapsHashSet = KEPT.iter().copied().collect();
    for cap in caps::all() {
        if !kept.contains(&cap) && caps::has_cap(None, CapSet::Bounding, cap).unwrap_or(false) {
            caps::drop(None, CapSet::Bounding, cap)
                .map_err(op(format!("drop {cap} from the bounding set")))?;
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(op("clear the ambient set"))?;
    let inheritable: CapsHashSet = caps::read(None, CapSet::Inheritable)
        .map_err(op("read the inheritable set"))?
        .intersection(&kept)
        .copied()
        .collect();
    caps::set(None, CapSet::Inheritable, &inheritable).map_err(op("set the inheritable set"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_is_runcs_fourteen() {
        assert_eq!(KEPT.len(), 14);
        for dangerous in [
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_NET_ADMIN,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_SYS_MODULE,
            Capability::CAP_DAC_READ_SEARCH,
            Capability::CAP_SYS_RAWIO,
            Capability::CAP_BPF,
            Capability::CAP_SYS_BOOT,
        ] {
            assert!(!KEPT.contains(&dangerous), "{dangerous}");
        }
    }

    /// In a forked child, as root: after restrict and an exec, the process
    /// holds exactly the kept set.
    #[test]
    fn restrict_then_exec_leaves_the_kept_set() {
        if !nix::unistd::geteuid().is_root() {
            panic!("this test needs root (it drops capabilities); CI runs it as root. NOT SKIPPED: failing on purpose");
        }
        let out = std::process::Command::new("/bin/sh")
            .args(["-c", "grep -E '^Cap(Eff|Bnd):' /proc/self/status"])
            .env_clear()
            .pre_exec_restrict()
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let want: u64 = KEPT.iter().map(|c| 1u64 << c.index()).sum();
        for line in text.lines() {
            let hex = line.split_whitespace().nth(1).unwrap();
            assert_eq!(u64::from_str_radix(hex, 16).unwrap(), want, "{line}");
        }
    }

    trait PreExecRestrict {
        fn pre_exec_restrict(&mut self) -> &mut Self;
    }
    impl PreExecRestrict for std::process::Command {
        fn pre_exec_restrict(&mut self) -> &mut Self {
            use std::os::unix::process::CommandExt;
            // SAFETY: restrict makes only prctl/capset calls, which are
            // async-signal-safe, between fork and exec.
            unsafe { self.pre_exec(|| restrict().map_err(std::io::Error::other)) }
        }
    }
}
