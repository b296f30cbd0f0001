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
//! what its parameter says is an [`Error::Tls`] naming the parameter, not a failure of
//! every later connection.

use idem_core::open::tls::{both_or_neither, read_ca, read_identity};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::error::Error;

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
pub(crate) fn check_mode(url: &str) -> Result<(), Error> {
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
            return Err(Error::Tls(format!(
                "{name}={value}: not a mode; use {MODES}"
            )));
        }
    }
    Ok(())
}

/// Applies the URL's (or the environment's) TLS settings to `options`, which the
/// driver parsed from `url`: reads and checks the files, and makes `require` with a CA
/// `verify-ca`.
pub(crate) fn apply(url: &str, mut options: PgConnectOptions) -> Result<PgConnectOptions, Error> {
    let params = parameters(url);
    let mode = options.get_ssl_mode();
    if matches!(mode, PgSslMode::Allow) {
        let (name, _) = setting(&params, &["sslmode", "ssl-mode"], "PGSSLMODE")
            .unwrap_or_else(|| ("sslmode".into(), String::new()));
        return Err(Error::Tls(format!(
            "{name}=allow is not supported: this driver would never try TLS with it; \
             use {MODES}"
        )));
    }
    let ca = setting(
        &params,
        &["sslrootcert", "ssl-root-cert", "ssl-ca"],
        "PGSSLROOTCERT",
    );
    if let Some((name, path)) = &ca {
        options = options.ssl_root_cert_from_pem(read_ca(name, path).map_err(Error::Tls)?);
    }
    let cert = setting(&params, &["sslcert", "ssl-cert"], "PGSSLCERT");
    let key = setting(&params, &["sslkey", "ssl-key"], "PGSSLKEY");
    let cert_name = cert.as_ref().map_or("sslcert", |(n, _)| n.as_str());
    let key_name = key.as_ref().map_or("sslkey", |(n, _)| n.as_str());
    let pair = both_or_neither(
        (cert_name, cert.as_ref().map(|(_, v)| v.as_str())),
        (key_name, key.as_ref().map(|(_, v)| v.as_str())),
    )
    .map_err(Error::Tls)?;
    if let Some((cert_path, key_path)) = pair {
        let identity =
            read_identity((cert_name, cert_path), (key_name, key_path)).map_err(Error::Tls)?;
        options = options
            .ssl_client_cert_from_pem(identity.cert)
            .ssl_client_key_from_pem(identity.key);
    }
    if matches!(mode, PgSslMode::Require) && ca.is_some() {
        options = options.ssl_mode(PgSslMode::VerifyCa);
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn apply_to(url: &str) -> Result<PgConnectOptions, Error> {
        check_mode(url)?;
        apply(url, PgConnectOptions::from_str(url).map_err(Error::Config)?)
    }

    #[test]
    fn the_modes_are_libpqs_and_allow_is_refused() {
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            let url = format!("postgres://127.0.0.1/test?sslmode={mode}");
            let options = apply_to(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(mode_name(options.get_ssl_mode()), mode);
        }
        let e = apply_to("postgres://127.0.0.1/test?sslmode=verify_full").unwrap_err();
        assert!(
            e.to_string()
                .contains("sslmode=verify_full: not a mode; use disable"),
            "{e}"
        );
        let e = apply_to("postgres://127.0.0.1/test?ssl-mode=allow").unwrap_err();
        assert!(
            e.to_string().contains("ssl-mode=allow is not supported"),
            "{e}"
        );
    }

    #[test]
    fn a_file_that_cannot_be_read_names_its_parameter() {
        for (url, says) in [
            (
                "postgres://127.0.0.1/test?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
                "sslrootcert=/nonexistent/ca.pem: cannot read the file",
            ),
            (
                "postgres://127.0.0.1/test?sslmode=verify-full&ssl-ca=%2Fnonexistent%2Fa%20b.pem",
                "ssl-ca=/nonexistent/a b.pem: cannot read",
            ),
            (
                "postgres://127.0.0.1/test?sslmode=require&sslcert=/nonexistent/c.pem",
                "sslcert needs sslkey",
            ),
            (
                "postgres://127.0.0.1/test?sslkey=/nonexistent/k.pem",
                "sslkey needs sslcert",
            ),
            (
                "postgres://127.0.0.1/test?sslcert=/nonexistent/c.pem&sslkey=/nonexistent/k.pem",
                "sslcert=/nonexistent/c.pem: cannot read",
            ),
        ] {
            let e = apply_to(url).unwrap_err();
            assert!(matches!(e, Error::Tls(_)), "{url}: {e:?}");
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
    }
}
