//! docs/design.md draws the crate graph as `crate --> dependencies` lines; this test holds the
//! drawing to the `Cargo.toml`s, so an arrow added or removed in code cannot leave the design
//! page wrong.

use std::collections::BTreeSet;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The `gleaner-*` crates in the `[dependencies]` section of a manifest, by short name
/// (`gleaner-os` -> `os`).
fn manifest_deps(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
    let mut section = String::new();
    let mut deps = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[dependencies]" {
            if let Some(name) = line.split(['.', '=', ' ']).next().and_then(|n| n.strip_prefix("gleaner-")) {
                deps.insert(name.to_string());
            }
        }
    }
    deps
}

/// `(crate, its arrows)` from the diagram's `NAME --> a, b, c` lines.
fn drawn_deps() -> Vec<(String, BTreeSet<String>)> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/design.md")).unwrap();
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once("-->") else { continue };
        let Some(name) = left.split_whitespace().find(|w| w.starts_with("gleaner")) else { continue };
        if !left.trim_end().ends_with(name) && !left.contains("(bin)") {
            continue;
        }
        // The arrow's targets end at the first run of two spaces (a comment may follow).
        let right = right.trim_start();
        let list = right.split("  ").next().unwrap_or("");
        let deps = if list.starts_with("(nothing") {
            BTreeSet::new()
        } else {
            list.split(',').map(|d| d.trim().to_string()).filter(|d| !d.is_empty()).collect()
        };
        out.push((name.to_string(), deps));
    }
    out
}

#[test]
fn the_design_pages_crate_graph_is_the_cargo_graph() {
    let drawn = drawn_deps();
    let crates: Vec<String> = std::fs::read_dir(Path::new(ROOT).join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "gleaner-fuzz-checks")
        .collect();
    for name in crates.iter().map(String::as_str).chain(["gleaner"]) {
        let manifest = if name == "gleaner" {
            Path::new(ROOT).join("Cargo.toml")
        } else {
            Path::new(ROOT).join("crates").join(name).join("Cargo.toml")
        };
        let actual = manifest_deps(&manifest);
        let (_, drawn_for) = drawn
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("docs/design.md draws no `{name} --> ...` line; its Cargo.toml depends on {actual:?}"));
        assert_eq!(drawn_for, &actual, "docs/design.md's arrows from {name} differ from {}", manifest.display());
    }
}

/// The `gleaner_policy` modules the files under `src` name (`gleaner_policy::idle::...` ->
/// `idle`), outside comments.
fn policy_modules_used(src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            for line in text.lines().map(|l| l.split("//").next().unwrap_or("")) {
                for (i, _) in line.match_indices("gleaner_policy::") {
                    let rest = &line[i + "gleaner_policy::".len()..];
                    let m: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !m.is_empty() {
                        out.insert(m);
                    }
                }
            }
        }
    }
    out
}

/// gleaner-os is mechanism: it uses policy only for the types named on its arrow (`(input:
/// BadInput; idle: ...)`), so a new use of policy from the OS layer shows on the design page.
#[test]
fn the_os_arrow_names_what_os_uses_of_policy() {
    let text = std::fs::read_to_string(Path::new(ROOT).join("docs/design.md")).unwrap();
    let line =
        text.lines().find(|l| l.contains("gleaner-os") && l.contains("--> policy")).expect("docs/design.md draws gleaner-os --> policy");
    let note = line.split_once('(').map(|(_, n)| n).unwrap_or("");
    let named: BTreeSet<String> =
        note.split(';').filter_map(|part| part.split_once(':').map(|(m, _)| m.trim().to_string())).filter(|m| !m.is_empty()).collect();
    let used = policy_modules_used(&Path::new(ROOT).join("crates/gleaner-os/src"));
    assert!(!used.is_empty(), "gleaner-os uses no gleaner_policy module: drop the arrow");
    assert_eq!(named, used, "docs/design.md's gleaner-os --> policy note names {named:?}; gleaner-os uses policy's {used:?}");
}
