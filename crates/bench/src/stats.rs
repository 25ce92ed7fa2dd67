//! The statistics every bench and the evaluation report with: nearest-rank
//! percentiles, p50/p95, paired ratios, a least-squares slope. One copy, so
//! that two tables never disagree on what a p95 is.

/// Nearest-rank percentile (`p` in 0..=100) of sorted samples; NaN if none.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The samples sorted (a NaN sorts last instead of panicking).
pub fn sorted(v: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Nearest-rank percentile of unsorted samples.
pub fn pct(v: &[f64], p: f64) -> f64 {
    percentile(&sorted(v.iter().copied()), p)
}

/// p50 and p95 of unsorted samples.
pub fn p50_p95(v: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let v = sorted(v);
    (percentile(&v, 50.0), percentile(&v, 95.0))
}

/// `KEY.p50` and `KEY.p95` of `samples` into a bench's JSON, and the
/// samples themselves under `samples.KEY`: `--ab` pools them over its
/// segments (ab.rs), so its p95 is one of all the samples, not a median of
/// p95s. Nothing for no samples.
pub fn put_p50_p95(
    out: &mut serde_json::Map<String, serde_json::Value>,
    key: &str,
    samples: &[f64],
) {
    if samples.is_empty() {
        return;
    }
    let (p50, p95) = p50_p95(samples.iter().copied());
    out.insert(format!("{key}.p50"), serde_json::json!(p50));
    out.insert(format!("{key}.p95"), serde_json::json!(p95));
    let all = out
        .entry("samples")
        .or_insert_with(|| serde_json::json!({}));
    if let Some(all) = all.as_object_mut() {
        all.insert(key.to_owned(), serde_json::json!(samples));
    }
}

/// The median over rounds of `a / b` in the same round: the noise of one
/// moment hits both arms of a round alike, so this is steadier than a ratio
/// of medians when the machine's speed drifts during the run.
pub fn paired(a: &[f64], b: &[f64]) -> f64 {
    pct(
        &a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>(),
        50.0,
    )
}

/// Least-squares slope of y over x.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let num: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    let den: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    num / den
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 95.0), 10.0);
        assert_eq!(percentile(&[3.0], 95.0), 3.0);
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(p50_p95([10.0, 1.0, 5.0, 2.0]), (2.0, 10.0));
        assert_eq!(paired(&[2.0, 9.0, 4.0], &[1.0, 3.0, 4.0]), 2.0);
        assert!((slope(&[(0.0, 10.0), (1.0, 12.0), (4.0, 18.0), (8.0, 26.0)]) - 2.0).abs() < 1e-9);
    }
}
