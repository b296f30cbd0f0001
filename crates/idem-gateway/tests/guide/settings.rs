//! The settings page (`docs/src/gateway/settings.md`) against the code: its table lists
//! exactly the flags `idem serve --help` shows, under their variables, and says of each
//! setting what its declaration (`idem_gateway::config::SETTINGS`) does: its key in the
//! file, whether a reload applies it, and a default that resolves as the default does.

use std::collections::BTreeMap;
use std::process::Command;

use clap::{Args, Parser};
use idem_gateway::config::{GatewayConfig, Reload, SETTINGS, ServeArgs};

use super::{read, workspace};

/// `(flag, env)` of every option `idem serve --help` shows, but `--help` and `--version`.
fn serve_help_flags() -> BTreeMap<String, Option<String>> {
    let output = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--help"])
        .output()
        .expect("running idem serve --help");
    assert!(output.status.success(), "idem serve --help failed");
    let help = String::from_utf8(output.stdout).expect("UTF-8 help");
    let mut flags = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        // An option's first line: `  -h, --help` or `      --store <URL>`, indented.
        let option = trimmed
            .strip_prefix("--")
            .or_else(|| trimmed.split_once(", --").map(|(_, rest)| rest))
            .filter(|_| line.starts_with("  ") && trimmed.starts_with('-'));
        if let Some(rest) = option {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            current = (name != "help" && name != "version").then(|| format!("--{name}"));
            if let Some(flag) = &current {
                flags.insert(flag.clone(), None);
            }
        } else if let (Some(flag), Some(env)) = (&current, trimmed.strip_prefix("[env: ")) {
            let var: String = env
                .chars()
                .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            flags.insert(flag.clone(), Some(var));
        }
    }
    flags
}

/// The cells of every row of the table under `## Flags` in the gateway's settings page,
/// by the flag each row starts with.
fn guide_rows() -> BTreeMap<String, Vec<String>> {
    let page = read(&workspace().join("docs/src/gateway/settings.md"));
    let table = page
        .split("\n## Flags\n")
        .nth(1)
        .expect("a `## Flags` section in docs/src/gateway/settings.md");
    let table = table.split("\n## ").next().unwrap();
    let mut rows = BTreeMap::new();
    for row in table.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<String> = row.split(" | ").map(str::to_owned).collect();
        let flag: String = cells[0]
            .trim_start_matches("| `")
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        assert!(
            rows.insert(flag.clone(), cells).is_none(),
            "{flag} is listed twice in the guide"
        );
    }
    rows
}

/// `(flag, env)` of every row of the table under `## Flags` in the gateway's settings page.
fn guide_flags() -> BTreeMap<String, Option<String>> {
    let env = |cells: &[String]| {
        cells
            .get(1)
            .map(|c| c.trim().trim_matches('`').to_owned())
            .filter(|c| c.starts_with("IDEM_"))
    };
    let rows = guide_rows().into_iter();
    rows.map(|(flag, cells)| (flag, env(&cells))).collect()
}

#[test]
fn the_guide_lists_exactly_the_flags_of_idem_serve() {
    let help = serve_help_flags();
    let guide = guide_flags();
    // So that a parser that finds nothing on either side fails.
    for known in ["--upstream", "--store", "--passthrough", "--log-format"] {
        assert!(
            help.contains_key(known),
            "--help parse missed {known}: {help:?}"
        );
        assert!(
            guide.contains_key(known),
            "guide parse missed {known}: {guide:?}"
        );
    }
    let undocumented: Vec<&String> = help.keys().filter(|f| !guide.contains_key(*f)).collect();
    assert!(
        undocumented.is_empty(),
        "flags of `idem serve --help` missing from docs/src/gateway/settings.md: {undocumented:?}"
    );
    let stale: Vec<&String> = guide.keys().filter(|f| !help.contains_key(*f)).collect();
    assert!(
        stale.is_empty(),
        "flags in docs/src/gateway/settings.md that `idem serve --help` does not have: {stale:?}"
    );
    for (flag, env) in &help {
        assert_eq!(
            &guide[flag], env,
            "{flag}: the guide's environment variable differs from --help's"
        );
    }
}

/// The text of `cell`'s leading code span, if it starts with one.
fn code_span(cell: &str) -> Option<&str> {
    cell.strip_prefix('`')?.split('`').next()
}

/// `idem serve`'s arguments, as its command line declares them.
#[derive(Parser)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

/// The line `check-config` prints for `key` when `idem serve` is given `args` (and an
/// upstream).
fn printed(args: &[&str], key: &str) -> String {
    let mut argv = vec!["serve", "--upstream", "http://127.0.0.1:1"];
    argv.extend(args);
    let Serve { args } = Serve::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let (layered, config) =
        GatewayConfig::resolve_layered(&args).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let text = config.to_toml(&layered);
    let line = text.lines().find(|l| {
        l.strip_prefix(key)
            .is_some_and(|rest| rest.starts_with(" = "))
            || l.strip_prefix("# ")
                .and_then(|l| l.strip_prefix(key))
                .is_some_and(|rest| rest.starts_with(':'))
    });
    line.unwrap_or_else(|| panic!("no line for {key}:\n{text}"))
        .to_owned()
}

/// Each row says of its setting what the declaration does: the setting's key in the
/// file (`–` for one read only at start), `live` or `restart` as a reload treats it, and,
/// where the default is written as a value (`24h`), a value that resolves as the
/// setting left out does. The flags of no setting (`--log-format`) have neither key
/// nor reload.
#[test]
fn the_guide_table_says_what_each_setting_is_declared_to_be() {
    let rows = guide_rows();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("jwt-secret");
    std::fs::write(&secret, "jwt-secret-of-at-least-32-bytes-0123456789\n").unwrap();
    // The `jwt_*` settings are printed only when tokens are verified.
    let jwt = [
        "--tenant-from",
        "jwt",
        "--jwt-hs256-secret-file",
        secret.to_str().unwrap(),
    ];
    let serve = ServeArgs::augment_args(clap::Command::new("serve"));
    let mut defaults = 0;
    for arg in serve.get_arguments() {
        let setting = SETTINGS
            .iter()
            .find(|s| s.field == arg.get_id().as_str())
            .unwrap_or_else(|| panic!("{} is not declared", arg.get_id()));
        let flag = format!("--{}", arg.get_long().expect("a long flag"));
        let cells = rows
            .get(&flag)
            .unwrap_or_else(|| panic!("{flag} is not in the guide"));
        let (key, default, reload) = (&cells[2], &cells[3], &cells[4]);
        let (key_said, reload_said) = match setting.reload {
            Reload::Start => ("–", "–"),
            Reload::Live => (setting.key, "live"),
            Reload::Restart => (setting.key, "restart"),
        };
        let key = code_span(key).map_or(key.as_str(), |span| span.split(' ').next().unwrap());
        assert_eq!(key, key_said, "{flag}: the guide's TOML key");
        assert_eq!(reload, reload_said, "{flag}: the guide's reload");
        if let Some(value) = code_span(default) {
            let base: &[&str] = if setting.key.starts_with("jwt_") {
                &jwt
            } else {
                &[]
            };
            let given = [base, &[flag.as_str(), value]].concat();
            assert_eq!(
                printed(&given, setting.key),
                printed(base, setting.key),
                "{flag}: the guide's default {value} is not the default"
            );
            defaults += 1;
        }
    }
    assert!(defaults >= 30, "only {defaults} defaults were checked");
    let serve: Vec<String> = serve
        .get_arguments()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    for (flag, cells) in rows.iter().filter(|(flag, _)| !serve.contains(flag)) {
        assert_eq!((cells[2].as_str(), cells[4].as_str()), ("–", "–"), "{flag}");
    }
}
