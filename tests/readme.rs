//! README and docs say only what committed documents say: the tables between README's markers
//! are what `scripts/bench/readme-tables.py` renders from docs/data/current, and every
//! `docs/data/...` path a page names exists.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn readme_tables_are_rendered_from_their_documents() {
    let out = Command::new("python3")
        .arg(root().join("scripts/bench/readme-tables.py"))
        .arg("--check")
        .output()
        .unwrap_or_else(|e| panic!("this test needs python3 (scripts/test.sh installs it): {e}"));
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

/// The `docs/data/...` paths in `text`, each up to the first character that cannot be in
/// one; a glob or a brace list (`docs/data/current/front/*.json`) names no one file.
fn data_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("docs/data/") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || "/-_.".contains(c))).unwrap_or(tail.len());
        let pattern = tail[end..].starts_with(['*', '{']);
        let p = tail[..end].trim_end_matches('.').trim_end_matches('/');
        if !pattern && p.len() > "docs/data".len() {
            paths.push(p.to_string());
        }
        rest = &tail[end..];
    }
    paths
}

#[test]
fn every_data_path_a_page_names_exists() {
    let mut pages = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    let mut missing = Vec::new();
    for page in &pages {
        // A page under docs/ links its data relatively, `](data/...)`.
        let text = std::fs::read_to_string(page).unwrap().replace("](data/", "](docs/data/");
        for p in data_paths(&text) {
            if !root().join(&p).exists() {
                missing.push(format!("{}: {p}", page.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(missing.is_empty(), "pages name data that is not in the tree:\n{}", missing.join("\n"));
}

#[test]
fn data_paths_are_cut_at_the_path_s_end() {
    assert_eq!(
        data_paths("see `docs/data/current/front` and (docs/data/x/y.json)."),
        vec!["docs/data/current/front", "docs/data/x/y.json"]
    );
    assert!(data_paths("docs/data/current/front/*.json and docs/data/x/{a,b}.json").is_empty());
}
