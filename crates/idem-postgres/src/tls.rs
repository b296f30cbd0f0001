//! The TLS settings of a PostgreSQL URL, as libpq spells them, checked before anything
//! connects.
//!
//! - `sslmode`: `disable` (plaintext), `prefer` (the default: TLS when the server
//!   offers it, unverified), `require` (TLS or nothing, unverified), `verify-ca` (the
//!   certificate chains to a trusted CA), `verify-full` (and names the host the URL
//!   connects to). `allow` is refused: the driver would never try TLS with it.
//! - `sslrootcert=FILE`: the CA certificates (PEM) that `verify-ca` and `verify-full`
//!   trust; without it, the system's roots. As in libpq, `require` with a CA file is
//!   `verify-ca`.
//! - `sslcert=FILE` and `sslkey=FILE`: a client certificate (PEM chain) and its key,
//!   given together.
//!
//! The driver's other spellings (`ssl-mode`, `ssl-root-cert`, `ssl-ca`, `ssl-cert`,
//! `ssl-key`) and its environment variables (`PGSSLMODE`, `PGSSLROOTCERT`,
//! `PGSSLCERT`, `PGSSLKEY`, which the URL overrides) mean the same. The files are
//! read once, when the store is built: a file that is missing, unreadable or not
//! what its parameter says is refused with a reason naming the parameter (which the
//! builder reports as [`SetupError::Invalid`](idem_core::SetupError::Invalid)), not a
//! failure of every later connection.

use idem_core::open::tls::{both_or_neither, read_ca, read_identity};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

/// The modes, as `sslmode` spells them, for messages.
const MODES: &str = "disable, prefer, require, verify-ca or verify-full";

/// `mode` as `sslmode` spells it.
pub(crate) fn mode_name(mode: PgSslMode) -> &'static str {
    match mode {
        PgSslMode::Disable => "disable",
        PgSslMode::Allow => "allow",
        PgSslMode::Prefer => "prefer",
        PgSslMode::Require => "require",
        PgSslMode::VerifyCa => "verify-ca",
        PgSslMode::VerifyFull => "verify-full",
    }
}

/// One TLS setting: the parameter (or environment variable) it came from, and its
/// value.
type Setting = (String, String);

/// The URL's query parameters, decoded, in order.
fn parameters(url: &str) -> Vec<Setting> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

/// The last of `names` in `params` (the driver reads them in order, so the last
/// wins), else the environment variable `env`.
fn setting(params: &[Setting], names: &[&str], env: &str) -> Option<Setting> {
    params
        .iter()
        .rev()
        .find(|(name, _)| names.contains(&name.as_str()))
        .cloned()
        .or_else(|| std::env::var(env).ok().map(|value| (env.to_owned(), value)))
}

/// Checks the `sslmode` the URL gives, before the driver reads it: the driver's own
/// message for an unknown one does not say which modes there are.
pub(crate) fn check_mode(url: &str) -> Result<(), String> {
    let params = parameters(url);
    if let Some((name, value)) = setting(&params, &["sslmode", "ssl-mode"], "PGSSLMODE") {
        let known = [
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ];
        if !known.contains(&value.to_ascii_lowercase().as_str()) {
            return Err(format!("{name}={value}: not a mode; use {MODES}"));
        }
    }
    Ok(())
}

/// Applies the URL's (or the environment's) TLS settings to `options`, which the
/// driver parsed from `url`: reads and checks the files, and makes `require` with a CA
/// `verify-ca`.
pub(crate) fn apply(url: &str, mut options: PgConnectOptions) -> Result<PgConnectOptions, String> {
    let params = parameters(url);
    let mode = options.get_ssl_mode();
    if matches!(mode, PgSslMode::Allow) {
        let (name, _) = setting(&params, &["sslmode", "ssl-mode"], "PGSSLMODE")
            .unwrap_or_else(|| ("sslmode".into(), String::new()));
        return Err(format!(
            "{name}=allow is not supported: this driver would never try TLS with it; \
             use {MODES}"
        ));
    }
    let ca = setting(
        &params,
        &["sslrootcert", "ssl-root-cert", "ssl-ca"],
        "PGSSLROOTCERT",
    );
    if let Some((name, path)) = &ca {
        options = options.ssl_root_cert_from_pem(read_ca(name, path)?);
    }
    let cert = setting(&params, &["sslcert", "ssl-cert"], "PGSSLCERT");
    let key = setting(&params, &["sslkey", "ssl-key"], "PGSSLKEY");
    let cert_name = cert.as_ref().map_or("sslcert", |(n, _)| n.as_str());
    let key_name = key.as_ref().map_or("sslkey", |(n, _)| n.as_str());
    let pair = both_or_neither(
        (cert_name, cert.as_ref().map(|(_, v)| v.as_str())),
        (key_name, key.as_ref().map(|(_, v)| v.as_str())),
    )?;
    if let Some((cert_path, key_path)) = pair {
        let identity = read_identity((cert_name, cert_path), (key_name, key_path))?;
        options = options
            .ssl_client_cert_from_pem(identity.cert)
            .ssl_client_key_from_pem(identity.key);
    }
    if matches!(mode, PgSslMode::Require) && ca.is_some() {
        options = options.ssl_mode(PgSslMode::VerifyCa);
    }
    Ok(options)
}
