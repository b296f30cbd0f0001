//! Splitting one fuzz input into the few fields a target reads.

/// `data` up to its first `\n`, and what follows it; the whole of `data` and nothing
/// when it has no `\n`.
pub(crate) fn first_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}
