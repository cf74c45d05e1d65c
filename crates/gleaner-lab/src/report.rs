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

use gleaner_policy::IdlePolicy;

use crate::results::{rows_csv, HaltPoll, Instance, RowMode, SummaryRow};
use crate::runner::LabResults;

const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn register_font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        let path = std::env::var_os("GLEANER_FONT").map_or_else(|| PathBuf::from(DEFAULT_FONT), PathBuf::from);
        let bytes =
            fs::read(&path).map_err(|e| format!("font {} ({e}): apt-get install fonts-dejavu-core or set GLEANER_FONT", path.display()))?;
        // plotters keeps the font for the process lifetime: leak it once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable font", path.display()))
    })
    .clone()
}

fn f(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn label(s: &SummaryRow) -> String {
    match s.mode {
        RowMode::Native => s.instance.to_string(),
        _ if s.halt_poll == HaltPoll::NotApplicable => format!("VM {} {}", s.instance, s.mode),
        _ => format!("VM {} {} hp={}", s.instance, s.mode, s.halt_poll),
    }
}

fn ci(v: Option<f64>, c: Option<gleaner_policy::stats::Interval>, digits: usize) -> String {
    match (v, c) {
        (Some(v), Some(c)) => format!("{v:.digits$} [{:.digits$}, {:.digits$}]", c.lo, c.hi),
        (v, _) => f(v, digits),
    }
}

/// The report's main table (Markdown): medians with bootstrap 95% intervals, then the cost
/// side (host CPU per unit of work, vCPU halts per unit, host CPU per avoided halt).
pub fn main_table(r: &LabResults) -> String {
    let mut t = String::from(
        "| run | policy | halt poll | ok/runs | wall s, median [95% CI] | speedup vs stock [95% CI] | co-runner items/s | co-runner ratio [95% CI] | weighted speedup [95% CI] | host CPU ms per 1k items | vCPU halts per item | host CPU per avoided halt, us | vCPU wait for pCPU, s | agent: consolidations (fewest vCPUs), mean active vCPUs, retention on, agent CPU | guest cpuidle | compute share of vCPU CPU | blocked-waiter bound | d_eta_r | d_eta_t | omega |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in &r.summary {
        let who = if s.mode == RowMode::Native { format!("{} (host)", s.instance) } else { format!("VM {} {}", s.instance, s.mode) };
        let cons = agent_cell(s);
        let _ = writeln!(
            t,
            "| {who} | {} | {} | {}/{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {cons} | {} | {} | {} | {} | {} | {} |",
            s.policy.map_or_else(|| "-".to_string(), |p| p.to_string()),
            s.halt_poll,
            s.runs_ok,
            s.runs,
            ci(s.wall_s, s.wall_ci, 3),
            ci(s.speedup, s.speedup_ci, 2),
            f(s.co_runner_rate, 0),
            ci(s.co_runner_ratio, s.co_runner_ratio_ci, 2),
            ci(s.weighted_speedup, s.weighted_speedup_ci, 2),
            f(s.host_cpu_per_item_us, 1),
            f(s.sleeps_per_item, 2),
            f(s.cpu_per_avoided_halt_us, 0),
            f(s.vcpu_wait_s, 2),
            s.cpuidle_driver.as_deref().unwrap_or("-"),
            s.compute_share.map_or("-".into(), |c| format!("{:.0}%", c * 100.0)),
            s.bww_bound.map_or("-".into(), crate::results::bound_label),
            f(s.d_eta_r, 2),
            f(s.d_eta_t, 2),
            f(s.omega, 2)
        );
    }
    t
}

/// What the agent did, in one table cell: consolidations (fewest vCPUs), mean active vCPUs,
/// share of periods with retention on.
pub fn agent_cell(s: &SummaryRow) -> String {
    let Some(c) = s.consolidations else {
        return "-".into();
    };
    let mut out = format!("{c:.0}");
    if let Some(m) = s.min_active_vcpus {
        out.push_str(&format!(" ({m})"));
    }
    if let Some(a) = s.mean_active_vcpus {
        out.push_str(&format!(", {a:.2}"));
    }
    if let Some(r) = s.retention_on_share {
        out.push_str(&format!(", {:.0}%", r * 100.0));
    }
    if let Some(ms) = s.agent_cpu_ms {
        out.push_str(&format!(", {ms:.0} ms"));
    }
    out
}

/// One policy in a latency-versus-CPU plot: x host CPU per unit of work, y wall time (median
/// and its 95% interval).
#[derive(Debug, Clone)]
pub struct CostPoint {
    pub label: String,
    /// The policy (its color).
    pub policy: Option<IdlePolicy>,
    pub cpu: f64,
    pub wall: f64,
    pub wall_lo: f64,
    pub wall_hi: f64,
}

/// The points of an experiment's latency-versus-CPU plot (VM rows of the first instance).
pub fn cost_points(summary: &[SummaryRow]) -> Vec<CostPoint> {
    summary
        .iter()
        .filter(|s| s.mode != RowMode::Native && s.instance == Instance::A)
        .filter_map(|s| {
            let (cpu, wall) = (s.host_cpu_per_item_us?, s.wall_s?);
            let c = s.wall_ci.unwrap_or(gleaner_policy::stats::Interval { lo: wall, hi: wall });
            let hp = if s.halt_poll == HaltPoll::NotApplicable { String::new() } else { format!(" hp={}", s.halt_poll) };
            Some(CostPoint { label: format!("{}{hp}", s.mode), policy: s.policy, cpu, wall, wall_lo: c.lo, wall_hi: c.hi })
        })
        .collect()
}

/// One color per policy, the same in every plot.
fn policy_color(policy: Option<IdlePolicy>) -> RGBColor {
    match policy {
        Some(IdlePolicy::Stock) => RGBColor(110, 110, 110),
        Some(IdlePolicy::Yielders) => RGBColor(255, 127, 14),
        Some(IdlePolicy::Poll) => RGBColor(214, 39, 40),
        Some(IdlePolicy::Haltpoll { .. }) => RGBColor(148, 103, 189),
        Some(IdlePolicy::Retention) => RGBColor(31, 119, 180),
        Some(IdlePolicy::Consolidation) => RGBColor(44, 160, 44),
        Some(IdlePolicy::Gleaner) => RGBColor(0, 0, 0),
        None => RGBColor(140, 86, 75),
    }
}

/// A scatter plot of wall time against host CPU per unit of work, one labelled point per
/// policy with its 95% interval: the latency each policy buys and the CPU it burns for it.
pub fn latency_cpu_chart(path: &Path, title: &str, x_desc: &str, points: &[CostPoint]) -> Result<(), String> {
    register_font()?;
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = points.iter().map(|p| p.cpu).fold(0.0f64, f64::max).max(1e-9) * 1.2;
    let ymax = points.iter().map(|p| p.wall_hi).fold(0.0f64, f64::max).max(1e-9) * 1.15;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(|x| e(&x))?;
    chart.configure_mesh().x_desc(x_desc).y_desc("wall time, s (median, 95% CI)").draw().map_err(|x| e(&x))?;
    for p in points {
        let c = policy_color(p.policy);
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(p.cpu, p.wall_lo), (p.cpu, p.wall_hi)], c.stroke_width(2))))
            .map_err(|x| e(&x))?;
        chart.draw_series(std::iter::once(Circle::new((p.cpu, p.wall), 6, c.filled()))).map_err(|x| e(&x))?;
        chart
            .draw_series(std::iter::once(Text::new(
                p.label.clone(),
                (p.cpu + xmax * 0.01, p.wall + ymax * 0.015),
                ("sans-serif", 14).into_font().color(&c),
            )))
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
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
            if (x - x.floor() - 0.5).abs() < 1e-6 {
                labels.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_label_style(("sans-serif", 13))
        .y_desc(y_desc)
        .draw()
        .map_err(|x| e(&x))?;
    const COLORS: [RGBColor; 4] = [RGBColor(120, 120, 120), RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (l, v))| {
            let c = if l.starts_with("native") {
                COLORS[0]
            } else if l.contains(" off") {
                COLORS[3]
            } else if l.contains("vCPU") {
                COLORS[1 + i % 3]
            } else {
                COLORS[2]
            };
            Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, *v)], c.filled())
        }))
        .map_err(|x| e(&x))?;
    chart
        .draw_series(
            bars.iter().enumerate().map(|(i, (_, v))| Text::new(format!("{v:.2}"), (i as f64 + 0.3, *v + max * 0.02), ("sans-serif", 14))),
        )
        .map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// The main table as CSV.
pub fn summary_csv(summary: &[SummaryRow]) -> String {
    let o = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x}"));
    let lo = |c: Option<gleaner_policy::stats::Interval>| c.map_or(String::new(), |c| format!("{}", c.lo));
    let hi = |c: Option<gleaner_policy::stats::Interval>| c.map_or(String::new(), |c| format!("{}", c.hi));
    let mut sc = String::from(
        "instance,mode,policy,halt_poll,runs_ok,runs,wall_s,wall_lo,wall_hi,wall_spread,speedup,speedup_lo,speedup_hi,co_runner_rate,co_runner_ratio,co_runner_ratio_lo,co_runner_ratio_hi,weighted_speedup,weighted_speedup_lo,weighted_speedup_hi,guest_cpu_s,host_cpu_s,host_vcpu_s,host_cpu_per_item_us,sleeps_per_item,cpu_per_avoided_halt_us,vcpu_wait_s,consolidations,min_active_vcpus,mean_active_vcpus,retention_on_share,cpuidle_driver,items,compute_share,bww_bound,d_eta_r,d_eta_t,omega\n",
    );
    for s in summary {
        let f = [
            s.instance.to_string(),
            s.mode.to_string(),
            s.policy.map(|p| p.to_string()).unwrap_or_default(),
            s.halt_poll.to_string(),
            s.runs_ok.to_string(),
            s.runs.to_string(),
            o(s.wall_s),
            lo(s.wall_ci),
            hi(s.wall_ci),
            o(s.wall_spread),
            o(s.speedup),
            lo(s.speedup_ci),
            hi(s.speedup_ci),
            o(s.co_runner_rate),
            o(s.co_runner_ratio),
            lo(s.co_runner_ratio_ci),
            hi(s.co_runner_ratio_ci),
            o(s.weighted_speedup),
            lo(s.weighted_speedup_ci),
            hi(s.weighted_speedup_ci),
            o(s.guest_cpu_s),
            o(s.host_cpu_s),
            s.host_vcpu_s.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(";"),
            o(s.host_cpu_per_item_us),
            o(s.sleeps_per_item),
            o(s.cpu_per_avoided_halt_us),
            o(s.vcpu_wait_s),
            o(s.consolidations),
            s.min_active_vcpus.map_or(String::new(), |m| m.to_string()),
            o(s.mean_active_vcpus),
            o(s.retention_on_share),
            s.cpuidle_driver.clone().unwrap_or_default(),
            o(s.items),
            o(s.compute_share),
            o(s.bww_bound),
            o(s.d_eta_r),
            o(s.d_eta_t),
            o(s.omega),
        ];
        sc.push_str(&f.iter().map(|x| crate::results::csv_field(x)).collect::<Vec<_>>().join(","));
        sc.push('\n');
    }
    sc
}

/// Writes every output file; returns the report's path.
pub fn write(out: &Path, r: &LabResults) -> anyhow::Result<PathBuf> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let w = |name: &str, text: &str| fs::write(out.join(name), text).with_context(|| out.join(name).display().to_string());
    w("results.json", &serde_json::to_string_pretty(r)?)?;
    w("runs.csv", &rows_csv(&r.rows))?;
    let sc = summary_csv(&r.summary);
    w("summary.csv", &sc)?;
    let plot_notes = draw_plots(out, r);
    w("report.md", &report_md(r, &plot_notes))?;
    Ok(out.join("report.md"))
}

/// Draws `latency_cpu.png`, `wall.png` and `vcpu_cpu.png` into `out`; returns a note for
/// each plot not drawn.
fn draw_plots(out: &Path, r: &LabResults) -> Vec<String> {
    let walls: Vec<(String, f64)> = r.summary.iter().filter_map(|s| s.wall_s.map(|x| (label(s), x))).collect();
    let mut vcpu = Vec::new();
    for s in r.summary.iter().filter(|s| s.mode != RowMode::Native) {
        for (i, v) in s.host_vcpu_s.iter().enumerate() {
            vcpu.push((format!("{} vCPU{i}", label(s).trim_start_matches("VM ")), *v));
        }
    }
    let mut plot_notes = Vec::new();
    let points = cost_points(&r.summary);
    if points.is_empty() {
        plot_notes.push("latency_cpu.png: no data".into());
    } else if let Err(e) = latency_cpu_chart(
        &out.join("latency_cpu.png"),
        &format!("{}: wall time vs host CPU per unit of work", r.experiment.name),
        "host CPU per item, us",
        &points,
    ) {
        plot_notes.push(format!("latency_cpu.png not drawn: {e}"));
    }
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
    plot_notes
}

/// The text of `report.md`: the run's settings, the main table, sizing, wakeup costs, setup,
/// KVM statistics and the notes (the run's, then `plot_notes`).
fn report_md(r: &LabResults, plot_notes: &[String]) -> String {
    let mut md = String::new();
    md_settings(&mut md, r);
    let _ = writeln!(md, "## Main table\n\n{}", main_table(r));
    md.push_str(
        "\nd_eta_r, d_eta_t and omega are the survey's reduced resource efficiency, reduced temporal efficiency \
         and overhead impact factor of each VM row against the native row (section 3), with gamma = the pCPUs \
         available (halved in OC/OC2). Speedup is stock wall time / this wall time; the weighted speedup is the \
         mean of the workload's speedup and the co-runner's throughput ratio (Gleaner paper, 7.2.1). Intervals \
         are percentile-bootstrap 95% intervals over the runs (4000 resamples, seeded). Host CPU per item is all \
         QEMU threads' CPU time during the step divided by the work done; vCPU halts are the vCPU threads' \
         voluntary context switches on the host; host CPU per avoided halt is the extra CPU per item over the \
         stock mode divided by the halts per item it avoided.\n\n",
    );
    let _ = writeln!(md, "![wall time vs host CPU](latency_cpu.png)\n\n![wall time](wall.png)\n\n![host CPU per vCPU](vcpu_cpu.png)\n");
    md_sizing(&mut md, r);
    md_wake_costs(&mut md, r);
    md_setup_and_kvm(&mut md, r);
    md.push_str("## Notes\n\n");
    for n in r.notes.iter().chain(plot_notes) {
        let _ = writeln!(md, "- {n}");
    }
    md.push_str("\nFiles: results.json (everything), runs.csv (one line per run), summary.csv (the table).\n");
    md
}

/// The report's title, description and settings list (scenario, acceleration, versions,
/// boot times, workload, co-runner, total time).
fn md_settings(md: &mut String, r: &LabResults) {
    let exp = &r.experiment;
    let _ = writeln!(md, "# gleaner lab: {}\n\n{}\n", exp.name, exp.description);
    let _ = writeln!(
        md,
        "- scenario: **{:?}**, {} vCPUs per guest, {} MiB, pCPUs {:?}, {} run(s) per mode{}",
        exp.scenario,
        exp.vcpus,
        exp.memory_mib,
        r.pcpus,
        r.runs_per_mode,
        if r.quick { " (--quick)" } else { "" }
    );
    let _ = writeln!(
        md,
        "- acceleration: **{}**; guest kernel {} ({} {}), {}",
        r.accel,
        r.kernel.version,
        r.kernel.package,
        r.kernel.package_version,
        if r.kernel.vmlinux { "uncompressed vmlinux" } else { "vmlinuz" }
    );
    let _ = writeln!(md, "- {}; host kernel {}; gleaner {}", r.qemu_version, r.host_kernel, r.gleaner);
    let boots: Vec<String> = r.boot_s.iter().map(|(k, v)| format!("{k} {v:.1} s")).collect();
    let _ = writeln!(md, "- boot to init: {}", if boots.is_empty() { "-".into() } else { boots.join(", ") });
    let _ = writeln!(md, "- workload: `gleaner {}`", exp.workload_args(r.quick).join(" "));
    if let Some(co) = exp.co_runner_args(r.quick) {
        let _ = writeln!(md, "- co-runner (VM B, in a loop): `gleaner {}`", co.join(" "));
    }
    let _ = writeln!(md, "- total time {:.0} s\n", r.duration_s);
}

/// The sizing section, when the workload was sized.
fn md_sizing(md: &mut String, r: &LabResults) {
    if let Some(sz) = &r.sizing {
        let _ =
            writeln!(md, "## Sizing\n\nnative: `gleaner {}`\n\nguests: `gleaner {}`\n", r.native_args.join(" "), r.guest_args.join(" "));
        let _ = writeln!(
            md,
            "compute `{:?}`; iterations/us native {:.0}, guest {}; synchronization CPU per item native {} us, guest alone {} us; work per step native {} us, guest {} us\n",
            sz.compute,
            sz.native_iters_per_us,
            f(sz.guest_iters_per_us, 0),
            f(sz.native_sync_us_per_item, 1),
            f(sz.guest_sync_us_per_item, 1),
            sz.native_work_us,
            sz.guest_work_us
        );
    }
}

/// The table of cross-vCPU wakeup latencies in the guests, when measured.
fn md_wake_costs(md: &mut String, r: &LabResults) {
    if !r.wake_costs.is_empty() {
        md.push_str("## Cross-vCPU wakeup latency in the guests (Table 2 settings, us: p50 / mean / p99)\n\n| where | guest | A same vCPU | B other vCPU kept busy | C other vCPU halted |\n|---|---|---|---|---|\n");
        for w in &r.wake_costs {
            let cell = |name: &str| {
                w.settings
                    .iter()
                    .find(|x| x.setting.to_string() == name)
                    .map_or("-".into(), |x| format!("{} / {} / {}", f(x.p50_us, 0), f(x.mean_us, 0), f(x.p99_us, 0)))
            };
            let _ = writeln!(md, "| {} | {} | {} | {} | {} |", w.context, w.guest, cell("A"), cell("B"), cell("C"));
        }
        md.push('\n');
    }
}

/// The guest setup steps and the KVM statistics sections, each when there is any.
fn md_setup_and_kvm(md: &mut String, r: &LabResults) {
    if !r.setup.is_empty() {
        md.push_str("## Guest setup (outside measured windows)\n\n");
        let steps: Vec<String> = r.setup.iter().map(|st| format!("{} {} (rc {})", st.guest, st.step, st.rc)).collect();
        let _ = writeln!(md, "{}; outputs in results.json (`setup`, `calibrations`, `wake_costs`).\n", steps.join(", "));
    }
    if !r.kvm_stats.is_empty() {
        md.push_str("## KVM statistics (QMP query-stats)\n\n");
        for (g, stats) in &r.kvm_stats {
            let pick: Vec<String> =
                stats.iter().filter(|(k, _)| k.contains("halt") || k.ends_with(":exits")).map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(md, "- {g}: {}", pick.join(", "));
        }
        md.push('\n');
    }
}
