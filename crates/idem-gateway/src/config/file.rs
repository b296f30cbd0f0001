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
    crate::nearest::nearest(unknown, known).map(str::to_owned)
}
