//! CPU limits as people write them ("0.5", "2"), checked by one function that
//! the CLI, drumsd's config and the cgroup layer all call, so each accepts and
//! refuses exactly the same values.

/// The smallest CPU share: cpu.cfs_quota_us (and cpu.max) refuse quotas under
/// 1 ms, which is 0.01 of the 100 ms period used here.
pub const MIN_CPUS: f64 = 0.01;

/// Why a CPU limit was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CpusError {
    #[error("invalid cpu limit {0:?}: expected a number such as 0.5")]
    NotANumber(String),
    #[error("cpu limit {cpus} is not a finite number")]
    NotFinite { cpus: f64 },
    #[error("cpu limit {cpus} is below the minimum of 0.01")]
    TooSmall { cpus: f64 },
    #[error("cpu limit {cpus} exceeds the {host} cpus of this host")]
    TooLarge { cpus: f64, host: u64 },
}

/// Check a CPU limit. `host_cpus` bounds it where the caller knows the host
/// (drumsd); a client that does not leaves that bound to the daemon. NaN and
/// infinity must be refused here: JSON cannot carry them, so a client that
/// sent one would send `null`, which means "the default", not an error.
pub fn check_cpus(cpus: f64, host_cpus: Option<u64>) -> Result<(), CpusError> {
    if !cpus.is_finite() {
        return Err(CpusError::NotFinite { cpus });
    }
    if cpus < MIN_CPUS {
        return Err(CpusError::TooSmall { cpus });
    }
    // A quota above the host's CPU count limits nothing; refusing it tells
    // the caller their request cannot be met rather than silently ignoring it.
    if let Some(host) = host_cpus {
        if cpus > host as f64 {
            return Err(CpusError::TooLarge { cpus, host });
        }
    }
    Ok(())
}

/// Parse and [`check_cpus`] a CPU limit written on a command line.
pub fn parse_cpus(s: &str, host_cpus: Option<u64>) -> Result<f64, CpusError> {
    let cpus: f64 = s
        .trim()
        .parse()
        .map_err(|_| CpusError::NotANumber(s.to_owned()))?;
    check_cpus(cpus, host_cpus)?;
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_json_cannot_carry_and_what_cgroups_refuse() {
        assert_eq!(parse_cpus("0.5", None).unwrap(), 0.5);
        assert_eq!(parse_cpus(" 2 ", Some(2)).unwrap(), 2.0);
        for bad in ["inf", "-inf", "nan", "NaN", "infinity"] {
            assert!(
                matches!(parse_cpus(bad, None), Err(CpusError::NotFinite { .. })),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse_cpus("0.001", None),
            Err(CpusError::TooSmall { .. })
        ));
        assert!(matches!(
            parse_cpus("-1", None),
            Err(CpusError::TooSmall { .. })
        ));
        assert!(matches!(
            parse_cpus("3", Some(2)),
            Err(CpusError::TooLarge { cpus, host: 2 }) if cpus == 3.0
        ));
        assert!(matches!(
            parse_cpus("lots", None),
            Err(CpusError::NotANumber(_))
        ));
        assert_eq!(
            parse_cpus("nan", None).unwrap_err().to_string(),
            "cpu limit NaN is not a finite number"
        );
    }
}
