//! Sizes as people write them ("512M", "2G", "1.5G", "4096"), shared by the CLI
//! and drumsd's config so both accept and refuse exactly the same strings.

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("invalid size {0:?}: use bytes or a number with K, M, G or T")]
    NotANumber(String),
    #[error("invalid size {0:?}: must be a positive, finite number")]
    NotPositive(String),
    #[error("invalid size {0:?}: exceeds the largest size of 2^64 - 1 bytes")]
    TooLarge(String),
}

/// Parse a size in bytes with an optional binary suffix K, M, G or T. Zero,
/// negative, NaN, infinite and sizes beyond `u64` are refused, never clamped: a
/// silently saturated size would turn a typo into "unlimited".
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    // Plain integers are parsed exactly; f64 would round above 2^53.
    if let Ok(n) = num.parse::<u64>() {
        if n == 0 {
            return Err(SizeError::NotPositive(s.to_owned()));
        }
        return n
            .checked_mul(mult)
            .ok_or_else(|| SizeError::TooLarge(s.to_owned()));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| SizeError::NotANumber(s.to_owned()))?;
    if !(n.is_finite() && n > 0.0) {
        return Err(SizeError::NotPositive(s.to_owned()));
    }
    let bytes = n * mult as f64;
    // 2^64 is exactly representable; anything at or above it does not fit.
    if bytes >= 18_446_744_073_709_551_616.0 {
        return Err(SizeError::TooLarge(s.to_owned()));
    }
    if bytes < 1.0 {
        return Err(SizeError::NotPositive(s.to_owned()));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_bytes_and_suffixes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2T").unwrap(), 2 << 40);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("18446744073709551615").unwrap(), u64::MAX);
    }

    #[test]
    fn refuses_zero_nan_inf_negative_and_overflow() {
        for bad in [
            "0", "0G", "0.0", "-1M", "nan", "NaNG", "inf", "infinity", "-inf",
        ] {
            assert!(
                matches!(parse_size(bad), Err(SizeError::NotPositive(_))),
                "{bad:?}: {:?}",
                parse_size(bad)
            );
        }
        for big in ["18446744073709551616", "16777216T", "1e30", "1e300G"] {
            assert!(
                matches!(parse_size(big), Err(SizeError::TooLarge(_))),
                "{big:?}: {:?}",
                parse_size(big)
            );
        }
        for junk in ["", "lots", "1X", "G", "1 G B"] {
            assert!(parse_size(junk).is_err(), "{junk:?}");
        }
        assert_eq!(
            parse_size("nan").unwrap_err().to_string(),
            "invalid size \"nan\": must be a positive, finite number"
        );
    }
}
