use std::fs;
use std::path::PathBuf;

use drums_eval::plots::{draw, DensityPoint, Figures, StrategyBar};

const FILES: [(&str, &str, &[&str]); 5] = [
    (
        "correctness.svg",
        "Correct recoveries by strategy",
        &["<rect"],
    ),
    ("traffic.svg", "Checkpoint traffic by strategy", &["<rect"]),
    (
        "density.svg",
        "Exposed checkpoint delay by density",
        &["<polyline", "<circle"],
    ),
    (
        "time.svg",
        "Total time vs. fault-free run",
        &["<rect", "<polyline"],
    ),
    (
        "proxy-overhead.svg",
        "Proxy overhead per request",
        &["<polyline"],
    ),
];
const CAPTION: &str = "drums 0.1.0 @ abc1234, 32 traces, 210 faults, seed 1";

fn bar(strategy: &str, correct: usize, runs: usize, bytes: u64, time_ratio: f64) -> StrategyBar {
    StrategyBar {
        strategy: strategy.into(),
        correct,
        runs,
        bytes,
        time_ratio,
    }
}

fn point(sessions: usize, p50: f64, p95: f64, time_ratio: f64) -> DensityPoint {
    DensityPoint {
        sessions,
        exposed_p50: p50,
        exposed_p95: p95,
        time_ratio,
    }
}

/// Log-normal-ish samples from a fixed LCG: a long tail, so the x axis goes log.
fn overheads(n: usize) -> Vec<f64> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            40.0 * (6.0 * u - 1.0).exp()
        })
        .collect()
}

/// `empty` names the figures that must say "no data" and may have no data element.
fn check(files: &[PathBuf], empty: &[&str]) -> Vec<String> {
    let names: Vec<_> = files
        .iter()
        .map(|f| f.file_name().unwrap().to_str().unwrap())
        .collect();
    assert_eq!(names, FILES.map(|(n, _, _)| n));
    files
        .iter()
        .zip(FILES)
        .map(|(file, (name, title, elements))| {
            let svg = fs::read_to_string(file).unwrap();
            assert!(svg.starts_with("<svg"), "{file:?} is not SVG");
            assert!(svg.trim_end().ends_with("</svg>"), "{file:?} is truncated");
            assert!(svg.contains("width=\"800\"") && svg.contains("height=\"500\""));
            assert!(svg.contains(title), "{file:?} lacks its title");
            assert!(svg.contains(CAPTION), "{file:?} lacks the caption");
            assert!(svg.len() > 2500, "{file:?} is only {} bytes", svg.len());
            if !empty.contains(&name) {
                for e in elements {
                    // The background is a <rect> too.
                    let min = if *e == "<rect" { 2 } else { 1 };
                    assert!(svg.matches(e).count() >= min, "{file:?} has no {e}");
                }
                assert!(!svg.contains("no data"), "{file:?} says no data");
            } else {
                assert!(svg.contains("no data"), "{file:?} does not say no data");
            }
            svg
        })
        .collect()
}

/// With PLOTS_KEEP=DIR, copies the figures there as TAG-NAME.svg to look at.
fn keep(files: &[PathBuf], tag: &str) {
    if let Ok(dir) = std::env::var("PLOTS_KEEP") {
        for f in files {
            let name = format!("{tag}-{}", f.file_name().unwrap().to_str().unwrap());
            fs::copy(f, PathBuf::from(&dir).join(name)).unwrap();
        }
    }
}

#[test]
fn draws_every_figure() {
    let dir = tempfile::tempdir().unwrap();
    let strategies = [
        bar("chat-only", 12, 42, 3 * 1024, 1.004),
        bar("chat+files", 27, 42, 18 << 20, 1.011),
        bar("full", 41, 42, 2300 << 20, 1.094),
        bar("selective", 40, 42, 310 << 20, 1.018),
        bar("restart", 9, 42, 0, 1.35),
    ];
    let density = [
        point(4, 0.003, 0.008, 1.006),
        point(1, 0.001, 0.004, 1.002),
        point(16, 0.006, 0.014, 1.017),
        point(24, 0.009, 0.023, 1.028),
    ];
    let us = overheads(2000);
    let f = Figures {
        strategies: &strategies,
        density: &density,
        proxy_overhead_us: &us,
        caption: CAPTION,
    };
    let out = dir.path().join("figures");
    let files = draw(&out, &f).unwrap();
    let svgs = check(&files, &[]);
    assert!(svgs[0].contains("41/42") && !svgs[0].contains("0/0"));
    assert!(
        svgs[1].contains("0 B") && svgs[1].contains("log"),
        "traffic spread is over 100x"
    );
    assert!(svgs[2].contains("1% target") && svgs[2].contains("p95 over turns"));
    assert!(svgs[3].contains("+2% target") && svgs[3].contains("+35%"));
    assert!(svgs[4].contains("p50 = ") && svgs[4].contains("log"));
    keep(&files, "sample");
}

#[test]
fn empty_data_draws_axes_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let f = Figures {
        strategies: &[],
        density: &[],
        proxy_overhead_us: &[],
        caption: CAPTION,
    };
    let files = draw(dir.path(), &f).unwrap();
    check(&files, &FILES.map(|(n, _, _)| n));
    keep(&files, "empty");
}

#[test]
fn single_points_zeros_and_nan_do_not_panic() {
    let dir = tempfile::tempdir().unwrap();
    let one = [bar("full", 0, 0, 0, f64::NAN)];
    let density = [point(8, f64::NAN, 0.0, f64::NAN)];
    let f = Figures {
        strategies: &one,
        density: &density,
        proxy_overhead_us: &[f64::NAN, 0.0],
        caption: CAPTION,
    };
    let nothing = ["correctness.svg", "time.svg"];
    let files = draw(dir.path(), &f).unwrap();
    let svgs = check(&files, &nothing);
    keep(&files, "nan");
    assert!(svgs[0].contains("0/0") && svgs[3].contains("n/a"));

    let one = [bar("restart", 3, 4, 5 << 20, 1.0)];
    let density = [point(1, 0.002, 0.02, 1.01)];
    let f = Figures {
        strategies: &one,
        density: &density,
        proxy_overhead_us: &[12.5],
        caption: CAPTION,
    };
    let files = draw(&dir.path().join("one"), &f).unwrap();
    check(&files, &[]);
    keep(&files, "one");
}

#[test]
fn same_values_and_zero_spread() {
    let dir = tempfile::tempdir().unwrap();
    let same = [bar("a", 1, 1, 7, 1.0), bar("b", 1, 1, 7, 0.97)];
    let density = [point(2, 0.0, 0.0, 1.0), point(2, 0.0, 0.0, 1.0)];
    let f = Figures {
        strategies: &same,
        density: &density,
        proxy_overhead_us: &[0.0, 0.0, 0.0],
        caption: CAPTION,
    };
    let files = draw(dir.path(), &f).unwrap();
    check(&files, &[]);
    keep(&files, "same");
}
