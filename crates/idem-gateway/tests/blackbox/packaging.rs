//! What an installation gets besides the proxy: `idem --version` with its commit, shell
//! completions and manual pages.
//!
//! Checks that need a tool this machine may lack (`zsh`, `fish`, `man`) skip loudly
//! without it.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::binary;

/// Runs `idem ARGS…` with nothing on standard input, bounded in time.
fn idem(args: &[&str]) -> Output {
    run(Command::new(binary()).args(args), None)
}

/// Runs a command to its end, killing it after a generous bound.
fn run(cmd: &mut Command, stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(bytes).unwrap();
    }
    let id = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            let _ = Command::new("kill").arg("-9").arg(id.to_string()).status();
            panic!("{cmd:?} did not end within 60 s");
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether `tool` can be run here; says so loudly when it cannot.
fn have(tool: &str, why: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found {
        eprintln!("SKIPPED: {why}: `{tool}` is not installed on this machine");
    }
    found
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| text(&out.stdout).trim().to_owned())
}

#[test]
fn version_names_the_version_and_the_checkouts_commit() {
    let out = idem(&["--version"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    let line = line.trim_end();
    let version = env!("CARGO_PKG_VERSION");
    assert!(line.starts_with(&format!("idem {version}")), "{line:?}");
    let serve = idem(&["serve", "--version"]);
    assert_eq!(
        text(&serve.stdout).trim_end(),
        line.replacen("idem", "idem-serve", 1),
        "every subcommand says the same"
    );

    let Some(head) = git(&["rev-parse", "HEAD"]) else {
        eprintln!("SKIPPED: the commit in --version: this crate is not in a git checkout");
        return;
    };
    if git(&["ls-files", "--error-unmatch", "Cargo.toml"]).is_none() {
        eprintln!("SKIPPED: the commit in --version: the enclosing repository is not idem's");
        return;
    }
    let commit = line
        .strip_prefix(&format!("idem {version} ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no commit in {line:?}"));
    let commit = commit.strip_suffix("-dirty").unwrap_or(commit);
    assert!(
        commit.len() >= 7 && head.starts_with(commit),
        "{line:?} does not name HEAD {head}"
    );
}

#[test]
fn completions_for_each_shell_name_the_subcommands_and_flags() {
    let dir = tempfile::tempdir().unwrap();
    // Each shell's script spells a long flag its own way.
    for (shell, long, check) in [
        ("bash", "--", ["bash", "-n"].as_slice()),
        ("zsh", "--", ["zsh", "-n"].as_slice()),
        ("fish", "-l ", ["fish", "--no-execute"].as_slice()),
    ] {
        let out = idem(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        for word in ["serve", "check-config", "keys", "completions", "man"] {
            assert!(script.contains(word), "{shell}'s script lacks {word}");
        }
        for flag in ["upstream", "store", "config", "tenant-secret-file"] {
            assert!(
                script.contains(&format!("{long}{flag}")),
                "{shell}'s script lacks {long}{flag}"
            );
        }
        let file = dir.path().join(format!("idem.{shell}"));
        std::fs::write(&file, &script).unwrap();
        if have(check[0], &format!("the {shell} script's syntax")) {
            let out = run(Command::new(check[0]).args(&check[1..]).arg(&file), None);
            assert!(
                out.status.success(),
                "{shell} refuses the script: {}",
                text(&out.stderr)
            );
        }
    }
    let out = idem(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    assert!(said.contains("bash") && said.contains("zsh"), "{said}");
}

/// Renders a roff page with `man -l -`: its text, or `None` (said loudly) without `man`.
fn render_man(page: &[u8]) -> Option<String> {
    if !have("man", "rendering the manual page") {
        return None;
    }
    let out = run(
        Command::new("man")
            .args(["-l", "-"])
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .env("MANWIDTH", "100")
            .env_remove("MAN_KEEP_FORMATTING"),
        Some(page),
    );
    assert!(out.status.success(), "man -l: {}", text(&out.stderr));
    let problems = text(&out.stderr);
    assert!(
        !problems.contains("warning") && !problems.contains("error"),
        "man -l complains: {problems}"
    );
    Some(text(&out.stdout))
}

#[test]
fn man_page_renders_and_names_the_subcommands() {
    let out = idem(&["man"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(
        page.lines().any(|l| l.starts_with(".TH IDEM 1 ")),
        "{page:.300}"
    );
    for word in ["serve", "check\\-config", "completions"] {
        assert!(page.contains(word), "idem(1) lacks {word}");
    }
    if let Some(shown) = render_man(&out.stdout) {
        assert!(
            shown.contains("NAME") && shown.contains("SUBCOMMANDS") && shown.contains("serve"),
            "{shown}"
        );
    }
}

#[test]
fn man_out_dir_writes_a_page_for_every_command() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man/man1");
    let out = idem(&["man", "--out-dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    for page in [
        "idem.1",
        "idem-serve.1",
        "idem-check-config.1",
        "idem-keys-purge.1",
    ] {
        let path = dir.join(page);
        assert!(path.exists(), "{page} not written");
        assert!(
            listed.contains(path.to_str().unwrap()),
            "{page} not listed: {listed}"
        );
    }
    let serve = std::fs::read(dir.join("idem-serve.1")).unwrap();
    let roff = text(&serve);
    assert!(
        roff.lines().any(|l| l.starts_with(".TH IDEM-SERVE 1 ")),
        "{roff:.300}"
    );
    if let Some(shown) = render_man(&serve) {
        for word in [
            "--upstream",
            "IDEM_UPSTREAM",
            "--tenant-secret-file",
            "--max-connections",
        ] {
            assert!(shown.contains(word), "idem-serve(1) lacks {word}");
        }
    }
    let not_a_dir = tmp.path().join("file");
    std::fs::write(&not_a_dir, "").unwrap();
    let out = idem(&["man", "--out-dir", not_a_dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot write the manual pages"),
        "{}",
        text(&out.stderr)
    );
}
