//! The command line as a user meets it: help for every command, exit status 2 with a one-line
//! message for bad input, never a panic.

mod common;

use common::gleaner;

#[test]
fn every_command_has_help() {
    let cmds: &[&[&str]] = &[
        &[],
        &["bench"],
        &["bench", "wakeup"],
        &["bench", "workload"],
        &["bench", "run"],
        &["bench", "overhead"],
        &["diagnose"],
        &["run"],
        &["attach"],
        &["daemon"],
        &["status"],
        &["restore"],
        &["compare"],
        &["sim"],
        &["sim", "predict"],
        &["host"],
        &["lab"],
        &["lab", "predict"],
        &["completions"],
        &["man-pages"],
    ];
    for c in cmds {
        let out = gleaner().args(*c).arg("--help").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{c:?} --help failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("Usage:"), "{c:?} --help: {text}");
    }
}

#[test]
fn bad_input_exits_2_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "{ not json").unwrap();
    let g = garbage.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["no-such-command"],
        &["bench", "workload", "no-such-workload"],
        &["bench", "workload", "pipeline", "--threads", "0"],
        &["bench", "workload", "openloop", "--rate", "0"],
        &["bench", "workload", "openloop", "--rate", "200001"],
        &["bench", "workload", "pingpong", "--client-cpu", "4095"],
        &["bench", "workload", "pingpong", "--rate", "10"],
        &["bench", "workload", "pingpong", "--rounds", "5", "--duration-ms", "5"],
        &["bench", "workload", "pipeline", "--server-cpu", "0"],
        &["bench", "wakeup", "--setting", "F"],
        &["bench", "wakeup", "--rounds", "0"],
        &["bench", "wakeup", "--waiter-cpu", "4095"],
        &["bench", "run", "--", "/nonexistent/program"],
        &["bench", "overhead", "/nonexistent/a.json", "/nonexistent/b.json"],
        &["bench", "overhead", g, g],
        &["sim", "/nonexistent/scenario.toml"],
        &["sim", "predict", "--measured", "/nonexistent/bench-out"],
        &["sim", "table2", "--from-calibration", "/nonexistent/calibration.json"],
        &["sim", "table2", "--from-calibration", g],
        &["lab", "run", "no-such-experiment"],
        &["lab", "run", "uc", "--accel", "hvf"],
        &["lab", "run", "uc", "--pcpus", "1-0"],
        &["lab", "matrix", "--accel", "KVM"],
        &["lab", "predict", "/nonexistent/lab-results"],
        &["lab", "predict", g],
        &["completions", "tcsh"],
        &["run", "--vm-share", "1.5", "--", "true"],
        &["run", "--budget", "0", "--", "true"],
    ];
    for args in cases {
        let out = gleaner().args(*args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        // clap's errors and ours alike: one line.
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("gleaner: "), "{args:?}: {stderr}");
    }
}

/// The three enum errors the README promises as one line, and clap's other errors.
#[test]
fn clap_errors_are_one_line_naming_the_flag_the_value_and_what_is_allowed() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "wakeup", "--setting", "F"], "gleaner: invalid --setting 'F': allowed: A, B, C, D, E"),
        (&["run", "--retention-start", "maybe", "--", "true"], "gleaner: invalid --retention-start 'maybe': allowed: calibrated, on, off"),
        (&["compare", "--policies", "foo"], "gleaner: invalid --policies 'foo': allowed: "),
        (&["bench", "wakeup", "--no-such-flag"], "gleaner: invalid option '--no-such-flag' for `gleaner bench wakeup`"),
        (&["bench", "wakeup", "--rounds"], "gleaner: missing value for --rounds: allowed: 1..=1000000"),
        (&["bench", "wakeup", "--rounds", "many"], "gleaner: invalid --rounds 'many': allowed: 1..=1000000"),
        (&["bench"], "gleaner: missing command after `gleaner bench`: allowed: wakeup, workload"),
    ];
    for (args, start) in cases {
        let out = gleaner().args(*args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with(start), "{args:?}: {stderr}");
    }
}

/// A bad agent value names the flag when a flag gave it and the key when the file did.
#[test]
fn agent_errors_name_the_flag_or_the_config_key_that_gave_the_value() {
    let out = gleaner().args(["run", "--budget", "7", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("gleaner: invalid --budget '7': allowed: "), "{out:?}");
    let out = gleaner().args(["run", "--period-ms", "5", "--", "true"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("gleaner: invalid --period-ms '5': allowed: 10..=10000"), "{out:?}");
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gleaner.toml");
    std::fs::write(&cfg, "budget = 7.0\n").unwrap();
    let out = gleaner().args(["run", "--config"]).arg(&cfg).args(["--", "true"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("invalid budget '7': allowed: ") && !stderr.contains("--budget"), "{stderr}");
    // The file's valid value, overridden by a bad flag: the flag is named.
    std::fs::write(&cfg, "period_ms = 100\n").unwrap();
    let out = gleaner().args(["run", "--period-ms", "0", "--config"]).arg(&cfg).args(["--", "true"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid --period-ms '0'"), "{out:?}");
}

/// Arguments a command needs beside the option under test, so that the option's own check is
/// what answers (a required positional, the command after `--`); per option where one kernel
/// takes it and another refuses it.
fn needed_args(path: &str, flag: &str) -> Option<Vec<String>> {
    let own = std::process::id().to_string();
    let v: Vec<&str> = match (path, flag) {
        ("bench workload", "--threads" | "--items") => vec!["pipeline"],
        ("bench workload", "--work-us" | "--iters-per-us" | "--rate" | "--seed") => vec!["openloop"],
        ("bench workload", _) => vec!["pingpong"],
        ("bench run" | "bench yielders" | "run" | "compare", _) => vec!["--", "true"],
        ("bench overhead", _) => vec!["/nonexistent/a.json", "/nonexistent/b.json"],
        // The cgroup conflicts with --pid: the pid is the one under test.
        ("attach", "--pid") => vec![],
        ("attach", _) => vec!["--pid", "1"],
        ("lab run", _) => vec!["uc"],
        ("lab exec", _) => vec!["--", "true"],
        ("lab predict", _) => vec!["/nonexistent/lab-results"],
        ("sim", _) => vec!["/nonexistent/scenario.toml"],
        ("sim sweep", _) => vec!["--set", "host.pcpus=4,8", "/nonexistent/scenario.toml"],
        ("sim predict", _) => vec!["--measured", "/nonexistent/bench-out"],
        ("diagnose", "--seconds") => vec!["--pid", &own],
        _ => return None,
    };
    Some(v.into_iter().map(String::from).collect())
}

/// Values out of an option's documented range: above its top, below its bottom (a negative
/// number where the bottom is 0 is one its type refuses), and no number at all.
fn out_of_range(r: &gleaner::cli::DocumentedRange) -> Vec<String> {
    let step = |n: &str, up: bool| -> String {
        match n.parse::<i128>() {
            Ok(i) => (if up { i + 1 } else { i - 1 }).to_string(),
            Err(_) => {
                let f: f64 = n.parse().unwrap_or_else(|_| panic!("range bound '{n}' is not a number"));
                (if up { f + 1.0 } else { f - 1.0 }).to_string()
            }
        }
    };
    let above = if r.hi_open { r.hi.clone() } else { step(&r.hi, true) };
    let below = if r.lo_open { r.lo.clone() } else { step(&r.lo, false) };
    vec![above, below, "x".into()]
}

fn is_number(arg: &clap::Arg) -> bool {
    use std::any::TypeId;
    let t = arg.get_value_parser().type_id();
    [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<f64>(),
    ]
    .into_iter()
    .any(|id| t == id)
}

/// Every option of every subcommand that takes a number or one of a set of values, walked from
/// the clap definitions: its help documents the range (numbers), and a value outside it (or
/// not among the set) is answered before anything starts with exit 2 and one line naming the
/// flag and the value, never a panic.
#[test]
fn every_numeric_and_enum_option_refuses_a_bad_value_in_one_line() {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, clap::Arg)>) {
        for a in cmd.get_arguments() {
            if a.get_long().is_some() && !a.is_hide_set() && a.get_action().takes_values() {
                out.push((path.clone(), a.clone()));
            }
        }
        for s in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let mut p = path.clone();
            p.push(s.get_name().to_string());
            walk(s, p, out);
        }
    }
    let mut options = Vec::new();
    walk(&gleaner::cli::Cli::command(), Vec::new(), &mut options);
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, arg) in &options {
        let flag = format!("--{}", arg.get_long().unwrap());
        let enum_values = !arg.get_possible_values().is_empty();
        let values = if is_number(arg) {
            let help = arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
            match gleaner::cli::documented_range(&help) {
                Some(r) => out_of_range(&r),
                None => {
                    problems.push(format!("`gleaner {} {flag}` takes a number but its help documents no range: {help}", path.join(" ")));
                    continue;
                }
            }
        } else if enum_values {
            vec!["no-such-value".to_string()]
        } else {
            continue;
        };
        let at = path.join(" ");
        let needed = match needed_args(&at, &flag) {
            Some(n) => n,
            None => {
                let cmd = path.iter().fold(gleaner::cli::Cli::command(), |c, n| c.find_subcommand(n).unwrap().clone());
                if cmd.get_arguments().any(|a| a.is_required_set()) {
                    problems.push(format!("`gleaner {at}` has required arguments: tell needed_args what {flag} goes with"));
                    continue;
                }
                Vec::new()
            }
        };
        for v in values {
            checked += 1;
            let mut c = gleaner();
            c.args(path).arg(format!("{flag}={v}")).args(&needed).stdin(std::process::Stdio::null());
            c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped());
            let mut child = c.spawn().unwrap();
            let Some(status) = common::wait_child(&mut child, std::time::Duration::from_secs(30)) else {
                problems.push(format!("gleaner {at} {flag}={v}: still running after 30 s (killed): the value was not checked"));
                continue;
            };
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            let one_line = stderr.lines().count() == 1;
            let names = stderr.contains(&flag) && stderr.contains(&format!("'{v}'"));
            if status.code() != Some(2) || !one_line || !names || stderr.contains("panicked") {
                problems.push(format!("gleaner {at} {flag}={v}: {status}: {}", stderr.trim()));
            }
        }
    }
    assert!(checked > 50, "only {checked} values tried: the walk found too few options");
    assert!(problems.is_empty(), "{} of {checked}:\n{}", problems.len(), problems.join("\n"));
}

/// The latency kernels' bad values are named with what is allowed, and their help says what
/// each flag does (units in the names).
#[test]
fn latency_kernels_name_bad_values_and_explain_their_flags() {
    let out = gleaner().args(["bench", "workload", "openloop", "--rate", "0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "gleaner: invalid --rate '0': allowed: 1..=200000 requests per second");
    let out = gleaner().args(["bench", "workload", "pingpong", "--server-cpu", "4095"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.starts_with("gleaner: invalid --server-cpu '4095': allowed: a CPU this process may use: "), "{stderr}");
    let help = gleaner().args(["bench", "workload", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--client-cpu", "--server-cpu", "--duration-ms", "--rounds", "--think-us", "--rate", "--seed", "pingpong", "openloop"] {
        assert!(help.contains(flag), "`bench workload --help` does not mention {flag}:\n{help}");
    }
    assert!(help.contains("The client's CPU is allowed too"), "{help}");
}

#[test]
fn completions_for_every_shell_and_one_line_for_a_wrong_one() {
    for shell in ["bash", "elvish", "fish", "powershell", "zsh"] {
        let out = gleaner().args(["completions", shell]).output().unwrap();
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains("gleaner") && script.contains("diagnose"), "{shell}: {script}");
        assert!(!script.contains("__guardian") && !script.contains("man-pages"), "{shell} offers a hidden command: {script}");
    }
    let out = gleaner().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "gleaner: invalid shell 'tcsh': allowed: bash, elvish, fish, powershell, zsh\n");
}

/// `attach` never takes init (the whole system), nor the agent's own ancestors (the test that
/// starts it is one): moved into a cpuset consolidation shrinks, they would take everything
/// with them. The message names the rule.
#[test]
fn attach_refuses_init_and_its_own_ancestors_naming_the_rule() {
    let own = std::process::id().to_string();
    for (pid, rule) in [("1", "a process other than init"), (own.as_str(), "a process that is not an ancestor of the agent")] {
        let out = gleaner().args(["attach", "--pid", pid]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{pid}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with(&format!("gleaner: invalid --pid '{pid}': allowed: {rule}")), "{stderr}");
    }
}
