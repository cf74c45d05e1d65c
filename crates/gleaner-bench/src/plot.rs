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
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .label_font(("sans-serif", 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
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
