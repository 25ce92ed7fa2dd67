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
