//! Writes a run's results into its output directory:
//!
//! - `results.json`: everything (experiment, provenance, rows, summary, KVM stats, notes);
//! - `runs.csv`: one line per measured run; `summary.csv`: the main table;
//! - `report.md` with `wall.png` (wall time per mode) and `vcpu_cpu.png` (host CPU time per
//!   vCPU thread), drawn with plotters (font: DejaVu Sans, package fonts-dejavu-core;
//!   `GLEANER_FONT` overrides).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context;
use plotters::prelude::*;

use crate::results::{rows_csv, SummaryRow};
use crate::runner::LabResults;

const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = std::env::var_os("GLEANER_FONT").map_or_else(|| PathBuf::from(DEFAULT_FONT), PathBuf::from);
        let bytes = fs::read(&path).map_err(|e| format!("font {} ({e}): apt-get install fonts-dejavu-core or set GLEANER_FONT", path.display()))?;
        // plotters keeps the font for the process lifetime: leak it once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).map_err(|_| format!("{} is not a usable font", path.display()))
    })
    .clone()
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn label(s: &SummaryRow) -> String {
    match s.mode.as_str() {
        "native" => s.instance.clone(),
        _ if s.halt_poll == "n/a" => format!("VM {} {}", s.instance, s.mode),
        _ => format!("VM {} {} hp={}", s.instance, s.mode, s.halt_poll),
    }
}

/// The report's main table (Markdown).
pub fn main_table(r: &LabResults) -> String {
    let mut t = String::from(
        "| run | gleaner | halt poll | ok/runs | wall s (median) | spread | speedup vs stock | guest CPU s | host CPU s | host CPU per vCPU s | d_eta_r | d_eta_t | omega | co-runner items/s | weighted speedup |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &r.summary {
        let vc = if s.host_vcpu_s.is_empty() { "-".into() } else { s.host_vcpu_s.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" / ") };
        let who = if s.mode == "native" { format!("{} (host)", s.instance) } else { format!("VM {}", s.instance) };
        let _ = writeln!(
            t,
            "| {who} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {vc} | {} | {} | {} | {} | {} |",
            s.mode, s.halt_poll, s.runs_ok, s.runs, f(s.wall_s, 3), f(s.wall_spread, 2), f(s.speedup, 2), f(s.guest_cpu_s, 3), f(s.host_cpu_s, 3),
            f(s.d_eta_r, 2), f(s.d_eta_t, 2), f(s.omega, 2), f(s.co_runner_rate, 0), f(s.weighted_speedup, 2)
        );
    }
    t
}

fn bar_chart(path: &Path, title: &str, y_desc: &str, bars: &[(String, f64)]) -> Result<(), String> {
    register_font()?;
    let max = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-9);
    let root = BitMapBackend::new(path, (900, 480)).into_drawing_area();
    let e = |x: &dyn std::fmt::Display| x.to_string();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let n = bars.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(70)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..max * 1.15)
        .map_err(|x| e(&x))?;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            // Bar positions are small non-negative indices.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 1e-6 { labels.get(i).cloned().unwrap_or_default() } else { String::new() }
        })
        .x_label_style(("sans-serif", 13))
        .y_desc(y_desc)
        .draw()
        .map_err(|x| e(&x))?;
    const COLORS: [RGBColor; 4] = [RGBColor(120, 120, 120), RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (l, v))| {
            let c = if l.starts_with("native") { COLORS[0] } else if l.contains(" off") { COLORS[3] } else if l.contains("vCPU") { COLORS[1 + i % 3] } else { COLORS[2] };
            Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, *v)], c.filled())
        }))
        .map_err(|x| e(&x))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            Text::new(format!("{v:.2}"), (i as f64 + 0.3, *v + max * 0.02), ("sans-serif", 14))
        }))
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Writes every output file; returns the report's path.
pub fn write(out: &Path, r: &LabResults) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let w = |name: &str, text: &str| fs::write(out.join(name), text).with_context(|| out.join(name).display().to_string());
    w("results.json", &serde_json::to_string_pretty(r)?)?;
    w("runs.csv", &rows_csv(&r.rows))?;
    let mut sc = String::from("instance,mode,halt_poll,runs_ok,runs,wall_s,wall_spread,speedup,guest_cpu_s,host_cpu_s,host_vcpu_s,d_eta_r,d_eta_t,omega,co_runner_rate,weighted_speedup\n");
    for s in &r.summary {
        let o = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
        let _ = writeln!(
            sc,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.instance, s.mode, s.halt_poll, s.runs_ok, s.runs, o(s.wall_s), o(s.wall_spread), o(s.speedup), o(s.guest_cpu_s), o(s.host_cpu_s),
            s.host_vcpu_s.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(";"), o(s.d_eta_r), o(s.d_eta_t), o(s.omega), o(s.co_runner_rate), o(s.weighted_speedup)
        );
    }
    w("summary.csv", &sc)?;

    let walls: Vec<(String, f64)> = r.summary.iter().filter_map(|s| s.wall_s.map(|x| (label(s), x))).collect();
    let mut vcpu = Vec::new();
    for s in r.summary.iter().filter(|s| s.mode != "native") {
        for (i, v) in s.host_vcpu_s.iter().enumerate() {
            vcpu.push((format!("{} vCPU{i}", label(s).trim_start_matches("VM ")), *v));
        }
    }
    let mut plot_notes = Vec::new();
    for (file, title, y, bars) in [
        ("wall.png", format!("{}: wall time per run (median)", r.experiment.name), "seconds", &walls),
        ("vcpu_cpu.png", format!("{}: host CPU time per vCPU thread per run (median)", r.experiment.name), "seconds", &vcpu),
    ] {
        if bars.is_empty() {
            plot_notes.push(format!("{file}: no data"));
            continue;
        }
        if let Err(e) = bar_chart(&out.join(file), &title, y, bars) {
            plot_notes.push(format!("{file} not drawn: {e}"));
        }
    }

    let exp = &r.experiment;
    let mut md = String::new();
    let _ = writeln!(md, "# gleaner lab: {}\n\n{}\n", exp.name, exp.description);
    let _ = writeln!(md, "- scenario: **{:?}**, {} vCPUs per guest, {} MiB, pCPUs {:?}, {} run(s) per mode{}", exp.scenario, exp.vcpus, exp.memory_mib, r.pcpus, r.runs_per_mode, if r.quick { " (--quick)" } else { "" });
    let _ = writeln!(md, "- acceleration: **{}**; guest kernel {} ({} {}), {}", r.accel, r.kernel.version, r.kernel.package, r.kernel.package_version, if r.kernel.vmlinux { "uncompressed vmlinux" } else { "vmlinuz" });
    let _ = writeln!(md, "- {}; host kernel {}; gleaner {}", r.qemu_version, r.host_kernel, r.gleaner);
    let boots: Vec<String> = r.boot_s.iter().map(|(k, v)| format!("{k} {v:.1} s")).collect();
    let _ = writeln!(md, "- boot to init: {}", if boots.is_empty() { "-".into() } else { boots.join(", ") });
    let _ = writeln!(md, "- workload: `gleaner {}`", exp.workload_args(r.quick).join(" "));
    if let Some(co) = exp.co_runner_args(r.quick) {
        let _ = writeln!(md, "- co-runner (VM B, in a loop): `gleaner {}`", co.join(" "));
    }
    let _ = writeln!(md, "- total time {:.0} s\n", r.duration_s);
    let _ = writeln!(md, "## Main table\n\n{}", main_table(r));
    md.push_str(
        "\nd_eta_r, d_eta_t and omega are the survey's reduced resource efficiency, reduced temporal efficiency \
         and overhead impact factor of each VM row against the native row (section 3), with gamma = the pCPUs \
         available (halved in OC/OC2). Speedup is stock wall time / this wall time; the weighted speedup is the \
         mean of the workload's speedup and the co-runner's throughput ratio (Gleaner paper, 7.2.1).\n\n",
    );
    let _ = writeln!(md, "![wall time](wall.png)\n\n![host CPU per vCPU](vcpu_cpu.png)\n");
    if !r.kvm_stats.is_empty() {
        md.push_str("## KVM statistics (QMP query-stats)\n\n");
        for (g, stats) in &r.kvm_stats {
            let pick: Vec<String> = stats.iter().filter(|(k, _)| k.contains("halt") || k.ends_with(":exits")).map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(md, "- {g}: {}", pick.join(", "));
        }
        md.push('\n');
    }
    md.push_str("## Notes\n\n");
    for n in r.notes.iter().chain(&plot_notes) {
        let _ = writeln!(md, "- {n}");
    }
    md.push_str("\nFiles: results.json (everything), runs.csv (one line per run), summary.csv (the table).\n");
    w("report.md", &md)?;
    Ok(out.join("report.md"))
}
