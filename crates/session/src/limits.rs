//! The limits a session runs with: what its request names, else drumsd's
//! defaults; for a restored sibling, what its checkpoint's manifest names, else
//! the same defaults. Every session therefore has a memory, pids, cpu and disk
//! limit unless drumsd's own config turns a default off.

use drums_api::Limits;

/// The smallest disk quota accepted: the guest agent, a shell's history and
/// apt's lists need a few MiB of the writable layer before anything useful runs.
pub const MIN_DISK_BYTES: u64 = 16 << 20;

/// The smallest pids limit accepted: PID 1, the guest agent's threads and a
/// command to run. Below it a create fails in `fork` (EAGAIN), which is the
/// caller's mistake, not drumsd's.
pub const MIN_PIDS: u64 = 32;

/// The smallest pids limit a desktop is created with. Measured on the CI
/// host: Xvfb, dbus, openbox, Chromium (its zygotes, GPU and network
/// services, one renderer and their threads), the OSWorld server and the
/// guest agent peak at about 80 tasks once the desktop is ready; at 64 Chromium
/// stops answering DevTools and at 48 its `pthread_create` fails (EAGAIN).
/// 256 leaves room for a few tabs and a command or two; below it a create
/// would fail inside the guest (500), which is the caller's mistake.
pub const MIN_DESKTOP_PIDS: u64 = 256;

/// The smallest memory limit a desktop is created with. Measured the same way:
/// a ready desktop holds about 130 MiB of anonymous memory and 280 MiB of page
/// cache (which the limit counts, and the kernel reclaims first); at 128 MiB
/// Chromium is OOM-killed before DevTools answers, at 192 MiB it starts with
/// nothing to spare. 512 MiB leaves room for a page to load and a fork's
/// restore to run under the same limit.
pub const MIN_DESKTOP_MEMORY_BYTES: u64 = 512 << 20;

/// drumsd's defaults, and what bounds a disk quota.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitPolicy {
    /// Applied field by field where a request or manifest names none.
    pub defaults: Limits,
    /// What all sessions together may hold on the store (its size minus the
    /// reserve kept for drumsd); one session's quota above it would be a promise
    /// the store cannot keep.
    pub max_disk_bytes: u64,
}

/// Why a set of limits was refused.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    #[error(transparent)]
    Cgroup(#[from] drums_cgroup::LimitsError),
    #[error("pids limit {pids} is below the minimum of {MIN_PIDS}")]
    PidsTooFew { pids: u64 },
    #[error(
        "the desktop profile needs a pids limit of at least {MIN_DESKTOP_PIDS} \
         (Xvfb and Chromium run about 80 tasks), not {pids}"
    )]
    DesktopPidsTooFew { pids: u64 },
    #[error(
        "the desktop profile needs a memory limit of at least 512 MiB \
         (Xvfb and Chromium hold about 400 MiB), not {bytes} bytes"
    )]
    DesktopMemoryTooSmall { bytes: u64 },
    #[error("disk limit {bytes} bytes is below the minimum of 16 MiB")]
    DiskTooSmall { bytes: u64 },
    #[error("disk limit {bytes} bytes exceeds the {max} bytes the store holds for sessions")]
    DiskTooLarge { bytes: u64, max: u64 },
}

/// Why a checkpoint's manifest gives no usable limits.
#[derive(Debug, thiserror::Error)]
pub enum ManifestLimitsError {
    #[error("unreadable")]
    Unreadable(#[source] serde_json::Error),
    #[error("not applicable on this host")]
    Invalid(#[source] LimitsError),
}

impl LimitPolicy {
    /// `given`, with each missing field taken from the defaults, validated.
    pub fn effective(&self, given: &Limits) -> Result<Limits, LimitsError> {
        let d = &self.defaults;
        let limits = Limits {
            memory_bytes: given.memory_bytes.or(d.memory_bytes),
            pids_max: given.pids_max.or(d.pids_max),
            cpus: given.cpus.or(d.cpus),
            disk_bytes: given.disk_bytes.or(d.disk_bytes),
        };
        self.validate(&limits)?;
        Ok(limits)
    }

    pub fn validate(&self, l: &Limits) -> Result<(), LimitsError> {
        cgroup_limits(l).validate()?;
        if let Some(pids) = l.pids_max.filter(|p| *p < MIN_PIDS) {
            return Err(LimitsError::PidsTooFew { pids });
        }
        if let Some(bytes) = l.disk_bytes {
            if bytes < MIN_DISK_BYTES {
                return Err(LimitsError::DiskTooSmall { bytes });
            }
            if bytes > self.max_disk_bytes {
                return Err(LimitsError::DiskTooLarge {
                    bytes,
                    max: self.max_disk_bytes,
                });
            }
        }
        Ok(())
    }

    /// [`LimitPolicy::effective`] for a new session of `profile`: a profile
    /// that starts more than a shell needs more than the general minimums, and
    /// a create below them is refused before anything is made. Restores are
    /// not checked: a checkpoint's processes already ran within its limits.
    pub fn effective_for(
        &self,
        profile: drums_api::Profile,
        given: &Limits,
    ) -> Result<Limits, LimitsError> {
        let limits = self.effective(given)?;
        if profile == drums_api::Profile::Desktop {
            if let Some(pids) = limits.pids_max.filter(|p| *p < MIN_DESKTOP_PIDS) {
                return Err(LimitsError::DesktopPidsTooFew { pids });
            }
            let memory = limits.memory_bytes;
            if let Some(bytes) = memory.filter(|b| *b < MIN_DESKTOP_MEMORY_BYTES) {
                return Err(LimitsError::DesktopMemoryTooSmall { bytes });
            }
        }
        Ok(limits)
    }

    /// The limits of a sibling restored from a manifest whose `limits` is
    /// `value`: the checkpoint's own, the defaults where it names none (older
    /// manifests, or `null`). A value that does not parse is an error, never
    /// "no limits".
    pub fn from_manifest(&self, value: &serde_json::Value) -> Result<Limits, ManifestLimitsError> {
        let given: Limits = if value.is_null() {
            Limits::default()
        } else {
            serde_json::from_value(value.clone()).map_err(ManifestLimitsError::Unreadable)?
        };
        self.effective(&given).map_err(ManifestLimitsError::Invalid)
    }
}

/// The part of the limits cgroups enforce.
pub fn cgroup_limits(l: &Limits) -> drums_cgroup::Limits {
    drums_cgroup::Limits {
        memory_bytes: l.memory_bytes,
        pids_max: l.pids_max,
        cpus: l.cpus,
    }
}

/// A policy for unit tests: defaults a desktop fits in.
#[cfg(test)]
pub(crate) fn test_policy() -> LimitPolicy {
    LimitPolicy {
        defaults: Limits {
            memory_bytes: Some(4 << 30),
            pids_max: Some(2048),
            cpus: Some(1.0),
            disk_bytes: Some(10 << 30),
        },
        max_disk_bytes: 50 << 30,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy() -> LimitPolicy {
        test_policy()
    }

    #[test]
    fn defaults_fill_what_is_missing() {
        let p = policy();
        assert_eq!(p.effective(&Limits::default()).unwrap(), p.defaults);
        let mine = Limits {
            memory_bytes: Some(256 << 20),
            disk_bytes: Some(1 << 30),
            ..Limits::default()
        };
        let l = p.effective(&mine).unwrap();
        assert_eq!(l.memory_bytes, Some(256 << 20));
        assert_eq!(l.pids_max, Some(2048));
        assert_eq!(l.cpus, Some(1.0));
        assert_eq!(l.disk_bytes, Some(1 << 30));
        // A default turned off stays off.
        let none = LimitPolicy {
            defaults: Limits::default(),
            ..policy()
        };
        assert_eq!(
            none.effective(&Limits::default()).unwrap(),
            Limits::default()
        );
    }

    #[test]
    fn a_pids_limit_too_small_to_start_is_refused() {
        let p = policy();
        for pids in [1, MIN_PIDS - 1] {
            let l = Limits {
                pids_max: Some(pids),
                ..Limits::default()
            };
            let e = p.effective(&l).unwrap_err().to_string();
            assert!(e.contains("below the minimum of 32"), "{pids}: {e}");
        }
        let l = Limits {
            pids_max: Some(MIN_PIDS),
            ..Limits::default()
        };
        p.effective(&l).unwrap();
    }

    #[test]
    fn a_desktop_needs_more_than_a_shell() {
        let p = policy();
        let small = |pids, memory| Limits {
            pids_max: Some(pids),
            memory_bytes: Some(memory),
            ..Limits::default()
        };
        for (l, msg) in [
            (
                small(MIN_DESKTOP_PIDS - 1, 1 << 30),
                "needs a pids limit of at least 256",
            ),
            (
                small(MIN_PIDS, 1 << 30),
                "needs a pids limit of at least 256",
            ),
            (
                small(2048, MIN_DESKTOP_MEMORY_BYTES - 1),
                "needs a memory limit of at least 512 MiB",
            ),
            (
                small(2048, 8 << 20),
                "needs a memory limit of at least 512 MiB",
            ),
        ] {
            let e = p
                .effective_for(drums_api::Profile::Desktop, &l)
                .unwrap_err()
                .to_string();
            assert!(e.contains(msg), "{l:?}: {e}");
            // A headless session starts with as little.
            p.effective_for(drums_api::Profile::Headless, &l).unwrap();
        }
        p.effective_for(
            drums_api::Profile::Desktop,
            &small(MIN_DESKTOP_PIDS, MIN_DESKTOP_MEMORY_BYTES),
        )
        .unwrap();
        // Defaults count: a daemon whose default is too small for a desktop
        // refuses a desktop that names no limits.
        let tight = LimitPolicy {
            defaults: Limits {
                pids_max: Some(100),
                ..p.defaults.clone()
            },
            ..p
        };
        let e = tight
            .effective_for(drums_api::Profile::Desktop, &Limits::default())
            .unwrap_err();
        assert!(e.to_string().contains("not 100"), "{e}");
    }

    #[test]
    fn disk_limits_are_bounded() {
        let p = policy();
        for (bytes, msg) in [
            (0, "below the minimum of 16 MiB"),
            (MIN_DISK_BYTES - 1, "below the minimum"),
            ((50 << 30) + 1, "exceeds the 53687091200 bytes"),
            (u64::MAX, "exceeds"),
        ] {
            let l = Limits {
                disk_bytes: Some(bytes),
                ..Limits::default()
            };
            let e = p.effective(&l).unwrap_err().to_string();
            assert!(e.contains(msg), "{bytes}: {e}");
        }
        let l = Limits {
            disk_bytes: Some(MIN_DISK_BYTES),
            ..Limits::default()
        };
        p.effective(&l).unwrap();
    }

    #[test]
    fn manifests_keep_their_limits_and_get_defaults_for_none() {
        let p = policy();
        let l = p
            .from_manifest(&json!({"memory_bytes": 268435456, "disk_bytes": 1073741824}))
            .unwrap();
        assert_eq!(l.memory_bytes, Some(256 << 20));
        assert_eq!(l.disk_bytes, Some(1 << 30));
        assert_eq!(l.pids_max, Some(2048));
        assert_eq!(p.from_manifest(&json!({})).unwrap(), p.defaults);
        assert_eq!(p.from_manifest(&json!(null)).unwrap(), p.defaults);
    }

    #[test]
    fn unreadable_or_impossible_manifest_limits_are_errors() {
        let p = policy();
        for bad in [
            json!({"memory_bytes": "lots"}),
            json!({"memory_bytes": -1}),
            json!({"swap": 1}),
            json!(true),
            json!("none"),
        ] {
            assert!(
                matches!(
                    p.from_manifest(&bad),
                    Err(ManifestLimitsError::Unreadable(_))
                ),
                "{bad}"
            );
        }
        let e = p.from_manifest(&json!({"memory_bytes": 1000})).unwrap_err();
        assert!(matches!(e, ManifestLimitsError::Invalid(_)), "{e}");
    }
}
