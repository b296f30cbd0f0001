//! "Did you mean": the known name nearest a misspelt one, by one measure for the
//! config file's keys and the store URL's scheme alike.

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
