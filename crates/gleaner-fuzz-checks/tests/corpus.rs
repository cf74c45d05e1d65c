//! Replays every checked-in fuzz input (`fuzz/corpus/<target>/*`: seeds and the regression
//! inputs of crashes found) through its target's check, on stable and without libFuzzer.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn names_in(dir: &Path, strip: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").file_name().to_string_lossy().into_owned())
        .filter_map(|n| n.strip_suffix(strip).map(str::to_string))
        .collect()
}

/// Every fuzz target has a check here and a non-empty seed directory, and nothing else is
/// there: a target added without seeds, or seeds of a removed target, fail this test.
#[test]
fn every_target_has_a_check_and_seeds() {
    let checks: BTreeSet<String> = gleaner_fuzz_checks::TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(checks.len(), gleaner_fuzz_checks::TARGETS.len(), "duplicate target names");
    assert_eq!(names_in(&fuzz_dir().join("fuzz_targets"), ".rs"), checks, "fuzz/fuzz_targets/*.rs vs TARGETS");
    assert_eq!(names_in(&fuzz_dir().join("corpus"), ""), checks, "fuzz/corpus/* vs TARGETS");
}

/// Each seed and regression input passes its target's check (a check panics on failure).
#[test]
fn corpus_replays_through_the_checks() {
    let mut total = 0;
    for (name, check) in gleaner_fuzz_checks::TARGETS {
        let dir = fuzz_dir().join("corpus").join(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{} has no seeds", dir.display());
        for f in &files {
            let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let r = std::panic::catch_unwind(|| check(&data));
            assert!(
                r.is_ok(),
                "target {name}: input {} fails its check (replay: scripts/fuzz.sh --replay {name} {})",
                f.display(),
                f.display()
            );
        }
        total += files.len();
    }
    assert!(total >= gleaner_fuzz_checks::TARGETS.len());
}
