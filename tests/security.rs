//! Security properties through the real binary: the run directory and the status
//! socket are root's alone, a run directory or state file that is a symlink (or open to
//! others) is refused and never followed, a configuration file others can write is refused,
//! and the metrics endpoint listens on loopback unless told otherwise. They need root (CI runs
//! as root) and fail saying so; they start agents, so they run serially with the other tests
//! that change host-global state.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use serial_test::serial;

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Debian's python3 (the package the tests install), not one on root's PATH that nobody may not
/// run.
const PYTHON3: &str = "/usr/bin/python3";

/// `gleaner` as user and group `nobody` (65534), no supplementary groups.
fn gleaner_as_nobody() -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--", env!("CARGO_BIN_EXE_gleaner")]);
    c
}

#[test]
#[serial(host)]
fn the_run_directory_and_status_socket_are_root_only() {
    require_root_and_cpuset();
    let dir = tempfile::tempdir().unwrap();
    // Under a world-readable parent, as /run is.
    set_mode(dir.path(), 0o755);
    let run_dir = dir.path().join("gleaner");
    let mut agent = Started(
        gleaner()
            .args(["run", "--timeout-us", "50", "--period-ms", "50", "--run-dir"])
            .arg(&run_dir)
            .args(["--", "sleep", "3"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (up, _) = wait_status(&run_dir, Duration::from_secs(5), |r| r.as_array().is_some_and(|a| !a.is_empty()));
    assert!(up, "agent never reported");
    let meta = std::fs::symlink_metadata(&run_dir).unwrap();
    assert!(meta.is_dir() && meta.uid() == 0 && meta.mode() & 0o777 == 0o700, "run dir mode {:o} uid {}", meta.mode(), meta.uid());
    let socket = run_dir.join(format!("agent-{}.sock", agent.0.id()));
    let smeta = std::fs::symlink_metadata(&socket).unwrap();
    assert!(smeta.uid() == 0 && smeta.mode() & 0o777 == 0o600, "socket mode {:o} uid {}", smeta.mode(), smeta.uid());
    // Another user can neither list the agents nor reach the socket.
    let out = gleaner_as_nobody().args(["status", "--run-dir"]).arg(&run_dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Permission denied"), "nobody read the status: {err}");
    // The socket's own mode, apart from its directory's: a link to it where anyone may look
    // (the same inode, so the same permission), connected to as nobody and as root.
    let open = tempfile::tempdir().unwrap();
    set_mode(open.path(), 0o755);
    let link = open.path().join("agent.sock");
    std::fs::hard_link(&socket, &link).unwrap();
    let connect = |as_nobody: bool| {
        let mut c = if as_nobody {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--", PYTHON3]);
            c
        } else {
            Command::new(PYTHON3)
        };
        let script = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nprint(s.recv(1 << 20)[:1].decode())";
        let out = c
            .args(["-c", script])
            .arg(&link)
            .output()
            .unwrap_or_else(|e| panic!("this test needs /usr/bin/python3 (python3) and setpriv (util-linux): {e}"));
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, out, err) = connect(false);
    assert!(ok && out.trim() == "{", "root could not read the status through the link: {out} {err}");
    let (ok, out, err) = connect(true);
    assert!(!ok && err.contains("PermissionError"), "nobody connected to the agent's socket: {out} {err}");
    assert!(wait_child(&mut agent.0, Duration::from_secs(10)).is_some_and(|s| s.success()));
    assert_no_leftovers(&run_dir);
}

#[test]
#[serial(host)]
fn a_run_directory_that_is_a_symlink_or_open_to_others_is_refused() {
    require_root_and_cpuset();
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    set_mode(&real, 0o700);
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = gleaner().args(["run", "--timeout-us", "50", "--run-dir"]).arg(&link).args(["--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("symbolic links are not followed") && err.contains(&link.display().to_string()), "{err}");
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0, "nothing was written through the link");

    set_mode(&real, 0o777);
    let out = gleaner().args(["run", "--timeout-us", "50", "--run-dir"]).arg(&real).args(["--", "true"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("writable by others (mode 777)"), "{err}");
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), 0);
    assert!(leftover_agent_groups().is_empty());
}

#[test]
#[serial(host)]
fn restore_never_follows_a_symlinked_state_file() {
    require_root_and_cpuset();
    let (root, v1) = cpuset_root().unwrap();
    // A group whose cpus a forged state file would "restore" to the first CPU only.
    let cg = root.join(format!("gleaner-test-forged-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    let _guard = RemoveDir(cg.clone());
    if v1 {
        std::fs::write(cg.join("cpuset.mems"), std::fs::read_to_string(root.join("cpuset.mems")).unwrap()).unwrap();
    }
    let all = online_cpus().0;
    std::fs::write(cg.join("cpuset.cpus"), &all).unwrap();
    let before = std::fs::read_to_string(cg.join("cpuset.cpus")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    set_mode(&run_dir, 0o700);
    let forged = dir.path().join("forged.json");
    let first = all.split(['-', ',']).next().unwrap();
    std::fs::write(
        &forged,
        format!(r#"{{"agent_pid": 999999999, "changes": [{{"kind": "set_cpus", "path": "{}", "original": "{first}"}}]}}"#, cg.display()),
    )
    .unwrap();
    let link = run_dir.join("agent-999999999.json");
    std::os::unix::fs::symlink(&forged, &link).unwrap();
    let out = gleaner().args(["restore", "--run-dir"]).arg(&run_dir).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&link.display().to_string()) && err.contains("symbolic link (not followed)"), "{err}");
    assert_eq!(std::fs::read_to_string(cg.join("cpuset.cpus")).unwrap(), before, "the forged change was applied");
    // The same content as a real file of root's is a state file like any other.
    std::fs::remove_file(&link).unwrap();
    std::fs::copy(&forged, &link).unwrap();
    set_mode(&link, 0o600);
    let out = gleaner().args(["restore", "--run-dir"]).arg(&run_dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(cg.join("cpuset.cpus")).unwrap().trim(), first);
}

#[test]
#[serial(host)]
fn a_config_file_others_can_write_is_refused_as_sshd_does() {
    require_root_and_cpuset();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("gleaner.toml");
    std::fs::write(&cfg, "period_ms = 100\n").unwrap();
    for (mode, shown) in [(0o666, "mode 666"), (0o646, "mode 646"), (0o664, "mode 664")] {
        set_mode(&cfg, mode);
        for args in [vec!["run", "--no-consolidation", "--timeout-us", "50", "--config"], vec!["daemon", "--config"]] {
            let mut c = gleaner();
            c.args(&args).arg(&cfg);
            if args[0] == "run" {
                c.args(["--", "true"]);
            }
            let out = c.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} {mode:o}: {err}");
            assert!(err.contains(&format!("writable by others ({shown})")) && err.contains("chmod go-w"), "{err}");
            assert_eq!(err.lines().count(), 1, "one line: {err}");
        }
    }
    // Its directory counts too.
    set_mode(&cfg, 0o644);
    set_mode(dir.path(), 0o777);
    let out = gleaner().args(["daemon", "--config"]).arg(&cfg).output().unwrap();
    set_mode(dir.path(), 0o700);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("its directory {} is writable by others", dir.path().display())), "{err}");
    // 0644 root:root is fine.
    let out = run_true_with_config(&cfg, &dir.path().join("run"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Local addresses (`/proc/net/tcp{,6}`) listening on `port`.
fn listeners(port: u16) -> Vec<String> {
    let mut out = Vec::new();
    for f in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(f).unwrap_or_default().lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            // st 0A: LISTEN.
            if cols.len() > 3 && cols[3] == "0A" && cols[1].ends_with(&format!(":{port:04X}")) {
                out.push(cols[1].to_string());
            }
        }
    }
    out
}

#[test]
#[serial(host)]
fn metrics_given_a_port_alone_listen_on_loopback_only() {
    require_root_and_cpuset();
    let run_dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut agent = Started(
        gleaner()
            .args(["run", "--timeout-us", "50", "--period-ms", "50", "--metrics-addr", &port.to_string(), "--run-dir"])
            .arg(run_dir.path())
            .args(["--", "sleep", "2"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_until(Duration::from_secs(5), || !listeners(port).is_empty()), "nothing listens on port {port}");
    // 0100007F is 127.0.0.1 in /proc/net/tcp's byte order.
    assert_eq!(listeners(port), vec![format!("0100007F:{port:04X}")], "metrics must listen on loopback only");
    assert!(wait_child(&mut agent.0, Duration::from_secs(10)).is_some_and(|s| s.success()));
    assert_run_dir_clean(run_dir.path());
}

/// A user may not attach the agent to another user's process (kill(2)'s rule): as `nobody`,
/// root's `sleep` is refused, naming the rule, before anything is changed.
#[test]
#[serial(host)]
fn attach_refuses_a_process_the_caller_may_not_manage() {
    require_root_and_cpuset();
    let mut workload = Started(Command::new("sleep").arg("30").spawn().unwrap());
    let pid = workload.0.id().to_string();
    let run_dir = tempfile::tempdir().unwrap();
    set_mode(run_dir.path(), 0o777);
    let out = gleaner_as_nobody().args(["attach", "--run-dir"]).arg(run_dir.path().join("nobody")).args(["--pid", &pid]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with(&format!("gleaner: invalid --pid '{pid}': allowed: a process the caller may manage"))
            && err.contains("runs as uid 0"),
        "{err}"
    );
    assert_eq!(cpuset_cgroup_of(workload.0.id()), cpuset_cgroup_of(std::process::id()), "the workload was not moved");
    let _ = workload.0.kill();
}
