//! The declaration of the settings agrees with itself: what the file, the command line
//! and a reload make of each setting is what [`SETTINGS`] says.

use std::collections::BTreeSet;

use super::*;

/// The keys the file takes, from serde's refusal of one it does not.
fn file_keys() -> BTreeSet<String> {
    let err = toml::from_str::<ServeArgs>("no_such_setting = 1").unwrap_err();
    let message = err.message();
    let (_, expected) = message.split_once("expected one of").expect(message);
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_file_takes_every_setting_but_those_read_at_start() {
    let declared: BTreeSet<String> = SETTINGS
        .iter()
        .filter(|s| s.reload != Reload::Start)
        .map(|s| s.key.to_owned())
        .collect();
    assert!(declared.contains("migrate") && declared.contains("route"));
    assert_eq!(file_keys(), declared);
}

/// A reload applies the settings resolved into one field together, or none of them:
/// the field is kept whole.
#[test]
fn settings_resolved_together_reload_together() {
    for a in SETTINGS.iter().filter(|s| s.reload != Reload::Start) {
        for b in SETTINGS.iter().filter(|s| s.reload != Reload::Start) {
            if a.resolves_into.is_some() && a.resolves_into == b.resolves_into {
                assert_eq!(a.reload, b.reload, "{} and {}", a.key, b.key);
            }
        }
    }
    let http2 = SETTINGS.iter().filter(|s| s.resolves_into == Some("http2"));
    assert_eq!(http2.count(), 5);
}

#[test]
fn a_reload_keeps_the_running_values_of_restart_only_settings() {
    let running = GatewayConfig::merge(&args("http://127.0.0.1:1"), ServeArgs::default()).unwrap();
    let file: ServeArgs = toml::from_str(
        "upstream = \"http://127.0.0.1:2\"\nlisten = \"127.0.0.1:9\"\nscope = \"internal\"\n\
         ttl = \"1h\"\nhttp2_keepalive_timeout = \"3s\"",
    )
    .unwrap();
    let mut next = GatewayConfig::merge(&ServeArgs::default(), file).unwrap();
    next.keep_restart_only(&running);
    assert_eq!(next.listen, running.listen);
    assert_eq!(next.scope, ScopeMode::Public);
    assert_eq!(
        next.http2.keepalive_timeout,
        running.http2.keepalive_timeout
    );
    assert_eq!(
        next.ttl,
        Duration::from_secs(3600),
        "a live setting is applied"
    );
    assert_eq!(next.upstream.to_string(), "http://127.0.0.1:2");
}
