//! `--plot`: wall time of every foreground VM per case and variant, as a bar chart.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::runner::Report;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> anyhow::Result<()> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let bytes = std::fs::read(FONT).map_err(|e| format!("{FONT}: {e} (install the Debian package fonts-dejavu-core)"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| format!("{FONT}: not a usable TrueType font"))
    })
    .clone()
    .map_err(|e| anyhow::anyhow!(e))
}

/// Draws one bar per (case, variant, foreground VM) with its wall time in ms.
pub fn wall_times(reports: &[Report], path: &Path) -> anyhow::Result<()> {
    let mut bars: Vec<(String, f64)> = Vec::new();
    for r in reports {
        for c in &r.cases {
            for n in &c.native {
                bars.push((format!("{} native {}", c.name, n.vm), n.wall_ns as f64 / 1e6));
            }
            for v in &c.variants {
                for m in v.vms.iter().filter(|m| !m.background) {
                    bars.push((format!("{} {} {}", c.name, v.name, m.name), m.wall_ns as f64 / 1e6));
                }
            }
        }
    }
    if bars.is_empty() {
        anyhow::bail!("nothing to plot: no foreground VM");
    }
    register_font()?;
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase();
    let h = (120 + 22 * bars.len()) as u32;
    match ext.as_str() {
        "svg" => draw(SVGBackend::new(path, (900, h)).into_drawing_area(), &bars),
        "png" => draw(BitMapBackend::new(path, (900, h)).into_drawing_area(), &bars),
        _ => Err(gleaner_policy::input::BadInput::new("--plot", path.display(), "a file name ending in .svg or .png").into()),
    }
    .with_context(|| format!("drawing {}", path.display()))
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, plotters::coord::Shift>, bars: &[(String, f64)]) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let max = bars.iter().map(|b| b.1).fold(0.0_f64, f64::max).max(1e-9) * 1.1;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption("wall time (ms)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(320)
        .build_cartesian_2d(0.0..max, 0..n)
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&|i| labels.get(*i).cloned().unwrap_or_default())
        .draw()
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| Rectangle::new([(0.0, i), (b.1, i + 1)], BLUE.mix(0.6).filled())))
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e:?}"))?;
    Ok(())
}
