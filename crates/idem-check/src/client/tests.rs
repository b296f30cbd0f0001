//! Tests of `client.rs`.

use super::*;

fn t(sent_us: u64, answered_us: Option<u64>) -> Timing {
    Timing {
        sent_us,
        answered_us,
    }
}

#[test]
fn requests_overlap_when_their_intervals_intersect() {
    // One answered before the next was sent: not in flight together.
    assert!(!t(0, Some(10)).overlaps(&t(11, Some(20))));
    assert!(!t(11, Some(20)).overlaps(&t(0, Some(10))));
    // Sent before the other's answer was read.
    assert!(t(0, Some(10)).overlaps(&t(5, Some(20))));
    assert!(t(5, Some(6)).overlaps(&t(0, Some(20))));
    // An instant shared is an overlap.
    assert!(t(0, Some(10)).overlaps(&t(10, Some(20))));
    // No answer: in flight from its first byte on.
    assert!(t(0, None).overlaps(&t(100, Some(200))));
    assert!(!t(300, None).overlaps(&t(100, Some(200))));
}
