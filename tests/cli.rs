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
        &["bench", "wakeup", "--setting", "E"],
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
        // clap's own errors carry a usage hint; ours are one line.
        if !stderr.starts_with("error:") {
            assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        }
    }
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
