//! No cycles between the files of a crate: each file's `crate::...` and `super::...` paths
//! (in `use` lines and in code, outside comments and `#[cfg(test)] mod tests` blocks and declarations) are
//! edges to the file that defines the module they name, and the graph of every crate must be
//! acyclic, so that each file can be read knowing only the files below it. A module's own
//! children, named by bare paths (`session::Session` in `agent/mod.rs`), are not edges: a
//! parent owns its children.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src` (`agent/mod.rs` -> `[agent]`, `lib.rs` -> `[]`).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap();
    let stem = last.trim_end_matches(".rs");
    if !matches!(stem, "mod" | "lib" | "main") {
        parts.push(stem.to_string());
    }
    parts
}

/// The file defining the deepest module that `path` (from the crate root) reaches.
fn file_of(src: &Path, root: &Path, path: &[String]) -> PathBuf {
    let (mut dir, mut file) = (src.to_path_buf(), root.to_path_buf());
    for seg in path {
        let (flat, nested) = (dir.join(format!("{seg}.rs")), dir.join(seg).join("mod.rs"));
        if flat.is_file() {
            file = flat;
        } else if nested.is_file() {
            file = nested;
        } else {
            break;
        }
        dir = dir.join(seg);
    }
    file
}

/// The code of a file without comments and without its test modules.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" && lines.peek().is_some_and(|n| n.trim_start().starts_with("mod tests")) {
            // `mod tests;` declares a file of its own; `mod tests { ... }` is skipped to its
            // closing brace, and what follows it is read.
            let (mut opened, mut closed) = (0usize, 0usize);
            for l in lines.by_ref() {
                let l = l.split("//").next().unwrap_or("");
                opened += l.matches('{').count();
                closed += l.matches('}').count();
                if closed >= opened && (l.contains('}') || l.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        out.push_str(line.split("//").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The paths after `prefix::` in `code`, with `use prefix::{a, b::c}` groups expanded
/// (one level of braces, which is how the tree writes them).
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    let needle = format!("{prefix}::");
    let mut rest = code;
    while let Some(i) = rest.find(&needle) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + needle.len()..];
        if before.is_some_and(|c| ident(c) || c == ':') {
            continue;
        }
        let mut base: Vec<String> = Vec::new();
        let mut s = rest;
        loop {
            let n = s.find(|c: char| !ident(c)).unwrap_or(s.len());
            if n == 0 {
                break;
            }
            base.push(s[..n].to_string());
            s = &s[n..];
            if let Some(t) = s.strip_prefix("::") {
                s = t;
            } else {
                break;
            }
        }
        if let Some(group) = s.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            for item in inner.split(',') {
                let item: Vec<String> =
                    item.trim().split("::").map(|p| p.trim().to_string()).filter(|p| !p.is_empty() && p.chars().all(ident)).collect();
                if item.first().is_some_and(|p| p != "self") {
                    out.push(base.iter().cloned().chain(item).collect());
                }
            }
        }
        out.push(base);
    }
    out
}

/// A crate's file graph: each file and the files its `crate::`/`super::` paths reach.
fn graph(src: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let root = ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).find(|p| p.is_file()).unwrap();
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut g = BTreeMap::new();
    for f in files {
        let code = code_of(&std::fs::read_to_string(&f).unwrap());
        let here = module_of(src, &f);
        let mut to = BTreeSet::new();
        for p in paths_after(&code, "crate") {
            to.insert(file_of(src, &root, &p));
        }
        for p in paths_after(&code, "super") {
            let mut m = here[..here.len().saturating_sub(1)].to_vec();
            m.extend(p);
            to.insert(file_of(src, &root, &m));
        }
        to.remove(&f);
        g.insert(f, to);
    }
    g
}

/// A cycle of `g`, if any, as the files along it.
fn find_cycle(g: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Option<Vec<PathBuf>> {
    fn visit(
        n: &PathBuf,
        g: &BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        state: &mut BTreeMap<PathBuf, u8>,
        stack: &mut Vec<PathBuf>,
    ) -> Option<Vec<PathBuf>> {
        state.insert(n.clone(), 1);
        stack.push(n.clone());
        for m in g.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|x| x == m).unwrap_or(0);
                    return Some(stack[at..].iter().cloned().chain([m.clone()]).collect());
                }
                0 => {
                    if let Some(c) = visit(m, g, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in g.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, g, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_cycle_between_its_files() {
    let mut srcs = vec![Path::new(ROOT).join("src")];
    for e in std::fs::read_dir(Path::new(ROOT).join("crates")).unwrap().flatten() {
        srcs.push(e.path().join("src"));
    }
    let mut cycles = Vec::new();
    for src in srcs {
        let g = graph(&src);
        assert!(
            g.len() > 1 || src.ends_with("gleaner-fuzz-checks/src") || src == Path::new(ROOT).join("src"),
            "{}: no files",
            src.display()
        );
        if let Some(c) = find_cycle(&g) {
            let names: Vec<String> = c.iter().map(|p| p.strip_prefix(ROOT).unwrap_or(p).display().to_string()).collect();
            cycles.push(names.join(" -> "));
        }
    }
    assert!(cycles.is_empty(), "file cycles (each file uses the next through crate:: or super:: paths):\n{}", cycles.join("\n"));
}

/// The guest loop's decisions live once, in gleaner-policy: the lab's predictor and the
/// simulator configure it through `gleaner_policy::guest::setup`, never through the agent's
/// own code (`gleaner_agent::agent`), which only maps the agent's world onto it. The agent's
/// typed records (status, events, calibration reports) may be read.
#[test]
fn the_lab_and_the_simulator_decide_through_the_policy_not_the_agent() {
    let mut hits = Vec::new();
    for krate in ["gleaner-lab", "gleaner-sim"] {
        let mut files = Vec::new();
        rust_files(&Path::new(ROOT).join("crates").join(krate).join("src"), &mut files);
        assert!(!files.is_empty(), "{krate}: no files");
        for f in files {
            let code = code_of(&std::fs::read_to_string(&f).unwrap());
            if code.contains("gleaner_agent::agent") {
                hits.push(f.strip_prefix(ROOT).unwrap_or(&f).display().to_string());
            }
        }
    }
    assert!(hits.is_empty(), "these call the agent's own code instead of gleaner_policy::guest::setup: {hits:?}");
}

/// The checker itself: paths and groups are read, comments are not, and a two-file cycle is
/// found.
#[test]
fn the_checker_reads_paths_and_finds_a_cycle() {
    let code = code_of(
        "use crate::{a::B, c};\n// crate::z::Doc\nfn f() { crate::d::e(); super::S; }\n#[cfg(test)]\nmod tests { use crate::t; }\n#[cfg(test)]\nmod tests;\nfn g() { crate::after::h(); }\n",
    );
    let crate_paths = paths_after(&code, "crate");
    assert!(crate_paths.contains(&vec!["a".to_string(), "B".to_string()]) && crate_paths.contains(&vec!["c".to_string()]));
    assert!(crate_paths.contains(&vec!["d".to_string(), "e".to_string()]));
    assert!(crate_paths.contains(&vec!["after".to_string(), "h".to_string()]), "what follows a test module is read: {crate_paths:?}");
    assert!(!crate_paths.iter().any(|p| p.first().is_some_and(|s| s == "z" || s == "t")), "{crate_paths:?}");
    assert_eq!(paths_after(&code, "super"), vec![vec!["S".to_string()]]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::B;\npub struct A;\n").unwrap();
    std::fs::write(src.join("b.rs"), "pub struct B(crate::a::A);\n").unwrap();
    let c = find_cycle(&graph(src)).expect("a <-> b");
    assert_eq!(c.len(), 3, "{c:?}");
    std::fs::write(src.join("b.rs"), "pub struct B;\n").unwrap();
    assert_eq!(find_cycle(&graph(src)), None);
}
