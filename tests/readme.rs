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
/// one; a glob or a brace list (`docs/data/current/front/*.json`) names no one file, nor does
/// a path in git's history (`git show REV:docs/data/...`, after a colon).
fn data_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("docs/data/") {
        let in_history = rest[..i].ends_with(':');
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || "/-_.".contains(c))).unwrap_or(tail.len());
        let pattern = tail[end..].starts_with(['*', '{']);
        let p = tail[..end].trim_end_matches('.').trim_end_matches('/');
        if !pattern && !in_history && p.len() > "docs/data".len() {
            paths.push(p.to_string());
        }
        rest = &tail[end..];
    }
    paths
}

#[test]
fn every_data_path_a_page_names_exists() {
    let mut missing = Vec::new();
    for (page, text) in pages_text() {
        for p in data_paths(&text) {
            if !root().join(&p).exists() {
                missing.push(format!("{}: {p}", page.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(missing.is_empty(), "pages name data that is not in the tree:\n{}", missing.join("\n"));
}

/// README and every page under docs/, with a page's relative links (`](data/...)`) written
/// from the root.
fn pages_text() -> Vec<(PathBuf, String)> {
    let mut pages = vec![root().join("README.md")];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            pages.push(p);
        }
    }
    pages
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap().replace("](data/", "](docs/data/");
            (p, text)
        })
        .collect()
}

/// docs/data holds only what the pages cite: one `current` folder, and each of its entries
/// named by README or a page under docs/ (`docs/data/current/NAME`, or a path below it).
#[test]
fn docs_data_holds_only_what_a_page_cites() {
    let data = root().join("docs/data");
    let top: Vec<String> = std::fs::read_dir(&data).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert_eq!(top, ["current"], "docs/data holds more than `current`: {top:?}");
    let cited: Vec<String> = pages_text().iter().flat_map(|(_, t)| data_paths(t)).collect();
    let mut uncited = Vec::new();
    for e in std::fs::read_dir(data.join("current")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        let path = format!("docs/data/current/{name}");
        if !cited.iter().any(|c| *c == path || c.starts_with(&format!("{path}/"))) {
            uncited.push(path);
        }
    }
    assert!(uncited.is_empty(), "in docs/data but named by no page (README.md, docs/*.md):\n{}", uncited.join("\n"));
}

#[test]
fn data_paths_are_cut_at_the_path_s_end() {
    assert_eq!(
        data_paths("see `docs/data/current/front` and (docs/data/x/y.json)."),
        vec!["docs/data/current/front", "docs/data/x/y.json"]
    );
    assert!(data_paths("docs/data/current/front/*.json and docs/data/x/{a,b}.json").is_empty());
    assert!(data_paths("`git show 7d851b1:docs/data/old/README.md`").is_empty());
}

/// The places that name a section of a page (`docs/PAGE.md, "Heading"` or `[PAGE.md](...),
/// "Heading"`, on one line): README, every page under docs/, and the code's comments.
fn section_references() -> Vec<(String, String, String)> {
    let mut files = vec![root().join("README.md")];
    for dir in ["docs", "crates", "src", "tests"] {
        let mut stack = vec![root().join(dir)];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    if !p.ends_with("target") && !p.ends_with("data") {
                        stack.push(p);
                    }
                } else if p.extension().is_some_and(|x| x == "md" || x == "rs") && !p.ends_with("tests/readme.rs") {
                    files.push(p);
                }
            }
        }
    }
    let mut refs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for line in text.lines() {
            let mut rest = line;
            while let Some(i) = rest.find(".md") {
                let before = &rest[..i];
                let page = before.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).next().unwrap_or("");
                let after = &rest[i + 3..];
                let after = after.strip_prefix(']').map_or(after, |a| a.find(')').map_or(a, |j| &a[j + 1..]));
                if let Some(q) = after.strip_prefix(", \"") {
                    if let Some(end) = q.find('"') {
                        refs.push((f.strip_prefix(root()).unwrap().display().to_string(), format!("{page}.md"), q[..end].to_string()));
                    }
                }
                rest = &rest[i + 3..];
            }
        }
    }
    refs
}

/// Every section a comment or a page names is there: a heading of that page (or a bold
/// paragraph lead) that starts with the named text.
#[test]
fn every_named_section_exists() {
    let refs = section_references();
    assert!(refs.len() >= 5, "the scan found too few references to be working: {refs:?}");
    let mut missing = Vec::new();
    for (from, page, section) in refs {
        let path = if page == "README.md" { root().join(&page) } else { root().join("docs").join(&page) };
        let Ok(text) = std::fs::read_to_string(&path) else {
            missing.push(format!("{from}: {page} (no such page)"));
            continue;
        };
        let found = text.lines().any(|l| {
            let l = l.trim_start();
            let heading = l.trim_start_matches('#');
            (heading.len() < l.len() && heading.trim_start().starts_with(&section))
                || l.strip_prefix("**").is_some_and(|b| b.starts_with(&section))
        });
        if !found {
            missing.push(format!("{from}: {page}, \"{section}\""));
        }
    }
    assert!(missing.is_empty(), "sections named but not on their page:\n{}", missing.join("\n"));
}
