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
