//! What an installation gets besides the proxy: `idem --version` with its commit, shell
//! completions, manual pages, the systemd unit and the example config in `contrib/`.
//!
//! Checks that need a tool this machine may lack (`zsh`, `fish`, `man`,
//! `systemd-analyze`) skip loudly without it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use idem_gateway::config::{GatewayConfig, ServeArgs};

use crate::common::binary;

/// The repository's `contrib/` directory.
fn contrib(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contrib")
        .join(file)
}

fn read_contrib(file: &str) -> String {
    let path = contrib(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Runs `idem ARGS…` with nothing on standard input, bounded in time.
fn idem(args: &[&str]) -> Output {
    idem_with(args, &[], None)
}

fn idem_with(args: &[&str], env: &[(&str, &str)], stdin: Option<&[u8]>) -> Output {
    run(
        Command::new(binary()).args(args).envs(env.iter().copied()),
        stdin,
    )
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
    for sub in [
        &["serve", "--version"][..],
        &["keys", "list", "-V"],
        &["check", "-V"],
    ] {
        let out = idem(sub);
        assert!(out.status.success(), "{sub:?}: {}", text(&out.stderr));
        assert_eq!(
            text(&out.stdout).trim_end(),
            line,
            "{sub:?} says what `idem --version` says"
        );
    }

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

/// Cargo runs a build script again, and rebuilds its crate, when a path the script
/// watches is newer than its last run or is missing. Watching a file a checkout never
/// has (`.cargo_vcs_info.json`) or one every `git status` rewrites (the index) made every
/// `cargo run --release -- serve` compile the gateway anew.
#[test]
fn the_version_script_watches_only_paths_that_exist_and_stay_put() {
    // The script's printed lines, kept by cargo beside its `OUT_DIR`.
    let output = Path::new(env!("OUT_DIR")).parent().unwrap().join("output");
    let lines = std::fs::read_to_string(&output)
        .unwrap_or_else(|e| panic!("the build script's output {}: {e}", output.display()));
    let watched: Vec<&str> = lines
        .lines()
        .filter_map(|line| {
            line.strip_prefix("cargo:rerun-if-changed=")
                .or_else(|| line.strip_prefix("cargo::rerun-if-changed="))
        })
        .collect();
    assert!(
        watched.iter().any(|p| p.ends_with("build.rs")),
        "the script watches itself: {watched:?}"
    );
    for path in &watched {
        assert!(
            Path::new(path).exists(),
            "{path} is watched but missing, so cargo rebuilds the gateway on every build"
        );
        assert!(
            !path.ends_with("/index"),
            "{path}: git rewrites the index on any `git status`"
        );
    }
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
    // A directory that is not there is refused, not made: it may be a typo.
    let out = idem(&["man", "--out-dir", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no such directory"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.exists());
    std::fs::create_dir_all(&dir).unwrap();
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

/// The value of the unit's `Key=` lines, in order.
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn systemd_unit_is_hardened_and_outwaits_the_graceful_shutdown() {
    let unit = read_contrib("idem.service");
    for line in [
        "DynamicUser=yes",
        "StateDirectory=idem",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "LimitNOFILE=65536",
        "CapabilityBoundingSet=",
        "SystemCallFilter=@system-service",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line}");
    }
    assert!(
        unit_values(&unit, "RestrictAddressFamilies")
            .iter()
            .any(|v| v.contains("AF_INET") && v.contains("AF_INET6")),
        "RestrictAddressFamilies"
    );
    let exec = unit_values(&unit, "ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    assert!(
        exec[0].ends_with("idem serve --config /etc/idem/idem.toml"),
        "{exec:?}"
    );

    // The gateway's own wait at shutdown, plus the second its store's close may take,
    // must end before systemd's SIGKILL.
    let defaults = GatewayConfig::merge(
        &ServeArgs {
            upstream: Some("http://127.0.0.1:1".into()),
            ..ServeArgs::default()
        },
        Default::default(),
    )
    .unwrap();
    let stop = unit_values(&unit, "TimeoutStopSec");
    let stop = humantime::parse_duration(stop.last().expect("a TimeoutStopSec")).unwrap();
    assert!(
        stop > defaults.shutdown_timeout + Duration::from_secs(1),
        "TimeoutStopSec {stop:?} within the gateway's {:?}",
        defaults.shutdown_timeout
    );

    // The example config keeps the records in the unit's state directory.
    let config = read_contrib("idem.toml");
    assert!(
        config
            .lines()
            .any(|l| l == "store = \"sqlite:///var/lib/idem/idem.db\""),
        "the example config's store is not in /var/lib/idem"
    );
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    if !have("systemd-analyze", "checking contrib/idem.service") {
        return;
    }
    // verify checks that ExecStart's program exists: point it at the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let unit = read_contrib("idem.service").replace("/usr/local/bin/idem", binary());
    let path = dir.path().join("idem.service");
    std::fs::write(&path, unit).unwrap();
    let out = run(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path),
        None,
    );
    let said = text(&out.stderr);
    // Other units of this machine may draw complaints of their own; only ours count.
    let ours: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("idem.service"))
        .collect();
    assert!(out.status.success() && ours.is_empty(), "{said}");
}

/// The example config with its commented settings (`#name = value`, `#[[route]]`)
/// uncommented: all of them, or only those shown at their default (not those under an
/// "Example:" line, nor the route).
fn uncommented(config: &str, defaults_only: bool) -> String {
    let mut example = false;
    let mut route = false;
    let mut out = String::new();
    for line in config.lines() {
        let setting = line
            .strip_prefix('#')
            .filter(|rest| rest.starts_with(|c: char| c.is_ascii_lowercase() || c == '['));
        match setting {
            Some(rest) => {
                route |= rest.starts_with("[[route]]");
                if !defaults_only || !(example || route) {
                    out.push_str(rest);
                    out.push('\n');
                    continue;
                }
            }
            None if line.starts_with('#') => {
                example = line.to_ascii_lowercase().ends_with("example:");
            }
            None => example = false,
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn resolve(config: &str, dir: &Path) -> Result<GatewayConfig, idem_gateway::config::ConfigError> {
    let path = dir.join("idem.toml");
    std::fs::write(&path, config).unwrap();
    GatewayConfig::resolve(&ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    })
}

#[test]
fn example_config_resolves_as_it_is_and_its_defaults_are_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let config = read_contrib("idem.toml");
    let as_is = resolve(&config, dir.path()).unwrap();
    assert_eq!(as_is.store, "sqlite:///var/lib/idem/idem.db");
    assert!(
        as_is.routes.is_empty(),
        "the route is an example, left commented"
    );
    let defaults = uncommented(&config, true);
    assert_ne!(defaults, config, "no setting was uncommented");
    let mut with_defaults = resolve(&defaults, dir.path()).unwrap();
    // Unset, the namespace is the stores' own, which is `idem`.
    let namespace = with_defaults.store_options.namespace.take();
    assert_eq!(namespace.as_ref().map(|n| n.as_str()), Some("idem"));
    assert!(as_is.store_options.namespace.is_none());
    assert_eq!(
        format!("{with_defaults:?}"),
        format!("{as_is:?}"),
        "a value the example shows as the default is not the default"
    );
}

/// The example with every setting uncommented, its files made in `dir`.
fn every_setting(dir: &Path) -> String {
    let secret = dir.join("tenant-secret");
    std::fs::write(&secret, "0123456789abcdef0123456789abcdef\n").unwrap();
    // A record key file must be its owner's alone.
    let record_keys = dir.join("record.keys");
    std::fs::write(&record_keys, format!("k1:{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(
        &record_keys,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let jwt_secret = dir.join("jwt-secret");
    std::fs::write(&jwt_secret, "jwt-secret-of-at-least-32-bytes-0123456789\n").unwrap();
    // `admin_token` and `admin_token_file` are two ways to give one token, and never
    // both: the file form is left out here (its resolution has tests of its own); so
    // is `jwt_jwks_url` beside `jwt_jwks_file`. And `upstream_ca` is refused with the
    // example's http:// upstream (tested apart).
    uncommented(&read_contrib("idem.toml"), false)
        .replace("/etc/idem/tenant-secret", secret.to_str().unwrap())
        .replace("/etc/idem/record.keys", record_keys.to_str().unwrap())
        .replace("/etc/idem/jwt-secret", jwt_secret.to_str().unwrap())
        .lines()
        .filter(|l| {
            !l.starts_with("admin_token_file")
                && !l.starts_with("upstream_ca")
                && !l.starts_with("jwt_jwks_url")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn example_config_resolves_with_every_setting_uncommented() {
    let dir = tempfile::tempdir().unwrap();
    let all = every_setting(dir.path());
    let left = all
        .lines()
        .filter(|l| l.starts_with('#') && !l.starts_with("# ") && *l != "#")
        .collect::<Vec<_>>();
    assert!(left.is_empty(), "still commented: {left:?}");
    let c = resolve(&all, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    // The route of every field, and the MCP route.
    assert_eq!(c.routes.len(), 2);
    assert!(c.admin.is_some() && c.admin_token.is_some() && c.tenant_key.is_some());
    let jwt = c.jwt.expect("tenant_from names jwt");
    assert!(jwt.jwks_file.is_some() && jwt.hs256_secret.is_some());
    assert_eq!(c.max_connections, Some(10000));
    assert_eq!(c.store_options.pool, Some(16));
}

/// The field names a `deny_unknown_fields` table takes, from the error serde gives for an
/// unknown one (``unknown field `x`, expected one of `a`, `b` ``).
fn fields_of<T: serde::de::DeserializeOwned + std::fmt::Debug>(prefix: &str) -> Vec<String> {
    let err = toml::from_str::<T>(&format!("{prefix}no_such_setting = 1"))
        .expect_err("an unknown field is refused")
        .to_string();
    let (_, expected) = err
        .split_once("expected one of")
        .unwrap_or_else(|| panic!("no list of fields in {err}"));
    let expected = expected.lines().next().unwrap_or_default();
    let names: Vec<String> = expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    assert!(names.len() >= 3, "{err}");
    names
}

#[test]
fn example_config_shows_every_setting_and_route_field() {
    let config = read_contrib("idem.toml");
    let (top, route) = config
        .split_once("#[[route]]")
        .expect("a [[route]] example");
    let shows = |part: &str, name: &str| {
        part.lines().any(|l| {
            l.trim_start_matches('#')
                .strip_prefix(name)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        })
    };
    let settings = fields_of::<idem_gateway::config::ServeArgs>("");
    assert!(settings.contains(&"upstream".to_owned()), "{settings:?}");
    for name in settings.iter().filter(|n| *n != "route" && *n != "tenant") {
        assert!(shows(top, name), "contrib/idem.toml does not show `{name}`");
    }
    let (_, tenant) = config
        .split_once("#[[tenant]]")
        .expect("a [[tenant]] example");
    for name in fields_of::<idem_gateway::config::ServeArgs>("[[tenant]]\nid = \"anonymous\"\n") {
        assert!(
            shows(tenant, &name),
            "the [[tenant]] example does not show `{name}`"
        );
    }
    let rules = fields_of::<idem_gateway::config::ServeArgs>("[[route]]\npath = \"/x\"\n");
    assert!(rules.contains(&"store_headers".to_owned()), "{rules:?}");
    for name in &rules {
        assert!(
            shows(route, name),
            "the [[route]] example does not show `{name}`"
        );
    }
}

#[test]
fn check_config_prints_every_setting_as_the_file_spells_it_and_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    // The listeners' TLS files would be loaded: left out (their tests are apart).
    let all: String = every_setting(dir.path())
        .lines()
        .filter(|l| !l.starts_with("tls_") && !l.starts_with("admin_tls_"))
        .map(|l| format!("{l}\n"))
        .collect();
    let token = all
        .lines()
        .find_map(|l| l.strip_prefix("admin_token = "))
        .expect("the example sets an admin token")
        .trim_matches('"')
        .to_owned();
    let first = dir.path().join("all.toml");
    std::fs::write(&first, &all).unwrap();
    let check = |file: &Path, env: &[(&str, &str)]| {
        let out = idem_with(
            &[
                "check-config",
                "--config",
                file.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--store",
                "memory://",
            ],
            env,
            None,
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let printed = check(&first, &[]);
    assert!(printed.ends_with("# ok\n"), "{printed}");
    assert!(
        !printed.contains(&token),
        "the admin token is printed:\n{printed}"
    );
    let named = |name: &str, part: &str| {
        part.lines().any(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(" = "))
                || l.strip_prefix("# ")
                    .and_then(|l| l.strip_prefix(name))
                    .is_some_and(|rest| rest.starts_with(':'))
        })
    };
    let (top, routes) = printed
        .split_once("[[route]]")
        .expect("the route is printed");
    let (routes, tenants) = routes
        .split_once("[[tenant]]")
        .expect("the tenant is printed");
    for name in fields_of::<ServeArgs>("[[tenant]]\nid = \"anonymous\"\n") {
        assert!(
            named(&name, tenants),
            "check-config does not print the tenant's `{name}`"
        );
    }
    for name in fields_of::<ServeArgs>("")
        .iter()
        .filter(|n| *n != "route" && *n != "tenant")
    {
        assert!(
            named(name, top),
            "check-config does not print `{name}`:\n{printed}"
        );
    }
    let rules = fields_of::<ServeArgs>("[[route]]\npath = \"/x\"\n");
    for name in &rules {
        assert!(
            named(name, routes),
            "check-config does not print the route's `{name}`"
        );
    }
    assert!(
        printed.contains("ttl = \"1h\"\ntombstone_ttl = \"30days\""),
        "the route's own values: {printed}"
    );
    // Read back as a file, it is the same configuration: it prints the same again.
    let second = dir.path().join("printed.toml");
    std::fs::write(&second, &printed).unwrap();
    let again = check(&second, &[("IDEM_ADMIN_TOKEN", &token)]);
    assert_eq!(again, printed);
}

#[test]
fn check_config_shows_no_password_of_a_url() {
    // An exporter's endpoint may carry a password: printed, it is masked.
    let out = idem(&[
        "check-config",
        "--upstream",
        "http://127.0.0.1:9",
        "--store",
        "memory://",
        "--otlp-endpoint",
        "http://collector:hunter2@127.0.0.1:4318",
    ]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("otlp_endpoint = \"http://collector:***@127.0.0.1:4318\""),
        "{said}"
    );
    assert!(!said.contains("hunter2"), "{said}");
    // The upstream's URL may carry none: the proxy would not send it, and the URL is
    // printed and logged. Refused as a usage error, without repeating it.
    let out = idem(&[
        "check-config",
        "--upstream",
        "http://app:hunter2@127.0.0.1:9",
        "--store",
        "memory://",
    ]);
    let (said, err) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{said}{err}");
    assert!(err.contains("may not carry credentials"), "{err}");
    assert!(
        !said.contains("hunter2") && !err.contains("hunter2"),
        "{said}{err}"
    );
}

#[test]
fn example_config_passes_check_config() {
    // The example's SQLite file is in /var/lib/idem; the environment wins over the file.
    let out = idem_with(
        &[
            "check-config",
            "--config",
            contrib("idem.toml").to_str().unwrap(),
        ],
        &[("IDEM_STORE", "memory://")],
        None,
    );
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(
        said.contains("upstream = \"http://127.0.0.1:3000\"") && said.ends_with("# ok\n"),
        "{said}"
    );
}
