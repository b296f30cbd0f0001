//! The secrets `idem serve` takes, the tenant secret and the admin token (each given as
//! itself or as a file that holds it, never both) and the record keys (a file), all
//! checked at start.

use std::path::Path;

use idem_core::private_file::Exposure;
use idem_core::{RecordKeys, TenantKey};

use super::ServeArgs;
use super::error::{ConfigError, invalid};

/// The environment variable that holds the tenant secret itself.
pub const TENANT_SECRET_ENV: &str = "IDEM_TENANT_SECRET";

/// A tenant secret as read from [`TENANT_SECRET_ENV`]: its bytes, which `Debug` never
/// shows.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantSecret(Vec<u8>);

impl TenantSecret {
    /// A secret of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> TenantSecret {
        TenantSecret(bytes.into())
    }

    /// The secret in [`TENANT_SECRET_ENV`], if it is set.
    pub fn from_env() -> Option<TenantSecret> {
        std::env::var_os(TENANT_SECRET_ENV).map(|v| TenantSecret(v.into_encoded_bytes()))
    }
}

impl std::fmt::Debug for TenantSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TenantSecret({} bytes)", self.0.len())
    }
}

/// The tenant key from the operator's secret: `IDEM_TENANT_SECRET`, or the file the
/// command line (else the config file) names; `None` when neither is given, and the
/// store's own secret is used. Surrounding ASCII whitespace is trimmed (a file's
/// trailing newline), then the secret must be at least 32 bytes. Given both ways, the
/// secret is refused rather than one picked: two gateways that picked differently
/// would name every client differently.
pub(crate) fn tenant_key(
    from_env: Option<&TenantSecret>,
    cli_file: Option<&Path>,
    config_file: Option<&Path>,
) -> Result<Option<TenantKey>, ConfigError> {
    let file = cli_file.or(config_file);
    let (setting, secret) = match (from_env, file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "tenant_secret_file",
                format!(
                    "the tenant secret is given twice, in {TENANT_SECRET_ENV} and as a file; \
                     give it once"
                ),
            ));
        }
        (Some(secret), None) => (TENANT_SECRET_ENV.to_owned(), secret.0.clone()),
        (None, Some(path)) => {
            let secret = read_secret_file("tenant_secret_file", path, "the tenant secret file")?;
            (format!("tenant_secret_file {}", path.display()), secret)
        }
        (None, None) => return Ok(None),
    };
    TenantKey::new(secret.trim_ascii())
        .map(Some)
        .map_err(|e| invalid(setting, e))
}

/// The secret in the file `path` that `setting` names, surrounding whitespace (a
/// trailing newline) trimmed; a warning, naming `what`, when others than its owner may
/// read it.
pub(super) fn read_secret_file(
    setting: &str,
    path: &Path,
    what: &str,
) -> Result<Vec<u8>, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| invalid(setting, format!("cannot read {}: {e}", path.display())))?;
    warn_if_readable_by_others(path, what);
    Ok(bytes.trim_ascii().to_vec())
}

/// A secret file that others may read lets them name every tenant (or forge tokens):
/// a warning naming `what` and the file.
fn warn_if_readable_by_others(path: &Path, what: &str) {
    idem_core::private_file::warn_if_exposed(path, what, Exposure::Owner);
}

/// The admin bearer token, given as itself or as a file that holds it (one line; the
/// line end is dropped). Both at once is an error rather than one silently winning: an
/// operator who moved the token to a file and forgot the old setting would otherwise
/// run with a token they believe retired. A token that is empty, or that a bearer
/// header cannot carry as it is (surrounding whitespace, which the header's parsing
/// trims; anything but printable ASCII), is refused at start instead of locking every
/// caller out, or letting an empty header in.
pub(super) fn admin_token(a: &ServeArgs) -> Result<Option<String>, ConfigError> {
    let (token, setting) = match (a.admin_token.clone(), &a.admin_token_file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "admin_token_file",
                "give the admin token or a file holding it, not both \
                 (--admin-token/IDEM_ADMIN_TOKEN/admin_token and \
                 --admin-token-file/IDEM_ADMIN_TOKEN_FILE/admin_token_file)",
            ));
        }
        (None, None) => return Ok(None),
        (Some(token), None) => (token, "admin_token"),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                invalid(
                    "admin_token_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            warn_if_others_can_read(path);
            let line = text.strip_suffix('\n').unwrap_or(&text);
            let line = line.strip_suffix('\r').unwrap_or(line);
            (line.to_owned(), "admin_token_file")
        }
    };
    if token.trim().is_empty() {
        return Err(invalid(
            setting,
            "the admin token is empty; give a long random value, or no token",
        ));
    }
    if token.trim() != token {
        return Err(invalid(
            setting,
            "the admin token starts or ends with whitespace, which an Authorization \
             header cannot carry",
        ));
    }
    if !token.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(invalid(
            setting,
            "the admin token has a character that is not printable ASCII (or a second \
             line), which an Authorization header cannot carry",
        ));
    }
    Ok(Some(token))
}

/// A secret in a file that others may read is not much of a secret: say so, but start
/// (the operator may know why, a group-readable file for a sidecar, say).
fn warn_if_others_can_read(path: &Path) {
    idem_core::private_file::warn_if_exposed(path, "the admin token", Exposure::Group);
}

/// The keys recorded answers are sealed with, from `--record-key-file` (SPEC S17):
/// `None` without one. The file must not be readable or writable by others than its
/// owner and group (a key others can read seals nothing), and a group that can read it
/// is warned about; a file that holds no key, or a line that is not `id:<64 hex
/// digits>`, is refused with its line number and never its key.
pub(crate) fn record_keys(file: Option<&Path>) -> Result<Option<RecordKeys>, ConfigError> {
    const SETTING: &str = "record_key_file";
    let Some(path) = file else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(SETTING, format!("cannot read {}: {e}", path.display())))?;
    if let Some((Exposure::Everyone, mode)) = idem_core::private_file::exposure(path) {
        return Err(invalid(
            SETTING,
            format!(
                "{} is open to every user (mode {mode:o}); the keys that seal the records \
                 must not be: chmod 600 it",
                path.display(),
            ),
        ));
    }
    idem_core::private_file::warn_if_exposed(
        path,
        "the keys that seal the records; unless a sidecar needs them",
        Exposure::Owner,
    );
    RecordKeys::parse(&text)
        .map(Some)
        .map_err(|e| invalid(SETTING, format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_secret_from_the_environment_or_a_file_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "  0123456789abcdef0123456789abcdef\n").unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "0123456789abcdef0123456789abcde\n").unwrap();
        let env = TenantSecret::new("0123456789abcdef0123456789abcdef");
        let from_file = tenant_key(None, Some(&good), None).unwrap().unwrap();
        let from_env = tenant_key(Some(&env), None, None).unwrap().unwrap();
        let name = |k: &TenantKey| k.credential("authorization", b"basic x");
        assert_eq!(
            name(&from_file),
            name(&from_env),
            "the file's whitespace is trimmed"
        );
        let from_config = tenant_key(None, None, Some(&good)).unwrap().unwrap();
        assert_eq!(name(&from_config), name(&from_env));
        assert!(tenant_key(None, None, None).unwrap().is_none());

        let e = tenant_key(None, Some(&short), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("31 bytes") && e.contains("at least 32"), "{e}");
        assert!(!e.contains("0123456789"), "the secret is shown: {e}");
        let e = tenant_key(Some(&TenantSecret::new("hunter2")), None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("IDEM_TENANT_SECRET") && !e.contains("hunter2"),
            "{e}"
        );
        let e = tenant_key(Some(&env), Some(&good), None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
        let e = tenant_key(None, Some(&dir.path().join("none")), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tenant_secret_file") && e.contains("cannot read"),
            "{e}"
        );
        assert!(!format!("{env:?}").contains("0123"), "{env:?}");
    }

    #[test]
    fn record_keys_from_a_file_of_the_owners_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str, mode: u32| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            path
        };
        let key = "ab".repeat(32);
        let good = write(
            "good",
            &format!("k2:{key}\nk1:{}\n", "cd".repeat(32)),
            0o600,
        );
        let keys = record_keys(Some(&good)).unwrap().unwrap();
        assert_eq!(keys.current_id(), "k2");
        assert!(record_keys(None).unwrap().is_none());
        let grouped = write("grouped", &format!("k1:{key}\n"), 0o640);
        assert!(
            record_keys(Some(&grouped)).unwrap().is_some(),
            "warned, not refused"
        );

        let open = write("open", &format!("k1:{key}\n"), 0o644);
        let e = record_keys(Some(&open)).unwrap_err().to_string();
        assert!(
            e.contains("record_key_file") && e.contains("644") && e.contains("chmod 600"),
            "{e}"
        );
        let bad = write("bad", "k1:abab\n", 0o600);
        let e = record_keys(Some(&bad)).unwrap_err().to_string();
        assert!(e.contains("line 1") && !e.contains("abab"), "{e}");
        let empty = write("empty", "# none yet\n", 0o600);
        let e = record_keys(Some(&empty)).unwrap_err().to_string();
        assert!(e.contains("no key"), "{e}");
        let e = record_keys(Some(&dir.path().join("missing")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
    }
}
