//! The figures of `drums eval`, drawn in Rust (plotters, SVG) from the same
//! numbers as results.json: no Python or gnuplot step, and a figure cannot
//! disagree with the table beside it. Text is laid out with DejaVu Sans read at
//! run time (Debian `fonts-dejavu-core`) through plotters' pure-Rust `ab_glyph`
//! backend, so nothing links fontconfig or freetype.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::{fs, io};

use plotters::coord::ranged1d::{AsRangedCoord, DefaultFormatting, KeyPointHint, ValueFormatter};
use plotters::coord::{CoordTranslate, Shift};
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One strategy's outcome over the same traces and faults.
pub struct StrategyBar {
    pub strategy: String,
    /// Runs whose check passed and whose state equalled the fault-free run's.
    pub correct: usize,
    pub runs: usize,
    /// Checkpoint bytes written over all its runs.
    pub bytes: u64,
    /// Total wall time of its runs over the fault-free, checkpoint-free run's (1.0 = same).
    pub time_ratio: f64,
}

/// One density: `sessions` agents at once.
pub struct DensityPoint {
    pub sessions: usize,
    /// Exposed delay (from the model's answer to its release) as a share of turn time, p50 and p95 over turns (0.01 = 1%).
    pub exposed_p50: f64,
    pub exposed_p95: f64,
    /// Total time against the fault-free, checkpoint-free run at the same density (1.0 = same).
    pub time_ratio: f64,
}

pub struct Figures<'a> {
    pub strategies: &'a [StrategyBar],
    pub density: &'a [DensityPoint],
    /// Microseconds the proxy added per request, one sample per request (unsorted).
    pub proxy_overhead_us: &'a [f64],
    /// Shown under each title, e.g. "drums 0.1.0 @ abc1234, 32 traces, 210 faults, seed 1".
    pub caption: &'a str,
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("cannot load the plot font {} (Debian package fonts-dejavu-core)", path.display())]
    Font { path: PathBuf, source: io::Error },
    #[error("cannot create the figure directory {}", dir.display())]
    Dir { dir: PathBuf, source: io::Error },
    #[error("cannot draw {}", file.display())]
    Draw {
        file: PathBuf,
        source: DrawingAreaErrorKind<io::Error>,
    },
    #[error("cannot write {}", file.display())]
    Write { file: PathBuf, source: io::Error },
}

/// Draws every figure into `dir` and returns the files written, in this order:
/// correctness.svg, traffic.svg, density.svg, time.svg, proxy-overhead.svg.
pub fn draw(dir: &Path, f: &Figures) -> Result<Vec<PathBuf>, PlotError> {
    load_font()?;
    let dir_error = |source| PlotError::Dir {
        dir: dir.into(),
        source,
    };
    fs::create_dir_all(dir).map_err(dir_error)?;
    FIGURES
        .iter()
        .map(|&(name, title, body)| {
            let file = dir.join(format!("{name}.svg"));
            // Drawn into memory first so a failed figure leaves no half-written file.
            let mut svg = String::new();
            let drawn = render(&mut svg, title, f, body);
            drawn.map_err(|source| PlotError::Draw {
                file: file.clone(),
                source,
            })?;
            let written = fs::write(&file, svg);
            written.map_err(|source| PlotError::Write {
                file: file.clone(),
                source,
            })?;
            Ok(file)
        })
        .collect()
}

type Area<'b> = DrawingArea<SVGBackend<'b>, Shift>;
type DrawResult = Result<(), DrawingAreaErrorKind<io::Error>>;
type Figure = fn(&Area<'_>, &Figures<'_>) -> DrawResult;

const FIGURES: [(&str, &str, Figure); 5] = [
    ("correctness", "Correct recoveries by strategy", correctness),
    ("traffic", "Checkpoint traffic by strategy", traffic),
    ("density", "Exposed checkpoint delay by density", density),
    ("time", "Total time vs. fault-free run", time),
    ("proxy-overhead", "Proxy overhead per request", proxy),
];
const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const SIZE: (u32, u32) = (800, 500);
const GREY: RGBColor = RGBColor(100, 100, 100);
/// Goals and marked percentiles.
const ACCENT: RGBColor = RGBColor(200, 30, 30);
const PALETTE: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// plotters' `ab_glyph` backend keeps a process-wide table of `'static` font
/// bytes, so the file is read and leaked once. A Mutex rather than a OnceLock
/// because a failure must not be cached: installing the package is the fix.
fn load_font() -> Result<(), PlotError> {
    static LOADED: Mutex<bool> = Mutex::new(false);
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if !*loaded {
        let fail = |source| PlotError::Font {
            path: FONT_PATH.into(),
            source,
        };
        let bytes: &'static [u8] = Box::leak(fs::read(FONT_PATH).map_err(fail)?.into());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| {
            let kind = io::ErrorKind::InvalidData;
            fail(io::Error::new(kind, "not a TrueType/OpenType font"))
        })?;
        *loaded = true;
    }
    Ok(())
}

fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().color(&BLACK)
}

fn render(svg: &mut String, title: &str, f: &Figures, body: Figure) -> DrawResult {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, rest) = root.split_vertically(70);
    let (top, mid) = (Pos::new(HPos::Center, VPos::Top), SIZE.0 as i32 / 2);
    head.draw(&Text::new(title, (mid, 12), font(28).pos(top)))?;
    head.draw(&Text::new(
        f.caption,
        (mid, 46),
        font(16).color(&GREY).pos(top),
    ))?;
    body(&rest.margin(0, 8, 8, 20), f)?;
    root.present()
}

fn no_data<CT: CoordTranslate>(area: &DrawingArea<SVGBackend<'_>, CT>) -> DrawResult {
    let area = area.strip_coord_spec();
    let (w, h) = area.dim_in_pixel();
    let style = font(24)
        .color(&GREY)
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new("no data", (w as i32 / 2, h as i32 / 2), style))
}

fn legend<'a, 'b: 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, CT>,
    at: SeriesLabelPosition,
) -> DrawResult {
    let labels = &mut chart.configure_series_labels();
    let labels = labels
        .label_font(font(15))
        .background_style(WHITE.mix(0.85));
    labels.border_style(GREY).position(at).draw()
}

/// `n` evenly spaced categories (strategies, densities), the i-th centred on
/// `i as f64` with a tick of its own. plotters' segmented coordinates would do,
/// but they put a lone category outside the chart.
struct Categories(usize);

impl Ranged for Categories {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, (lo, hi): (i32, i32)) -> i32 {
        let share = (v + 0.5) / self.0.max(1) as f64;
        lo + (share * f64::from(hi - lo)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, _: H) -> Vec<f64> {
        (0..self.0).map(|i| i as f64).collect()
    }

    fn range(&self) -> Range<f64> {
        -0.5..self.0.max(1) as f64 - 0.5
    }
}

/// A chart over categories: bars, lines or both. `None` is a value that was
/// not a number, left out.
#[derive(Default)]
struct Chart<'s> {
    caption: Option<&'s str>,
    names: Vec<String>,
    x_desc: &'s str,
    y_desc: String,
    /// Ticks read as changes: +2, not 2.
    signed: bool,
    bars: Vec<Option<f64>>,
    /// Printed over each bar, or at `base` where there is none.
    labels: Vec<String>,
    /// Where bars start: 0, or the floor of a log axis, where zero cannot be drawn.
    base: f64,
    lines: Vec<(&'s str, RGBColor, Vec<Option<f64>>)>,
    target: Option<(f64, &'s str)>,
}

fn chart<Y>(area: &Area, c: &Chart, y: Y) -> DrawResult
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let slot = area.dim_in_pixel().0.saturating_sub(90) / c.names.len().max(1) as u32;
    let text = if slot < 90 { 13 } else { 15 };
    let mut builder = ChartBuilder::on(area);
    if let Some(caption) = c.caption {
        builder.caption(caption, font(18));
    }
    let builder = builder
        .x_label_area_size(45)
        .y_label_area_size(70)
        .margin(8);
    let mut chart = builder.build_cartesian_2d(Categories(c.names.len()), y)?;
    let name = |v: &f64| c.names.get(v.round() as usize).cloned().unwrap_or_default();
    let tick = |v: &f64| match c.signed && *v > 0.0 {
        true => format!("+{}", num(*v)),
        false => num(*v),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_max_light_lines(1)
        .x_label_formatter(&name)
        .y_label_formatter(&tick)
        .x_desc(c.x_desc)
        .y_desc(&c.y_desc)
        .axis_desc_style(font(18))
        .label_style(font(text))
        .draw()?;
    // A sixth of the slot between bars, and no bar wider than 140 px.
    let gap = (slot / 6).max(slot.saturating_sub(140) / 2);
    chart.draw_series(c.bars.iter().enumerate().filter_map(|(i, v)| {
        let (x, colour) = (i as f64, PALETTE[i % PALETTE.len()]);
        let mut bar = Rectangle::new([(x - 0.5, c.base), (x + 0.5, (*v)?)], colour.filled());
        bar.set_margin(0, 0, gap, gap);
        Some(bar)
    }))?;
    if let Some((y, label)) = c.target {
        // Named in the legend: beside the line, a bar or a point could hide it.
        let (Range { start, end }, style) = (chart.x_range(), ACCENT.stroke_width(2));
        chart
            .draw_series(DashedLineSeries::new([(start, y), (end, y)], 8, 5, style))?
            .label(label)
            .legend(move |(x, y)| DashedPathElement::new([(x - 12, y), (x + 12, y)], 6, 3, style));
    }
    for &(label, colour, ref ys) in &c.lines {
        let points = (0..)
            .zip(ys)
            .filter_map(|(i, y)| Some((f64::from(i), (*y)?)));
        let style = colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points, style).point_size(5))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x - 12, y), (x + 12, y)], style));
    }
    let above = font(text).pos(Pos::new(HPos::Center, VPos::Bottom));
    chart.draw_series(c.labels.iter().enumerate().map(|(i, label)| {
        let bar = c.bars.get(i).copied().flatten();
        let top = bar.unwrap_or(c.base).max(c.base);
        EmptyElement::at((i as f64, top)) + Text::new(label.clone(), (0, -4), above.clone())
    }))?;
    if c.target.is_some() {
        legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    let mut values = c.bars.iter().chain(c.lines.iter().flat_map(|l| &l.2));
    if values.all(Option::is_none) {
        no_data(chart.plotting_area())?;
    }
    Ok(())
}

fn names(s: &[StrategyBar]) -> Vec<String> {
    s.iter().map(|b| b.strategy.clone()).collect()
}

/// Densities in order of sessions, whatever order results.json has, and their names.
fn by_sessions(d: &[DensityPoint]) -> (Vec<&DensityPoint>, Vec<String>) {
    let mut d: Vec<_> = d.iter().collect();
    d.sort_by_key(|p| p.sessions);
    let names = d.iter().map(|p| p.sessions.to_string()).collect();
    (d, names)
}

fn correctness(area: &Area, f: &Figures) -> DrawResult {
    let s = f.strategies;
    let share = |b: &StrategyBar| (b.runs > 0).then(|| 100.0 * b.correct as f64 / b.runs as f64);
    let c = Chart {
        names: names(s),
        x_desc: "strategy",
        y_desc: "runs correct (%)".into(),
        bars: s.iter().map(share).collect(),
        labels: s
            .iter()
            .map(|b| format!("{}/{}", b.correct, b.runs))
            .collect(),
        ..Chart::default()
    };
    // Past 100, for the count over a full bar.
    chart(area, &c, 0.0..112.0)
}

fn traffic(area: &Area, f: &Figures) -> DrawResult {
    let s = f.strategies;
    let written = s.iter().map(|b| b.bytes).filter(|b| *b > 0);
    let min = written.clone().min().unwrap_or(0);
    let max = written.max().unwrap_or(0);
    let log = min > 0 && max as f64 / min as f64 > 100.0;
    let (scale, unit) = unit_of(if log { 1 << 20 } else { max });
    let base = if log { min as f64 / scale / 3.0 } else { 0.0 };
    let bar = |b: &StrategyBar| Some((b.bytes as f64 / scale).max(base));
    let note = if log { ", log" } else { "" };
    let c = Chart {
        names: names(s),
        x_desc: "strategy",
        y_desc: format!("checkpoint bytes written ({unit}{note})"),
        bars: s.iter().map(bar).collect(),
        labels: s.iter().map(|b| bytes(b.bytes)).collect(),
        base,
        ..Chart::default()
    };
    let top = max as f64 / scale;
    match (log, max > 0) {
        (true, _) => chart(area, &c, (base..top * 3.0).log_scale()),
        (false, true) => chart(area, &c, 0.0..top * 1.15),
        (false, false) => chart(area, &c, 0.0..1.0),
    }
}

fn density(area: &Area, f: &Figures) -> DrawResult {
    let (d, sessions) = by_sessions(f.density);
    let share = |v: f64| v.is_finite().then_some(100.0 * v);
    let p50: Vec<_> = d.iter().map(|p| share(p.exposed_p50)).collect();
    let p95: Vec<_> = d.iter().map(|p| share(p.exposed_p95)).collect();
    let all = p50.iter().chain(&p95).flatten();
    let top = all.copied().fold(1.0, f64::max);
    let c = Chart {
        names: sessions,
        x_desc: "concurrent sessions",
        y_desc: "exposed delay (% of turn time)".into(),
        lines: vec![
            ("p50 over turns", PALETTE[0], p50),
            ("p95 over turns", PALETTE[1], p95),
        ],
        target: Some((1.0, "1% target")),
        ..Chart::default()
    };
    // Headroom over the data for the legend.
    chart(area, &c, 0.0..top * 1.4)
}

fn time(area: &Area, f: &Figures) -> DrawResult {
    let over = |r: f64| r.is_finite().then_some(100.0 * (r - 1.0));
    let by_strategy: Vec<_> = f.strategies.iter().map(|b| over(b.time_ratio)).collect();
    let (d, sessions) = by_sessions(f.density);
    let by_density: Vec<_> = d.iter().map(|p| over(p.time_ratio)).collect();
    let label = |v: &Option<f64>| match v {
        Some(v) if *v > 0.0 => format!("+{}%", num(*v)),
        Some(v) => format!("{}%", num(*v)),
        None => "n/a".into(),
    };
    let (left, right) = area.split_horizontally(area.dim_in_pixel().0 * 3 / 5);
    let y = around_goal(&by_strategy);
    let c = Chart {
        caption: Some("by strategy, with faults"),
        names: names(f.strategies),
        x_desc: "strategy",
        y_desc: "time over fault-free (%)".into(),
        signed: true,
        labels: by_strategy.iter().map(label).collect(),
        bars: by_strategy,
        target: Some((2.0, "+2% target")),
        ..Chart::default()
    };
    chart(&left, &c, y)?;
    let c = Chart {
        caption: Some("by density"),
        names: sessions,
        x_desc: "concurrent sessions",
        y_desc: "time over checkpoint-free (%)".into(),
        signed: true,
        target: Some((2.0, "+2% target")),
        lines: vec![("total time", PALETTE[2], by_density)],
        ..Chart::default()
    };
    let y = around_goal(&c.lines[0].2);
    chart(&right, &c, y)
}

/// A y range for time over a baseline (%): zero, the +2% goal and every value,
/// with headroom for the legend. Each panel of time.svg has its own, so a slow
/// strategy does not flatten the density curve.
fn around_goal(values: &[Option<f64>]) -> Range<f64> {
    let all = values.iter().flatten();
    let lo = all.clone().fold(0.0, |lo: f64, v| lo.min(*v));
    let hi = all.fold(2.0, |hi: f64, v| hi.max(*v));
    let pad = (hi - lo) * 0.15;
    let bottom = if lo < 0.0 { lo - pad } else { 0.0 };
    bottom..hi + 2.5 * pad
}

fn proxy(area: &Area, f: &Figures) -> DrawResult {
    let mut us = f.proxy_overhead_us.to_vec();
    us.retain(|v| v.is_finite());
    us.sort_by(f64::total_cmp);
    let max = us.last().copied().unwrap_or(0.0);
    let min_pos = us.iter().copied().find(|v| *v > 0.0).unwrap_or(max);
    if min_pos > 0.0 && max / min_pos > 100.0 {
        let floor = min_pos / 1.5;
        let x = (floor..max * 1.5).log_scale();
        ecdf(area, &us, floor, x, "(µs, log)")
    } else {
        let lo = us.first().copied().unwrap_or(0.0).min(0.0);
        let hi = if max > 0.0 { max * 1.1 } else { 1.0 };
        ecdf(area, &us, lo, lo..hi, "(µs)")
    }
}

/// `us` is sorted; values under `floor` (zeros on a log axis) are drawn at it.
fn ecdf<X>(area: &Area, us: &[f64], floor: f64, x: X, unit: &str) -> DrawResult
where
    X: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
{
    let builder = &mut ChartBuilder::on(area);
    let builder = builder
        .x_label_area_size(45)
        .y_label_area_size(70)
        .margin(8)
        .margin_right(24);
    let mut chart = builder.build_cartesian_2d(x, 0.0..100.0)?;
    let tick = |v: &f64| num(*v);
    chart
        .configure_mesh()
        .x_max_light_lines(4)
        .y_max_light_lines(1)
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .x_desc(format!("proxy overhead per request {unit}"))
        .y_desc("requests at or below (%)")
        .axis_desc_style(font(18))
        .label_style(font(15))
        .draw()?;
    if us.is_empty() {
        return no_data(chart.plotting_area());
    }
    let n = us.len() as f64;
    let steps = us.iter().enumerate().flat_map(|(i, v)| {
        let v = v.max(floor);
        [(v, 100.0 * i as f64 / n), (v, 100.0 * (i + 1) as f64 / n)]
    });
    let style = PALETTE[0].stroke_width(2);
    let plural = if us.len() == 1 { "" } else { "s" };
    chart
        .draw_series(LineSeries::new(steps, style))?
        .label(format!("{} request{plural}", us.len()))
        .legend(move |(x, y)| PathElement::new([(x - 12, y), (x + 12, y)], style));
    let right_edge = chart.plotting_area().get_pixel_range().0.end;
    for (name, p) in [("p50", 0.5), ("p95", 0.95)] {
        // Nearest rank: the smallest sample with at least p of the samples at or below it.
        let v = us[((p * n).ceil() as usize).clamp(1, us.len()) - 1];
        let at = (v.max(floor), 100.0 * p);
        let drop = DashedLineSeries::new([(at.0, 0.0), at], 6, 4, ACCENT.into());
        chart.draw_series(drop)?;
        chart.draw_series([Circle::new(at, 4, ACCENT.filled())])?;
        // Right of and under the curve is empty; near the right edge, left of and over it.
        let (pos, offset) = match chart.backend_coord(&at).0 > right_edge - 160 {
            true => (Pos::new(HPos::Right, VPos::Bottom), (-8, -6)),
            false => (Pos::new(HPos::Left, VPos::Top), (8, 6)),
        };
        let label = format!("{name} = {} µs", num(v));
        let style = font(15).color(&ACCENT).pos(pos);
        chart.draw_series([EmptyElement::at(at) + Text::new(label, offset, style)])?;
    }
    legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// About three significant digits, no trailing zeros.
fn num(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let decimals = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.decimals$}");
    match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.').into(),
        false => s,
    }
}

/// The largest binary unit not above `b`, as (bytes in it, name).
fn unit_of(b: u64) -> (f64, &'static str) {
    let p = (1..UNITS.len()).rev().find(|p| b >> (10 * p) > 0);
    let p = p.unwrap_or(0);
    ((1u64 << (10 * p)) as f64, UNITS[p])
}

fn bytes(b: u64) -> String {
    let (scale, unit) = unit_of(b);
    format!("{} {unit}", num(b as f64 / scale))
}
