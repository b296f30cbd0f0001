use super::*;
use crate::reserve::releases_after;
use std::io;

#[test]
fn scan_pattern_escapes_glob_characters_and_matches_the_record_key_shape() {
    let hex64 = "?".repeat(64);
    assert_eq!(scan_pattern("idem:"), format!("idem:{{{hex64}}}*"));
    assert_eq!(
        scan_pattern("a*b?[c]\\"),
        format!("a\\*b\\?\\[c\\]\\\\{{{hex64}}}*")
    );
}

#[test]
fn native_ttl_is_remaining_life_plus_grace_within_bounds() {
    let now = Timestamp::from_millis(1_000_000);
    assert_eq!(
        native_ttl(5_000, now.plus(Duration::from_secs(60)), now),
        65_000
    );
    // Already past: deleted soon, never a zero or negative PX.
    assert_eq!(native_ttl(0, now, now), 1);
    assert_eq!(native_ttl(0, Timestamp::from_millis(0), now), 1);
    assert_eq!(
        native_ttl(5_000, Timestamp::from_millis(i64::MAX), now),
        MAX_NATIVE_TTL_MS
    );
}

#[test]
fn only_a_first_attempt_whose_command_may_have_run_is_released() {
    let io = |kind| RedisError::from(io::Error::new(kind, "test"));
    assert!(releases_after(&io(io::ErrorKind::ConnectionReset), 1));
    assert!(releases_after(&io(io::ErrorKind::TimedOut), 1));
    assert!(releases_after(&io(io::ErrorKind::UnexpectedEof), 1));
    // Never sent.
    assert!(!releases_after(&io(io::ErrorKind::ConnectionRefused), 1));
    // A takeover's record lapses instead.
    assert!(!releases_after(&io(io::ErrorKind::ConnectionReset), 2));
}
