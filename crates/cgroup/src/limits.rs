//! Resource limits of a session and their validation.

/// The smallest memory limit accepted: below this a shell and a few tools do not
/// start, and the session would die of OOM kills in ways that are hard to explain.
pub const MIN_MEMORY_BYTES: u64 = 8 << 20;
/// PID_MAX_LIMIT on 64-bit kernels: pids.max rejects anything larger.
pub const MAX_PIDS: u64 = 4 << 20;
pub use drums_api::MIN_CPUS;

/// Resource limits of one session; `None` leaves a resource unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub pids_max: Option<u64>,
    /// CPU time as a number of CPUs (0.5 = half of one CPU), enforced as a CFS quota.
    pub cpus: Option<f64>,
}

/// Why a [`Limits`] value was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitsError {
    #[error("memory limit {bytes} bytes is below the minimum of 8 MiB")]
    MemoryTooSmall { bytes: u64 },
    #[error("pids limit {pids} is below the minimum of 1")]
    PidsTooSmall { pids: u64 },
    #[error("pids limit {pids} exceeds the maximum of {max}", max = MAX_PIDS)]
    PidsTooLarge { pids: u64 },
    /// The one CPU check the CLI and drumsd's config share.
    #[error(transparent)]
    Cpus(#[from] drums_api::CpusError),
}

impl Limits {
    /// Check the limits against what the kernel accepts and what this host has.
    pub fn validate(&self) -> Result<(), LimitsError> {
        self.validate_for(host_cpus())
    }

    /// [`Limits::validate`] for a host with `host_cpus` CPUs.
    pub fn validate_for(&self, host_cpus: u64) -> Result<(), LimitsError> {
        if let Some(bytes) = self.memory_bytes {
            if bytes < MIN_MEMORY_BYTES {
                return Err(LimitsError::MemoryTooSmall { bytes });
            }
        }
        if let Some(pids) = self.pids_max {
            if pids < 1 {
                return Err(LimitsError::PidsTooSmall { pids });
            }
            if pids > MAX_PIDS {
                return Err(LimitsError::PidsTooLarge { pids });
            }
        }
        if let Some(cpus) = self.cpus {
            drums_api::check_cpus(cpus, Some(host_cpus))?;
        }
        Ok(())
    }

    /// The CFS quota in microseconds per [`CPU_PERIOD_US`] for `cpus`.
    pub(crate) fn cpu_quota_us(cpus: f64) -> u64 {
        ((cpus * CPU_PERIOD_US as f64).round() as u64).max(1000)
    }
}

/// Caps on the parent cgroup: what all sessions together may use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParentCaps {
    pub memory_bytes: Option<u64>,
    pub pids_max: Option<u64>,
}

impl ParentCaps {
    /// The default share of the host: three quarters of its RAM and of the
    /// tasks it can run. The last quarter keeps the host, drumsd and its CRIU
    /// runs alive when every session is at its limit at once: the kernel then
    /// OOM-kills inside the sessions' cgroups, never on the host.
    pub fn host_share() -> ParentCaps {
        ParentCaps {
            memory_bytes: host_memory_bytes().map(|m| m / 4 * 3),
            pids_max: Some((host_pids_max() / 4 * 3).clamp(1, MAX_PIDS)),
        }
    }

    pub fn validate(&self) -> Result<(), LimitsError> {
        Limits {
            memory_bytes: self.memory_bytes,
            pids_max: self.pids_max,
            cpus: None,
        }
        .validate()
    }
}

/// MemTotal of /proc/meminfo in bytes, if readable.
pub fn host_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&text)
}

/// MemAvailable of /proc/meminfo in bytes (what the kernel estimates new
/// work can have without swapping), if readable.
pub fn host_memory_available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, "MemAvailable:")
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    parse_meminfo(meminfo, "MemTotal:")
}

fn parse_meminfo(meminfo: &str, field: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(field))?;
    let mut words = line.split_whitespace().skip(1);
    let kib: u64 = words.next()?.parse().ok()?;
    (words.next() == Some("kB")).then_some(kib.checked_mul(1024)?)
}

/// How many tasks the host can have: the smaller of kernel.pid_max and
/// kernel.threads-max (pids.max counts threads, and threads-max is what runs out
/// first on most machines).
pub fn host_pids_max() -> u64 {
    let read = |f: &str| -> Option<u64> { std::fs::read_to_string(f).ok()?.trim().parse().ok() };
    [
        read("/proc/sys/kernel/pid_max"),
        read("/proc/sys/kernel/threads-max"),
    ]
    .into_iter()
    .flatten()
    .min()
    .unwrap_or(32_768)
}

/// The CFS period: 100 ms, the kernel's default.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

/// CPUs online on the host (not the daemon's affinity or quota: sessions are
/// limited against the machine, not against the daemon).
pub fn host_cpus() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions; it only reads a value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 {
        n as u64
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_parses_kib() {
        let text = "MemTotal:       24522340 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total(text), Some(24_522_340 * 1024));
        assert_eq!(parse_mem_total("MemTotal: 12 MB\n"), None);
        assert_eq!(parse_mem_total(""), None);
    }

    #[test]
    fn the_host_share_is_three_quarters() {
        let caps = ParentCaps::host_share();
        let mem = host_memory_bytes().unwrap();
        assert_eq!(caps.memory_bytes, Some(mem / 4 * 3));
        assert!(caps.pids_max.unwrap() < host_pids_max());
        caps.validate().unwrap();
    }

    #[test]
    fn quota_rounds_and_respects_the_kernel_minimum() {
        assert_eq!(Limits::cpu_quota_us(0.5), 50_000);
        assert_eq!(Limits::cpu_quota_us(2.0), 200_000);
        assert_eq!(Limits::cpu_quota_us(0.01), 1_000);
        assert_eq!(Limits::cpu_quota_us(0.012_345), 1_235);
    }
}
