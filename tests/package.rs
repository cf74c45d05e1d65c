//! The Debian package as a user gets it: `scripts/build-deb.sh --no-build` packages the binary
//! under test with cargo-deb (no second release build), then the tests check what the .deb
//! holds, run `systemd-analyze verify` on its unit, and install, run and purge it with dpkg.
//!
//! Needs cargo-deb (`cargo install cargo-deb --version 3.8.0 --locked`), dpkg-dev, binutils,
//! systemd (systemd-analyze) and man-db; a missing one fails the test that needs it, naming it
//! (`scripts/test.sh` installs them). The install test needs root and changes host-global state (dpkg's
//! database, /usr, /etc), so it refuses to run over an installed gleaner and runs serially.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::gleaner;
use serial_test::serial;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const CARGO_DEB_INSTALL: &str = "cargo install cargo-deb --version 3.8.0 --locked";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Fails the test, naming `program` and how to get it, unless it is on PATH.
fn require(program: &str, how: &str) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).any(|d| d.join(program).is_file());
    assert!(found, "{program} is missing: {how}");
}

/// Runs `cmd`; fails the test with its output unless it succeeds. Returns its stdout.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed ({}): {}{}", out.status, String::from_utf8_lossy(&out.stdout), stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The .deb of the binary under test, built once per test process by `scripts/build-deb.sh
/// --no-build` with the target dir of that binary (so cargo-deb packages exactly it).
fn deb() -> &'static Path {
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    DEB.get_or_init(|| {
        let ok = Command::new("cargo").args(["deb", "--version"]).output().is_ok_and(|o| o.status.success());
        assert!(ok, "cargo-deb is missing (`cargo deb --version` failed): install it with `{CARGO_DEB_INSTALL}`");
        require("dpkg-shlibdeps", "apt-get install dpkg-dev (cargo-deb computes Depends with it)");
        require("strip", "apt-get install binutils (cargo-deb strips the binary with it)");
        let bin = Path::new(env!("CARGO_BIN_EXE_gleaner"));
        let release = bin.parent().unwrap();
        assert_eq!(release.file_name().unwrap(), "release", "run with --release: the package holds the release binary ({})", bin.display());
        let target_dir = release.parent().unwrap();
        let stdout = run_ok(
            Command::new("bash")
                .arg(repo().join("scripts/build-deb.sh"))
                .arg("--no-build")
                .env("CARGO_TARGET_DIR", target_dir)
                .current_dir(repo()),
        );
        let last = stdout.lines().last().unwrap_or_default();
        let deb = repo().join(last);
        assert!(deb.is_file() && last.ends_with(".deb"), "build-deb.sh's last line is not a .deb: {stdout}");
        deb
    })
}

/// Paths of the regular files in the .deb (`dpkg-deb -c`), without the leading `.`, with their
/// permission strings.
fn deb_files() -> Vec<(String, String)> {
    let listing = run_ok(Command::new("dpkg-deb").arg("-c").arg(deb()));
    listing
        .lines()
        .filter(|l| l.starts_with('-'))
        .map(|l| {
            let mode = l.split_whitespace().next().unwrap().to_string();
            let path = l.split_whitespace().last().unwrap().trim_start_matches('.').to_string();
            (path, mode)
        })
        .collect()
}

/// The man pages the binary under test generates (`gleaner man-pages`), by file name.
fn generated_man_pages(dir: &Path) -> Vec<PathBuf> {
    let out = run_ok(gleaner().arg("man-pages").arg(dir));
    out.lines().map(PathBuf::from).collect()
}

fn extract(deb: &Path, root: &Path) {
    run_ok(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root));
}

/// Renders a man page with `man -l` and fails on any groff/man warning.
fn assert_man_page_renders(page: &Path, name: &str) {
    require("man", "apt-get install man-db");
    let out = Command::new("man").args(["--warnings", "-l"]).arg(page).env("MANWIDTH", "100").env("MANPAGER", "cat").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stderr(&out).is_empty(), "man -l {}: {} {}", page.display(), out.status, stderr(&out));
    assert!(text.contains("NAME") && text.contains(name), "man -l {} rendered: {text}", page.display());
}

/// Loads a bash completion script in a fresh bash and completes `gleaner comp<TAB>` and
/// `gleaner completions <TAB>` with it.
fn assert_bash_completion_works(script: &Path) {
    let out = run_ok(
        Command::new("bash")
            .arg("-c")
            .arg(
                r#"source "$1" || exit 1
           complete -p gleaner || exit 1
           COMP_WORDS=(gleaner comp); COMP_CWORD=1; _gleaner gleaner comp gleaner; echo "first: ${COMPREPLY[*]}"
           COMP_WORDS=(gleaner completions ""); COMP_CWORD=2; _gleaner gleaner "" completions; echo "shell: ${COMPREPLY[*]}""#,
            )
            .arg("bash")
            .arg(script),
    );
    assert!(out.contains("-F _gleaner gleaner"), "{out}");
    assert!(out.lines().any(|l| l.starts_with("first:") && l.contains("compare") && l.contains("completions")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("shell:") && l.contains("bash") && l.contains("zsh") && l.contains("fish")), "{out}");
}

#[test]
fn deb_holds_the_binary_unit_config_man_pages_completions_and_docs() {
    let files = deb_files();
    let paths: BTreeSet<String> = files.iter().map(|(p, _)| p.clone()).collect();
    let man_dir = tempfile::tempdir().unwrap();
    let pages = generated_man_pages(man_dir.path());
    let names: Vec<String> = pages.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for page in ["gleaner.1", "gleaner-run.1", "gleaner-daemon.1", "gleaner-diagnose.1", "gleaner-completions.1", "gleaner-bench-wakeup.1"]
    {
        assert!(names.iter().any(|n| n == page), "{page} not generated: {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("man-pages")), "the hidden man-pages command got a page: {names:?}");
    let mut expected: BTreeSet<String> = [
        "/usr/bin/gleaner",
        "/usr/lib/systemd/system/gleaner.service",
        "/etc/gleaner/gleaner.toml",
        "/usr/share/bash-completion/completions/gleaner",
        "/usr/share/zsh/vendor-completions/_gleaner",
        "/usr/share/fish/vendor_completions.d/gleaner.fish",
        "/usr/share/doc/gleaner/copyright",
        "/usr/share/doc/gleaner/README.md",
        "/usr/share/doc/gleaner/agent.md",
        "/usr/share/doc/gleaner/diagnose.md",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    expected.extend(names.iter().map(|n| format!("/usr/share/man/man1/{n}.gz")));
    assert_eq!(paths, expected, "dpkg-deb -c: the .deb's files differ from the expected ones");
    for (path, mode) in &files {
        let want = if path == "/usr/bin/gleaner" { "-rwxr-xr-x" } else { "-rw-r--r--" };
        assert_eq!(mode, want, "{path}");
    }

    // dpkg-deb -I / -f: control fields, the conffile, maintainer scripts that never enable or start the unit.
    let field = |name: &str| run_ok(Command::new("dpkg-deb").arg("-f").arg(deb()).arg(name)).trim().to_string();
    assert_eq!(field("Package"), "gleaner");
    assert_eq!(field("Version"), format!("{VERSION}-1"));
    assert!(field("Depends").starts_with("libc6"), "Depends not computed from the binary: {}", field("Depends"));
    let conffiles = run_ok(Command::new("dpkg-deb").arg("-I").arg(deb()).arg("conffiles"));
    assert_eq!(conffiles.trim(), "/etc/gleaner/gleaner.toml");
    let postinst = run_ok(Command::new("dpkg-deb").arg("-I").arg(deb()).arg("postinst"));
    assert!(postinst.contains("gleaner.service"), "postinst does not handle the unit: {postinst}");
    for forbidden in
        ["deb-systemd-invoke start", "deb-systemd-invoke restart ", "systemctl enable", "systemctl start", "new installations run enable"]
    {
        assert!(!postinst.contains(forbidden), "postinst would enable or start the unit ({forbidden}): {postinst}");
    }

    let root = tempfile::tempdir().unwrap();
    extract(deb(), root.path());
    let at = |p: &str| root.path().join(p.trim_start_matches('/'));

    // The binary: the one under test, stripped.
    let packaged = at("/usr/bin/gleaner");
    assert_eq!(run_ok(Command::new(&packaged).arg("--version")).trim(), format!("gleaner {VERSION}"));
    require("readelf", "apt-get install binutils");
    let sections = run_ok(Command::new("readelf").args(["-S", "--wide"]).arg(&packaged));
    assert!(!sections.contains(".debug_info") && !sections.contains(".symtab"), "packaged binary not stripped: {sections}");
    let size = |p: &Path| std::fs::metadata(p).unwrap().len();
    assert!(size(&packaged) < size(Path::new(env!("CARGO_BIN_EXE_gleaner"))), "stripping did not shrink the binary");

    // The conffile is exactly `gleaner daemon --print-config`.
    let sample = run_ok(gleaner().args(["daemon", "--print-config"]));
    assert_eq!(std::fs::read_to_string(at("/etc/gleaner/gleaner.toml")).unwrap(), sample, "/etc/gleaner/gleaner.toml != print-config");

    // The unit is dist/gleaner.service.
    let unit = std::fs::read_to_string(at("/usr/lib/systemd/system/gleaner.service")).unwrap();
    assert_eq!(unit, std::fs::read_to_string(repo().join("dist/gleaner.service")).unwrap());

    // Completions: what `gleaner completions SHELL` prints; bash's loads and completes.
    for (shell, path) in [
        ("bash", "/usr/share/bash-completion/completions/gleaner"),
        ("zsh", "/usr/share/zsh/vendor-completions/_gleaner"),
        ("fish", "/usr/share/fish/vendor_completions.d/gleaner.fish"),
    ] {
        assert_eq!(std::fs::read_to_string(at(path)).unwrap(), run_ok(gleaner().args(["completions", shell])), "{path}");
    }
    assert_bash_completion_works(&at("/usr/share/bash-completion/completions/gleaner"));

    // Man pages: gzip of what `gleaner man-pages` writes, each renders without warnings.
    for (page, name) in pages.iter().zip(&names) {
        let gz = at(&format!("/usr/share/man/man1/{name}.gz"));
        let plain = run_ok(Command::new("gzip").arg("-dc").arg(&gz));
        assert_eq!(plain, std::fs::read_to_string(page).unwrap(), "{name}.gz is not the generated page");
        assert_man_page_renders(&gz, name.trim_end_matches(".1"));
    }
}

/// Processes running the installed `gleaner daemon` (from /proc: their command lines).
fn daemon_processes() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                        let words: Vec<&[u8]> = c.split(|b| *b == 0).collect();
                        words.first().is_some_and(|w| w.ends_with(b"gleaner")) && words.get(1) == Some(&&b"daemon"[..])
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A copy of this machine's systemd units (sysinit.target and the rest a service depends on),
/// for `systemd-analyze verify --root`.
fn root_with_system_units() -> tempfile::TempDir {
    require("systemd-analyze", "apt-get install systemd");
    let units = Path::new("/usr/lib/systemd/system");
    assert!(units.join("sysinit.target").exists(), "{} has no sysinit.target: apt-get install systemd", units.display());
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("usr/lib/systemd")).unwrap();
    run_ok(Command::new("cp").arg("-a").arg(units).arg(root.path().join("usr/lib/systemd/")));
    root
}

/// `systemd-analyze verify --root ROOT gleaner.service`: its status and the lines about gleaner.
fn verify_in(root: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg("--man=no")
        .arg(format!("--root={}", root.display()))
        .arg("gleaner.service")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
    let about: Vec<&str> = text.lines().filter(|l| l.contains("gleaner")).collect();
    (out.status.success(), about.join("\n"))
}

#[test]
fn unit_passes_systemd_analyze_verify_packaged_and_manually_installed() {
    // As packaged: the unit and the binary extracted from the .deb, next to this machine's units.
    // (The man:gleaner-daemon(1) reference is checked by the install test, where man finds it.)
    let root = root_with_system_units();
    extract(deb(), root.path());
    let (ok, about) = verify_in(root.path());
    assert!(ok && about.is_empty(), "systemd-analyze verify on the packaged unit: {about}");
    // verify does look at ExecStart: without the binary it fails.
    std::fs::remove_file(root.path().join("usr/bin/gleaner")).unwrap();
    let (ok, about) = verify_in(root.path());
    assert!(!ok && about.contains("/usr/bin/gleaner"), "verify passed without /usr/bin/gleaner: {about}");

    // As the unit's header tells a manual install to do it: the binary in /usr/local/bin and
    // the unit rewritten by its own sed command into /etc/systemd/system.
    let dist = std::fs::read_to_string(repo().join("dist/gleaner.service")).unwrap();
    let sed_line = dist.lines().find(|l| l.starts_with('#') && l.contains("sed '")).expect("the unit's header has the manual-install sed");
    let expr = sed_line.split('\'').nth(1).unwrap();
    let manual = run_ok(Command::new("sed").arg(expr).arg(repo().join("dist/gleaner.service")));
    let exec: Vec<&str> = manual.lines().filter(|l| l.starts_with("Exec")).collect();
    assert!(exec.len() >= 3 && exec.iter().all(|l| l.contains("=/usr/local/bin/gleaner ")), "{exec:?}");
    let root = root_with_system_units();
    std::fs::create_dir_all(root.path().join("etc/systemd/system")).unwrap();
    std::fs::write(root.path().join("etc/systemd/system/gleaner.service"), &manual).unwrap();
    std::fs::create_dir_all(root.path().join("usr/local/bin")).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_gleaner"), root.path().join("usr/local/bin/gleaner")).unwrap();
    let (ok, about) = verify_in(root.path());
    assert!(ok && about.is_empty(), "systemd-analyze verify on the manually installed unit: {about}");
}

/// dpkg's status of the package `gleaner` ("" if dpkg never heard of it).
fn dpkg_status() -> String {
    let out = Command::new("dpkg-query").args(["-W", "-f=${Status}", "gleaner"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Files anywhere under `dir` whose name contains "gleaner".
fn gleaner_entries_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_name().to_string_lossy().contains("gleaner") {
                found.push(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p);
            }
        }
    }
    found
}

/// Paths the package must not find (before) or leave (after): its own, and enable/mask state.
fn host_gleaner_state() -> Vec<PathBuf> {
    let mut state: Vec<PathBuf> = ["/usr/bin/gleaner", "/etc/gleaner", "/usr/lib/systemd/system/gleaner.service", "/usr/share/doc/gleaner"]
        .into_iter()
        .map(PathBuf::from)
        .filter(|p| p.symlink_metadata().is_ok())
        .collect();
    state.extend(gleaner_entries_under(Path::new("/etc/systemd/system")));
    state.extend(gleaner_entries_under(Path::new("/var/lib/systemd/deb-systemd-helper-enabled")));
    state.extend(gleaner_entries_under(Path::new("/var/lib/systemd/deb-systemd-helper-masked")));
    state
}

/// Purges the package when dropped, so a failed assertion does not leave it installed.
struct PurgeOnDrop;

impl Drop for PurgeOnDrop {
    fn drop(&mut self) {
        let out = Command::new("dpkg").args(["--purge", "gleaner"]).output();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("cleanup: dpkg --purge gleaner failed: {out:?}");
        }
    }
}

#[test]
#[serial(host)]
fn deb_installs_runs_and_purges_without_leftovers() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test installs a package with dpkg and needs root (CI runs as root)");
    let deb = deb();
    let files: Vec<String> = deb_files().into_iter().map(|(p, _)| p).collect();
    let status = dpkg_status();
    assert!(
        status.is_empty() || status.ends_with("not-installed"),
        "a package named gleaner is already known to dpkg ({status}); refusing to replace it: `dpkg --purge gleaner` first"
    );
    let before = host_gleaner_state();
    assert!(before.is_empty(), "gleaner is already installed on this machine outside dpkg, refusing to clobber it: {before:?}");

    let guard = PurgeOnDrop;
    run_ok(Command::new("dpkg").arg("-i").arg(deb).env("DEBIAN_FRONTEND", "noninteractive"));
    assert_eq!(dpkg_status(), "install ok installed");
    for f in &files {
        assert!(Path::new(f).is_file(), "{f} not installed (does a path-exclude in /etc/dpkg/dpkg.cfg.d/ drop it?)");
    }
    let conffiles = run_ok(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "gleaner"]));
    assert!(conffiles.contains("/etc/gleaner/gleaner.toml"), "not a conffile: {conffiles}");

    // The installed binary works: --version, diagnose, and the config it ships is its own sample.
    let bin = Path::new("/usr/bin/gleaner");
    assert_eq!(run_ok(Command::new(bin).arg("--version")).trim(), format!("gleaner {VERSION}"));
    let report = run_ok(Command::new(bin).args(["diagnose", "--rounds", "300"]));
    assert!(report.contains("virtualized:") && report.contains("exposure:"), "gleaner diagnose: {report}");
    assert_eq!(std::fs::read_to_string("/etc/gleaner/gleaner.toml").unwrap(), run_ok(Command::new(bin).args(["daemon", "--print-config"])));

    // man finds the pages by name; bash completion loads from its standard place.
    require("man", "apt-get install man-db");
    let where_ = run_ok(Command::new("man").args(["-w", "gleaner-daemon"]));
    assert_eq!(where_.trim(), "/usr/share/man/man1/gleaner-daemon.1.gz");
    assert_man_page_renders(Path::new("/usr/share/man/man1/gleaner.1.gz"), "gleaner");
    assert_bash_completion_works(Path::new("/usr/share/bash-completion/completions/gleaner"));

    // The installed unit verifies with every check on (its ExecStart binary and its
    // man:gleaner-daemon(1) now exist) and is neither enabled nor running.
    require("systemd-analyze", "apt-get install systemd");
    let out = Command::new("systemd-analyze").args(["verify", "/usr/lib/systemd/system/gleaner.service"]).output().unwrap();
    assert!(out.status.success() && !stderr(&out).contains("gleaner"), "systemd-analyze verify: {}", stderr(&out));
    let enabled = Command::new("systemctl").args(["is-enabled", "gleaner.service"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&enabled.stdout).trim(), "disabled", "{}", stderr(&enabled));
    assert!(gleaner_entries_under(Path::new("/etc/systemd/system")).is_empty(), "the package enabled the unit");
    if Path::new("/run/systemd/system").is_dir() {
        let active = Command::new("systemctl").args(["is-active", "gleaner.service"]).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&active.stdout).trim(), "inactive", "the package started the unit");
    } else {
        // No systemd running (a container, as CI's): a start would have run the daemon
        // directly (deb-systemd-invoke is a no-op here, but a maintainer script could still
        // exec it): no `gleaner daemon` process may exist.
        let daemons = daemon_processes();
        assert!(daemons.is_empty(), "the package started the daemon: pids {daemons:?}");
    }

    // Purge: nothing of the package is left.
    drop(guard);
    let status = dpkg_status();
    assert!(status.is_empty() || status.ends_with("not-installed"), "after dpkg --purge: {status}");
    for f in &files {
        assert!(!Path::new(f).exists(), "{f} left after purge");
    }
    let after = host_gleaner_state();
    assert!(after.is_empty(), "left after purge: {after:?}");
}
