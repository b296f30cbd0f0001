//! The forms the TOML file writes values in, read into the types the command line
//! parses them to.

use std::time::Duration;

use serde::Deserialize;
use serde::de::{Deserializer, Error};

use super::values::{parse_byte_size, parse_duration};

/// `migrate = false` as the switch that is on when it is false.
pub(super) fn inverted<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(!bool::deserialize(d)?)
}

/// `"24h"`, parsed as the command line parses it. A bare number (`ttl = 3600`) is
/// refused with the way to write it, rather than serde's "invalid type: integer,
/// expected a string": its unit is not for the gateway to guess.
pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum DurationForm {
        Text(String),
        Integer(i64),
        Float(f64),
    }
    let bare = |n: String| {
        D::Error::custom(format!(
            "{n} is a bare number; a duration is a string with its unit: \"{n}s\", \"1h\", \"500ms\""
        ))
    };
    match Option::<DurationForm>::deserialize(d)? {
        None => Ok(None),
        Some(DurationForm::Text(s)) => parse_duration(&s).map(Some).map_err(D::Error::custom),
        Some(DurationForm::Integer(n)) => Err(bare(n.to_string())),
        Some(DurationForm::Float(n)) => Err(bare(n.to_string())),
    }
}

/// A number of bytes, or a string with a unit (`"1MiB"`).
pub(super) fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ByteSize {
        Bytes(u64),
        Text(String),
    }
    match Option::<ByteSize>::deserialize(d)? {
        None => Ok(None),
        Some(ByteSize::Bytes(n)) => usize::try_from(n)
            .map(Some)
            .map_err(|_| D::Error::custom("too large")),
        Some(ByteSize::Text(s)) => parse_byte_size(&s).map(Some).map_err(D::Error::custom),
    }
}

/// An array of strings, or one comma-separated string, as the command line's list.
pub(super) fn list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum List {
        Many(Vec<String>),
        One(String),
    }
    Ok(Option::<List>::deserialize(d)?.map(|list| match list {
        List::Many(items) => items,
        List::One(text) => text.split(',').map(str::to_owned).collect(),
    }))
}

/// Status codes as numbers, `[]` for none: the command line's list, where none is
/// spelt `none`.
pub(super) fn statuses<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Option::<Vec<u16>>::deserialize(d)?.map(|codes| {
        if codes.is_empty() {
            vec!["none".to_owned()]
        } else {
            codes.iter().map(u16::to_string).collect()
        }
    }))
}
