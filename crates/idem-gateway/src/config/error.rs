//! Why a setting cannot be used.

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The `--config` file cannot be read.
    #[error("cannot read the config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The `--config` file is not valid TOML for this program.
    #[error("the config file {path} is invalid: {source}{hint}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: Box<toml::de::Error>,
        /// For a misspelled key, the nearest known one (`\ndid you mean …?`); else empty.
        hint: String,
    },
    /// A setting has an unusable value.
    #[error("{setting}: {reason}")]
    Invalid {
        /// Which setting.
        setting: String,
        /// What is wrong.
        reason: String,
    },
}

/// The error for `setting`, named as the TOML file names it.
pub(crate) fn invalid(setting: impl Into<String>, reason: impl ToString) -> ConfigError {
    ConfigError::Invalid {
        setting: setting.into(),
        reason: reason.to_string(),
    }
}
