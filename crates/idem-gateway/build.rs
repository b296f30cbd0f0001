//! Names the commit the `idem` binary is built from, for `idem --version`.
//!
//! Sets `IDEM_VERSION` (`0.1.0`, `0.1.0 (1a2b3c4d5)`, `0.1.0 (1a2b3c4d5-dirty)`) for the
//! crate's compilation. The commit is, first found:
//!
//! 1. `IDEM_BUILD_COMMIT`, for packagers who build outside the repository (empty for
//!    none);
//! 2. the commit `cargo package` recorded in `.cargo_vcs_info.json`, in a crate built
//!    from its `.crate` (from the registry, say), with `-dirty` if it was packaged from a
//!    tree with changes;
//! 3. `git rev-parse --short=9 HEAD` in a checkout of this repository, with `-dirty` when
//!    tracked files have changes;
//! 4. none: the version alone.
//!
//! Nothing here fails the build: without git, or outside a checkout, the version stands
//! alone.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The length of a commit as shown: git's usual short form, a little longer so it stays
/// unambiguous as the history grows.
const SHORT: usize = 9;

fn main() {
    let version = std::env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    println!("cargo:rerun-if-env-changed=IDEM_BUILD_COMMIT");
    println!("cargo:rerun-if-changed=build.rs");
    let commit = from_env()
        .or_else(|| from_vcs_info(&manifest_dir))
        .or_else(|| from_git(&manifest_dir))
        .unwrap_or_default();
    let shown = if commit.is_empty() {
        version
    } else {
        format!("{version} ({commit})")
    };
    println!("cargo:rustc-env=IDEM_VERSION={shown}");
}

/// `IDEM_BUILD_COMMIT`, trimmed; set but empty means no commit. A value that could not
/// stand in one line of `--version` stops the build rather than garble it.
fn from_env() -> Option<String> {
    let value = std::env::var("IDEM_BUILD_COMMIT").ok()?;
    let value = value.trim();
    if let Some(bad) = value.chars().find(|c| !c.is_ascii_graphic()) {
        panic!(
            "IDEM_BUILD_COMMIT={value:?} holds {bad:?}; give a commit such as 1a2b3c4d5 \
             (printable ASCII, no spaces), or leave it empty for none"
        );
    }
    Some(value.to_owned())
}

/// The commit in `.cargo_vcs_info.json`, which `cargo package` writes into every `.crate`
/// packaged from a git checkout: `{"git": {"sha1": "…", "dirty": true}, …}`.
fn from_vcs_info(manifest_dir: &Path) -> Option<String> {
    let path = manifest_dir.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    watch(&path);
    let sha1 = json_string_after(&text, "\"sha1\"")?;
    if sha1.len() < SHORT || !sha1.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let dirty = text.split_once("\"dirty\"").is_some_and(|(_, rest)| {
        rest.trim_start()
            .trim_start_matches(':')
            .trim_start()
            .starts_with("true")
    });
    Some(format!(
        "{}{}",
        &sha1[..SHORT],
        if dirty { "-dirty" } else { "" }
    ))
}

/// The string value after `"key"` in a small, flat piece of JSON that cargo wrote: enough
/// for a file of known shape without a JSON parser in the build.
fn json_string_after<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let (_, rest) = text.split_once(key)?;
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    let (value, _) = rest.split_once('"')?;
    Some(value)
}

/// The checkout's commit, if this crate is part of one: the repository git finds must
/// track this crate's `Cargo.toml`, so a crate unpacked inside some other repository (a
/// distribution's packaging tree) is not given that repository's commit.
fn from_git(manifest_dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .arg("-C")
            .arg(manifest_dir)
            .args(args)
            // `git status` would otherwise refresh the index as it reads it: a file
            // written while this script runs is newer than the run, and cargo would
            // run the script (and rebuild the crate) again on the next build.
            .env("GIT_OPTIONAL_LOCKS", "0")
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    git(&["ls-files", "--error-unmatch", "Cargo.toml"])?;
    let commit = git(&["rev-parse", &format!("--short={SHORT}"), "HEAD"])?;
    // Run again when HEAD moves: a checkout rewrites HEAD, a commit rewrites the ref HEAD
    // names (loose, or in packed-refs once packed). Only paths that exist are watched,
    // since cargo takes a missing one as changed on every build. The index is not
    // watched: any `git status` rewrites it, which would rebuild the crate for nothing.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in &watched {
        if let Some(p) = git(&["rev-parse", "--git-path", name]) {
            watch(&manifest_dir.join(p));
        }
    }
    // This crate's own files too: `-dirty` follows an edit here, the change most likely
    // to matter (an edit elsewhere shows once one of these or HEAD moves).
    watch(&manifest_dir.join("src"));
    watch(&manifest_dir.join("Cargo.toml"));
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
        .is_some_and(|changes| !changes.is_empty());
    Some(format!("{commit}{}", if dirty { "-dirty" } else { "" }))
}

/// Asks cargo to run this script again when `path` changes, if it exists: cargo takes a
/// watched path that is missing as changed, and would rebuild the crate on every build.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
