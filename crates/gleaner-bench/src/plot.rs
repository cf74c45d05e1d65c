//! CDF charts (PNG or SVG, chosen by the file extension) drawn with `plotters`.
//!
//! Text needs a TrueType font: DejaVu Sans from the Debian package `fonts-dejavu-core`
//! (`GLEANER_FONT` overrides the path).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context;
use gleaner_measure::wakeup::SettingResult;
use gleaner_os::BadInput;
use plotters::prelude::*;

const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

#[derive(Clone, Copy)]
enum Format {
    Png,
    Svg,
}

fn format_of(path: &Path) -> Result<Format, BadInput> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("png") => Ok(Format::Png),
        Some("svg") => Ok(Format::Svg),
        _ => Err(BadInput::new("--plot", path.display(), "a file name ending in .png or .svg")),
    }
}

/// Reject a plot path with an unknown extension before measuring anything.
pub fn check_path(path: &Path) -> Result<(), BadInput> {
    format_of(path).map(|_| ())
}

fn register_font() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = std::env::var_os("GLEANER_FONT").map_or_else(|| PathBuf::from(DEFAULT_FONT), PathBuf::from);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("font {} not found ({e}): apt-get install fonts-dejavu-core, or set GLEANER_FONT", path.display()))?;
        // The font must live as long as plotters' registry: leak it once per process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable TrueType font", path.display()))
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

const COLORS: [RGBColor; 4] = [RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(214, 39, 40), RGBColor(148, 103, 189)];

/// Draws the legend of `chart` at `pos` and writes the picture out.
fn legend_and_present<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    root: &DrawingArea<DB, plotters::coord::Shift>,
    pos: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .position(pos)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}

/// One curve: a label and its samples (any unit; the axis says µs).
#[derive(Debug)]
pub struct Curve {
    pub label: String,
    pub values: Vec<f64>,
}

/// Draw the empirical CDFs of `curves` into `path` (.png or .svg), x axis log-scaled.
pub fn cdf(path: &Path, title: &str, x_desc: &str, curves: &[Curve]) -> anyhow::Result<()> {
    let fmt = format_of(path)?;
    register_font()?;
    // Log-scaled x axis from the smallest to the largest sample: the body (tens of µs) and the
    // tail (ms) of a wakeup distribution are both visible.
    let all = curves.iter().flat_map(|c| c.values.iter().copied()).filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = all.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (xmin, xmax) = if hi > 0.0 { ((lo * 0.8).max(1e-3), hi * 1.25) } else { (0.1, 10.0) };
    let size = (900, 560);
    match fmt {
        Format::Png => draw(BitMapBackend::new(path, size).into_drawing_area(), title, x_desc, curves, (xmin, xmax)),
        Format::Svg => draw(SVGBackend::new(path, size).into_drawing_area(), title, x_desc, curves, (xmin, xmax)),
    }
    .with_context(|| format!("drawing {}", path.display()))
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    curves: &[Curve],
    (xmin, xmax): (f64, f64),
) -> anyhow::Result<()> {
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(55)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0f64..1f64)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("fraction of rounds")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    for (i, c) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts = gleaner_policy::stats::ecdf(&c.values)?;
        let pts: Vec<(f64, f64)> = pts.into_iter().map(|(x, y)| (x.clamp(xmin, xmax), y)).collect();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .label(c.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::LowerRight)
}

/// The CDF of each wakeup setting.
pub fn wakeup_cdf(path: &Path, results: &[SettingResult]) -> anyhow::Result<()> {
    let curves: Vec<Curve> = results
        .iter()
        .filter(|r| r.samples > 0)
        .map(|r| Curve {
            label: format!("{}: {} (p50 {:.1} us)", r.setting, r.description, r.p50_us.unwrap_or(0.0)),
            values: r.samples_ns.iter().map(|&n| n as f64 / 1000.0).collect(),
        })
        .collect();
    cdf(path, "Blocked-waiter wakeup latency", "wakeup latency (us, log scale)", &curves)
}

/// One point per run of `gleaner compare`: what the run cost (vCPUs busy or polling, on the x
/// axis) against what it gave (the latency kernels' p50 and p99 in µs, log scale; wall time in
/// s for other workloads), one color per policy. Medians are drawn larger.
pub fn latency_cpu(path: &Path, doc: &gleaner_measure::compare::CompareDoc) -> anyhow::Result<()> {
    let fmt = format_of(path)?;
    register_font()?;
    let size = (900, 560);
    match fmt {
        Format::Png => draw_latency_cpu(BitMapBackend::new(path, size).into_drawing_area(), doc),
        Format::Svg => draw_latency_cpu(SVGBackend::new(path, size).into_drawing_area(), doc),
    }
    .with_context(|| format!("drawing {}", path.display()))
}

/// (x = vCPUs, y = latency p50, p99 (µs) or wall time (s)) of each run.
fn run_points(r: &gleaner_measure::compare::PolicyRun) -> (f64, f64, Option<f64>) {
    let wall = r.metrics.wall_ns.max(1) as f64;
    let x = r.total_cpu_ns as f64 / wall;
    match &r.metrics.latency {
        Some(l) => (x, l.p50_ns / 1e3, Some(l.p99_ns / 1e3)),
        None => (x, wall / 1e9, None),
    }
}

fn draw_latency_cpu<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    doc: &gleaner_measure::compare::CompareDoc,
) -> anyhow::Result<()> {
    let e = |e: &dyn std::fmt::Debug| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let pts: Vec<_> = doc.samples.iter().map(run_points).collect();
    let latency = pts.iter().any(|p| p.2.is_some());
    let ys = pts.iter().flat_map(|p| std::iter::once(p.1).chain(p.2)).filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = ys.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (ymin, ymax) = if hi > 0.0 { ((lo * 0.7).max(1e-3), hi * 1.4) } else { (0.1, 10.0) };
    let xmax = pts.iter().map(|p| p.0).fold(0f64, f64::max).max(0.1) * 1.15;
    let mut words: Vec<String> = doc.command.iter().map(|w| w.rsplit('/').next().unwrap_or(w).to_string()).collect();
    words.retain(|w| w != "--json");
    let mut what = words.join(" ");
    if what.chars().count() > 60 {
        what = what.chars().take(57).collect::<String>() + "...";
    }
    let title = format!("{what} ({} runs per policy, CPUs {})", doc.runs, doc.cpus);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax, (ymin..ymax).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("CPU taken from the vCPUs: busy + kernel polling (vCPUs)")
        .y_desc(if latency { "latency (µs): p50 filled, p99 hollow" } else { "wall time (s)" })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))?;
    for (i, &p) in doc.policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mine: Vec<_> = doc.samples.iter().zip(&pts).filter(|(s, _)| s.policy == p).map(|(_, q)| *q).collect();
        chart
            .draw_series(mine.iter().map(|&(x, y, _)| Circle::new((x, y.clamp(ymin, ymax)), 5, color.filled())))
            .map_err(|x| e(&x))?
            .label(p.to_string())
            .legend(move |(x, y)| Circle::new((x + 10, y), 5, color.filled()));
        chart
            .draw_series(
                mine.iter().filter_map(|&(x, _, p99)| p99.map(|y| Circle::new((x, y.clamp(ymin, ymax)), 5, color.stroke_width(2)))),
            )
            .map_err(|x| e(&x))?;
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperRight)
}

/// The wake-cost curve (`diagnose --plot`): the mean cost of waking a halted vCPU against how
/// long it was idle (log-log), with the busy (yielder) and polling costs as flat lines.
pub fn wake_curve(path: &Path, curve: &gleaner_policy::idle::WakeCurve, title: &str) -> anyhow::Result<()> {
    let fmt = format_of(path)?;
    register_font()?;
    let size = (900, 560);
    match fmt {
        Format::Png => draw_wake_curve(BitMapBackend::new(path, size).into_drawing_area(), curve, title),
        Format::Svg => draw_wake_curve(SVGBackend::new(path, size).into_drawing_area(), curve, title),
    }
    .with_context(|| format!("drawing {}", path.display()))
}

fn draw_wake_curve<DB: DrawingBackend>(
    root: DrawingArea<DB, plotters::coord::Shift>,
    curve: &gleaner_policy::idle::WakeCurve,
    title: &str,
) -> anyhow::Result<()> {
    let e = |e: &dyn std::fmt::Debug| anyhow::anyhow!("{e:?}");
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let us = |ns: u64| ns as f64 / 1e3;
    let halted: Vec<(f64, f64)> = curve.halted.iter().map(|p| (us(p.gap_ns), us(p.mean_ns))).collect();
    let (Some(&(x0, _)), Some(&(x1, _))) = (halted.first(), halted.last()) else {
        anyhow::bail!("the wake-cost curve has no measured point to draw");
    };
    let (xmin, xmax) = (x0 / 1.5, x1 * 1.5);
    let flat: Vec<(&str, f64)> = std::iter::once(("kept busy by a yielder (B)", us(curve.busy_ns)))
        .chain(curve.poll_ns.map(|p| ("polling in the kernel (P)", us(p))))
        .collect();
    let ys = halted.iter().map(|p| p.1).chain(flat.iter().map(|f| f.1)).filter(|v| *v > 0.0);
    let (lo, hi) = ys.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (ymin, ymax) = if hi > 0.0 { ((lo * 0.6).max(0.1), hi * 1.6) } else { (0.1, 100.0) };
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((xmin..xmax).log_scale(), (ymin..ymax).log_scale())
        .map_err(|x| e(&x))?;
    chart
        .configure_mesh()
        .x_desc("idle gap before the wakeup (µs, log scale)")
        .y_desc("mean wakeup latency (µs, log scale)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|x| e(&x))?;
    let color = COLORS[2];
    chart
        .draw_series(LineSeries::new(halted.iter().copied(), color.stroke_width(2)))
        .map_err(|x| e(&x))?
        .label("halted (C)")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    chart.draw_series(halted.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(|x| e(&x))?;
    for (i, (label, y)) in flat.into_iter().enumerate() {
        let color = COLORS[i % 2];
        chart
            .draw_series(LineSeries::new([(xmin, y), (xmax, y)], color.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    legend_and_present(&mut chart, &root, SeriesLabelPosition::UpperLeft)
}
