//! `idem man`: the manual pages, written from the command line's own definition (flags,
//! their `IDEM_*` variables, defaults and help), so they never disagree with `--help`.
//!
//! `idem man` prints idem(1); `idem man --out-dir DIR` writes a page for every command:
//! `idem.1`, `idem-serve.1`, `idem-keys-show.1`, ….
//!
//! ```sh
//! idem man | man -l -
//! idem man --out-dir /usr/local/share/man/man1
//! ```

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::cli::Cli;

/// The `idem` command as the manual pages describe it: subcommands named `idem-serve`
/// and so on, and no `help` subcommand (its page would say nothing).
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

fn page(cmd: clap::Command) -> clap_mangen::Man {
    let title = cmd
        .get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_uppercase();
    clap_mangen::Man::new(cmd)
        .title(title)
        .manual("idem manual")
}

/// The manual page idem(1), in roff.
pub(crate) fn idem_page() -> Vec<u8> {
    let mut out = Vec::new();
    page(command())
        .render(&mut out)
        .expect("rendering into memory cannot fail");
    out
}

/// Writes a page for `idem` and each of its subcommands into `dir`, which must exist
/// (a mistyped directory is refused rather than made), and returns the files written,
/// `idem.1` first.
pub(crate) fn write_pages(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn write(cmd: clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> std::io::Result<()> {
        written.push(page(cmd.clone()).generate_to(dir)?);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            write(sub.clone(), dir, written)?;
        }
        Ok(())
    }
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such directory (make it first, e.g. mkdir -p)",
        ));
    }
    let mut written = Vec::new();
    write(command(), dir, &mut written)?;
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_for_every_command_and_none_for_help() {
        let dir = tempfile::tempdir().unwrap();
        let written = write_pages(dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for name in [
            "idem.1",
            "idem-serve.1",
            "idem-keys.1",
            "idem-keys-show.1",
            "idem-man.1",
        ] {
            assert!(
                names.contains(&name.to_owned()),
                "{name} missing from {names:?}"
            );
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
        let serve = std::fs::read_to_string(dir.path().join("idem-serve.1")).unwrap();
        assert!(serve.contains("\n.TH IDEM-SERVE 1 "), "{serve:.300}");
        assert!(serve.contains("IDEM_UPSTREAM"), "the variables are named");
    }
}
