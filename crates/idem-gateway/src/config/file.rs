//! The `--config` file, read: its settings, or an error that names the nearest known
//! setting for a misspelt one.

use std::path::Path;

use super::{ConfigError, ServeArgs};

/// The `--config` file's settings.
pub(super) fn read_file(path: &Path) -> Result<ServeArgs, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.display().to_string(),
        hint: misspelled(source.message())
            .map(|near| format!("did you mean `{near}`?"))
            .unwrap_or_default(),
        source: Box::new(source),
    })
}

/// For serde's "unknown field `x`, expected one of `a`, `b`, …", the known name nearest
/// `x`, if one is near enough to be what was meant.
fn misspelled(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (unknown, rest) = rest.split_once('`')?;
    let known = rest.split('`').skip(1).step_by(2);
    nearest(unknown, known).map(str::to_owned)
}

/// Of the `known` names, the one nearest `unknown` if one is near enough to be what
/// was meant (at most two edits, or a quarter of its length for a long name); the one
/// measure for misspelt keys and store URL schemes alike.
pub(crate) fn nearest<'a>(
    unknown: &str,
    known: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    known
        .into_iter()
        .map(|name| (strsim::damerau_levenshtein(unknown, name), name))
        .filter(|(distance, name)| *distance <= 2.max(name.len() / 4))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}
