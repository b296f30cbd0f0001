//! The TLS settings of a MySQL URL, as MySQL's clients spell them, checked before
//! anything connects.
//!
//! - `ssl-mode`: `DISABLED` (plaintext), `PREFERRED` (the default: TLS when the server
//!   offers it, unverified), `REQUIRED` (TLS or nothing, unverified), `VERIFY_CA` (the
//!   certificate chains to a trusted CA), `VERIFY_IDENTITY` (and names the host the URL
//!   connects to), in any case. `REQUIRED` with a CA file is `VERIFY_CA`, as for the
//!   PostgreSQL store's `require`.
//! - `ssl-ca=FILE`: the CA certificates (PEM) `VERIFY_CA` and `VERIFY_IDENTITY` trust;
//!   without it, the system's roots.
//! - `ssl-cert=FILE` and `ssl-key=FILE`: a client certificate (PEM chain) and its key,
//!   given together (for an account `REQUIRE X509`).
//!
//! The driver's other spellings (`sslmode`, `sslca`, `sslcert`, `sslkey`) mean the
//! same. The files are read once, when the store is built: one that is missing,
//! unreadable or not what its parameter says is refused with a reason naming the
//! parameter (which the builder reports as
//! [`SetupError::Invalid`](idem_core::SetupError::Invalid)).

use idem_core::open::tls::{both_or_neither, read_ca, read_identity};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

/// The modes, as `ssl-mode` spells them, for messages.
const MODES: &str = "DISABLED, PREFERRED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY";

/// `mode` as `ssl-mode` spells it.
pub(crate) fn mode_name(mode: MySqlSslMode) -> &'static str {
    match mode {
        MySqlSslMode::Disabled => "DISABLED",
        MySqlSslMode::Preferred => "PREFERRED",
        MySqlSslMode::Required => "REQUIRED",
        MySqlSslMode::VerifyCa => "VERIFY_CA",
        MySqlSslMode::VerifyIdentity => "VERIFY_IDENTITY",
    }
}

/// The URL's query parameters, decoded, in order.
fn parameters(url: &str) -> Vec<(String, String)> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

/// The last of `names` in `params`: the driver reads them in order, so the last wins.
fn setting<'a>(params: &'a [(String, String)], names: &[&str]) -> Option<&'a (String, String)> {
    params
        .iter()
        .rev()
        .find(|(name, _)| names.contains(&name.as_str()))
}

/// Checks the `ssl-mode` the URL gives, before the driver reads it: the driver's own
/// message for an unknown one does not say which modes there are.
pub(crate) fn check_mode(url: &str) -> Result<(), String> {
    let params = parameters(url);
    if let Some((name, value)) = setting(&params, &["ssl-mode", "sslmode"]) {
        let known = [
            "disabled",
            "preferred",
            "required",
            "verify_ca",
            "verify_identity",
        ];
        if !known.contains(&value.to_ascii_lowercase().as_str()) {
            return Err(format!("{name}={value}: not a mode; use {MODES}"));
        }
    }
    Ok(())
}

/// Applies the URL's TLS files to `options`, which the driver parsed from `url`: reads
/// and checks them, and makes `REQUIRED` with a CA `VERIFY_CA`.
pub(crate) fn apply(
    url: &str,
    mut options: MySqlConnectOptions,
) -> Result<MySqlConnectOptions, String> {
    let params = parameters(url);
    let ca = setting(&params, &["ssl-ca", "sslca"]);
    if let Some((name, path)) = ca {
        options = options.ssl_ca_from_pem(read_ca(name, path)?);
    }
    let cert = setting(&params, &["ssl-cert", "sslcert"]);
    let key = setting(&params, &["ssl-key", "sslkey"]);
    let cert_name = cert.map_or("ssl-cert", |(n, _)| n.as_str());
    let key_name = key.map_or("ssl-key", |(n, _)| n.as_str());
    let pair = both_or_neither(
        (cert_name, cert.map(|(_, v)| v.as_str())),
        (key_name, key.map(|(_, v)| v.as_str())),
    )?;
    if let Some((cert_path, key_path)) = pair {
        let identity = read_identity((cert_name, cert_path), (key_name, key_path))?;
        options = options
            .ssl_client_cert_from_pem(identity.cert)
            .ssl_client_key_from_pem(identity.key);
    }
    if matches!(options.get_ssl_mode(), MySqlSslMode::Required) && ca.is_some() {
        options = options.ssl_mode(MySqlSslMode::VerifyCa);
    }
    Ok(options)
}
