//! What differs between two configurations, setting by setting, and which of those
//! differences a reload applies: `idem check-config --diff FILE` prints it, and a
//! reload (SIGHUP, `POST /reload`) logs the settings it cannot apply.
//!
//! Both are read in the form [`GatewayConfig::to_toml`] writes, so every setting it
//! prints is compared, a `[[route]]` or `[[tenant]]` table as a whole. Whether a reload
//! applies a change is the setting's declared [`Reload`] class.

use super::{GatewayConfig, Reload, ServeArgs, Setting};

/// One setting that differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    /// The setting (`ttl`), or a table by its place (`route 2`, `tenant 1`).
    pub(crate) setting: String,
    /// Its value before, as the file writes it; `None` where it was not there.
    pub(crate) before: Option<String>,
    /// Its value after.
    pub(crate) after: Option<String>,
    /// Whether a reload applies it; otherwise it takes a restart.
    pub(crate) live: bool,
}

/// The settings of a configuration in the file's form: `(name, value)` for each, a
/// `# name: note` line as its note, a table as `route N` or `tenant N` with its lines.
fn settings(toml: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut tables: std::collections::HashMap<String, usize> = Default::default();
    let mut in_table = false;
    for line in toml.lines() {
        if let Some(kind) = line
            .strip_prefix("[[")
            .and_then(|rest| rest.strip_suffix("]]"))
        {
            let n = tables.entry(kind.to_owned()).or_insert(0);
            *n += 1;
            out.push((format!("{kind} {n}"), String::new()));
            in_table = true;
            continue;
        }
        if line.trim().is_empty() {
            continue;
        }
        if in_table {
            let (_, body) = out.last_mut().expect("a table was started");
            body.push_str(line);
            body.push('\n');
            continue;
        }
        if let Some((name, value)) = line.split_once(" = ") {
            out.push((name.to_owned(), value.to_owned()));
        } else if let Some((name, note)) = line
            .strip_prefix("# ")
            .and_then(|rest| rest.split_once(": "))
            && !name.contains(' ')
        {
            out.push((name.to_owned(), format!("# {note}")));
        }
    }
    out
}

/// What changes from `before` to `after`, in the order `after` writes its settings
/// (those only `before` has last), then the secrets that changed where the file's form
/// cannot show it (a token, a file's contents, a password in a URL).
pub(crate) fn diff(
    before: &GatewayConfig,
    before_args: &ServeArgs,
    after: &GatewayConfig,
    after_args: &ServeArgs,
) -> Vec<Change> {
    let mut changes = diff_toml(&before.to_toml(before_args), &after.to_toml(after_args));
    for setting in changed_secrets(before, after) {
        if changes.iter().all(|c| c.setting != setting) {
            changes.push(Change {
                setting: setting.to_owned(),
                before: Some("# a secret, not shown".to_owned()),
                after: Some("# another secret, not shown".to_owned()),
                live: Setting::keyed(setting).is_none_or(|s| s.reload != Reload::Restart),
            });
        }
    }
    changes
}

/// The settings whose secret differs between `before` and `after`, each compared as
/// resolved (the file it names read): the file's form shows none of them, or only the
/// file's path.
fn changed_secrets(before: &GatewayConfig, after: &GatewayConfig) -> Vec<&'static str> {
    let hs256 = |c: &GatewayConfig| c.jwt.as_ref().and_then(|j| j.hs256_secret.clone());
    // A tenant key keeps no secret to compare: the tenant it names a fixed probe by
    // differs with the secret.
    let probe = |c: &GatewayConfig| {
        c.tenant_key
            .as_ref()
            .map(|k| k.credential("idem-config-diff", b"probe"))
    };
    [
        ("admin_token", before.admin_token != after.admin_token),
        ("tenant_secret_file", probe(before) != probe(after)),
        ("record_key_file", before.record_keys != after.record_keys),
        ("jwt_hs256_secret_file", hs256(before) != hs256(after)),
        // The password the file's form hides.
        ("store", before.store != after.store),
    ]
    .into_iter()
    .filter_map(|(setting, changed)| changed.then_some(setting))
    .collect()
}

/// [`diff`] of two configurations already written in the file's form.
pub(crate) fn diff_toml(before: &str, after: &str) -> Vec<Change> {
    let (before, after) = (settings(before), settings(after));
    let find = |list: &[(String, String)], name: &str| {
        list.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
    };
    let mut changes = Vec::new();
    // A table (`route 2`) is applied whole.
    let live = |name: &str| Setting::keyed(name).is_none_or(|s| s.reload != Reload::Restart);
    for (name, value) in &after {
        let was = find(&before, name);
        if was.as_deref() != Some(value.as_str()) {
            changes.push(Change {
                setting: name.clone(),
                before: was,
                after: Some(value.clone()),
                live: live(name),
            });
        }
    }
    for (name, value) in &before {
        if find(&after, name).is_none() {
            changes.push(Change {
                setting: name.clone(),
                before: Some(value.clone()),
                after: None,
                live: live(name),
            });
        }
    }
    changes
}

/// The changes as `check-config --diff` prints them: `- name = before` and
/// `+ name = after` for each, a table's lines indented, and a last line naming those
/// a reload does not apply.
pub(crate) fn render(changes: &[Change]) -> String {
    let mut out = String::new();
    if changes.is_empty() {
        out.push_str("# no setting differs: a reload would change nothing\n");
        return out;
    }
    let side = |out: &mut String, sign: char, name: &str, value: &str| {
        if value.contains('\n') {
            out.push_str(&format!("{sign} [[{name}]]\n"));
            for line in value.lines() {
                out.push_str(&format!("{sign}     {line}\n"));
            }
        } else {
            out.push_str(&format!("{sign} {name} = {value}\n"));
        }
    };
    for c in changes {
        if let Some(before) = &c.before {
            side(&mut out, '-', &c.setting, before);
        }
        if let Some(after) = &c.after {
            side(&mut out, '+', &c.setting, after);
        }
    }
    let restart: Vec<&str> = changes
        .iter()
        .filter(|c| !c.live)
        .map(|c| c.setting.as_str())
        .collect();
    if restart.is_empty() {
        out.push_str("# a reload (SIGHUP or POST /reload) applies every change above\n");
    } else {
        out.push_str(&format!(
            "# a reload applies the others; these take a restart: {}\n",
            restart.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration on `store` with `token` as its admin token.
    fn config(store: &str, token: &str) -> (GatewayConfig, ServeArgs) {
        let args = ServeArgs {
            upstream: Some("http://127.0.0.1:3000".into()),
            store: Some(store.into()),
            admin_token: Some(token.into()),
            ..ServeArgs::default()
        };
        (
            GatewayConfig::merge(&args, ServeArgs::default()).unwrap(),
            args,
        )
    }

    #[test]
    fn a_secret_the_file_form_hides_is_compared_and_never_shown() {
        let (a, a_args) = config("postgres://u:first@127.0.0.1/db", "token-one");
        let (b, b_args) = config("postgres://u:second@127.0.0.1/db", "token-two");
        assert_eq!(
            a.to_toml(&a_args),
            b.to_toml(&b_args),
            "the form hides both"
        );
        let changes = diff(&a, &a_args, &b, &b_args);
        let named: Vec<(&str, bool)> = changes
            .iter()
            .map(|c| (c.setting.as_str(), c.live))
            .collect();
        assert_eq!(named, [("admin_token", true), ("store", false)]);
        let text = render(&changes);
        for secret in ["first", "second", "token-one", "token-two"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(text.ends_with("these take a restart: store\n"), "{text}");
        assert!(diff(&a, &a_args, &a, &a_args).is_empty());
    }

    #[test]
    fn settings_notes_and_tables_are_compared_and_restart_only_ones_named() {
        let before = "upstream = \"http://a\"\nttl = \"24h\"\nlisten = \"127.0.0.1:8080\"\n\
                      # admin: off\n\n[[route]]\npath = \"/a\"\n";
        let after = "upstream = \"http://a\"\nttl = \"1h\"\nlisten = \"127.0.0.1:9090\"\n\
                     admin = \"127.0.0.1:9091\"\n\n[[route]]\npath = \"/b\"\n\n\
                     [[tenant]]\nid = \"anonymous\"\n";
        let changes = diff_toml(before, after);
        let names: Vec<(&str, bool)> = changes
            .iter()
            .map(|c| (c.setting.as_str(), c.live))
            .collect();
        assert_eq!(
            names,
            [
                ("ttl", true),
                ("listen", false),
                ("admin", false),
                ("route 1", true),
                ("tenant 1", true)
            ]
        );
        assert_eq!(changes[2].before.as_deref(), Some("# off"));
        let text = render(&changes);
        assert!(text.contains("- ttl = \"24h\"\n+ ttl = \"1h\"\n"), "{text}");
        assert!(
            text.contains("+ [[route 1]]\n+     path = \"/b\"\n"),
            "{text}"
        );
        assert!(
            text.ends_with("these take a restart: listen, admin\n"),
            "{text}"
        );
        assert!(render(&diff_toml(before, before)).contains("would change nothing"));
    }
}
