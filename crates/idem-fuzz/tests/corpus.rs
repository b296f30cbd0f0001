//! Replays the committed corpus (`fuzz/corpus/TARGET/*`: seeds and every crash ever
//! found) through the property functions, so that `cargo test` guards what the fuzzers
//! found without running them.

use std::collections::BTreeSet;
use std::fs;
use std::panic;
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join("corpus").join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_committed_input_keeps_its_properties() {
    let mut failures = Vec::new();
    for &(target, property) in idem_fuzz::TARGETS {
        let files = inputs(target);
        assert!(!files.is_empty(), "fuzz/corpus/{target}/ has no inputs");
        for file in files {
            let data = fs::read(&file).expect("a corpus file");
            if panic::catch_unwind(|| property(&data)).is_err() {
                failures.push(file.display().to_string());
            }
        }
    }
    assert!(failures.is_empty(), "properties broken by {failures:#?}");
}

#[test]
fn every_target_has_a_harness_and_a_corpus() {
    let fuzz = fuzz_dir();
    let manifest = fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    let names: BTreeSet<&str> = idem_fuzz::TARGETS.iter().map(|t| t.0).collect();
    assert_eq!(names.len(), idem_fuzz::TARGETS.len(), "a name twice");
    for name in &names {
        let harness = fuzz.join("fuzz_targets").join(format!("{name}.rs"));
        let source =
            fs::read_to_string(&harness).unwrap_or_else(|e| panic!("{}: {e}", harness.display()));
        assert!(
            source.contains(&format!("idem_fuzz::{name}(")),
            "{} does not call idem_fuzz::{name}",
            harness.display()
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
    }
    let dirs = |sub: &str| -> BTreeSet<String> {
        fs::read_dir(fuzz.join(sub))
            .expect("a fuzz directory")
            .map(|e| e.expect("an entry").path())
            .filter_map(|p| {
                let stem = p.file_stem()?.to_str()?.to_owned();
                Some(stem)
            })
            .collect()
    };
    let names: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
    assert_eq!(dirs("corpus"), names, "fuzz/corpus/ against TARGETS");
    assert_eq!(
        dirs("fuzz_targets"),
        names,
        "fuzz/fuzz_targets/ against TARGETS"
    );
}
