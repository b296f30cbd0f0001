//! The checker on hand-made histories: a clean one, and one for each kind of violation.

use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::history::{Execution, History, Listed, Outcome, Request};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The body execution `n` answers with.
fn body(n: u32) -> Bytes {
    Bytes::from(format!(r#"{{"n":{n}}}"#))
}

fn execution(key: &str, attempt: Option<u32>, started: u64, n: u32) -> Execution {
    Execution {
        key: key.to_owned(),
        attempt,
        started: ms(started),
        body: body(n),
    }
}

fn answered(key: &str, ended: u64, status: u16, n: u32, replayed: bool) -> Request {
    Request {
        key: key.to_owned(),
        gateway: 0,
        sent: ms(ended.saturating_sub(5)),
        ended: ms(ended),
        outcome: Outcome::Answer {
            status,
            body: body(n),
            replayed,
        },
    }
}

fn problem(key: &str, ended: u64, status: u16) -> Request {
    Request {
        key: key.to_owned(),
        gateway: 1,
        sent: ms(ended - 5),
        ended: ms(ended),
        outcome: Outcome::Answer {
            status,
            body: Bytes::from_static(br#"{"type":"problem"}"#),
            replayed: false,
        },
    }
}

fn lost(key: &str, ended: u64) -> Request {
    Request {
        key: key.to_owned(),
        gateway: 0,
        sent: ms(ended - 5),
        ended: ms(ended),
        outcome: Outcome::Lost,
    }
}

fn listed(key: &str, reason: &str, attempt: u32) -> Listed {
    Listed {
        key: key.to_owned(),
        reason: reason.to_owned(),
        attempt,
    }
}

/// Two keys: `a` answered, lost once and replayed through both gateways; `b` in
/// progress (409), unavailable (503), then answered. Healed at 100 ms, bound 1 s.
fn clean() -> History {
    History {
        keys: vec!["a".into(), "b".into()],
        requests: vec![
            lost("a", 20),
            answered("a", 30, 201, 1, false),
            answered("a", 40, 201, 1, true),
            problem("b", 25, 409),
            problem("b", 35, 503),
            answered("b", 60, 201, 2, true),
        ],
        executions: vec![
            execution("a", Some(1), 10, 1),
            execution("b", Some(1), 20, 2),
        ],
        listed: vec![],
        healed: ms(100),
        bound: ms(1000),
    }
}

#[test]
fn a_clean_history_passes_and_is_counted() {
    let report = check(&clean());
    assert!(report.clean(), "{report}");
    assert_eq!(
        (report.keys, report.operations, report.executions),
        (2, 6, 2)
    );
    assert_eq!((report.doubles_listed, report.doubles_silent), (0, 0));
    assert_eq!((report.changed_listed, report.changed_silent), (0, 0));
    assert_eq!(
        (report.lost_listed, report.lost, report.unfinished),
        (0, 0, 0)
    );
}

#[test]
fn a_double_execution_the_feed_does_not_list_is_silent() {
    let mut h = clean();
    h.executions.push(execution("b", Some(2), 40, 3));
    let report = check(&h);
    assert_eq!((report.doubles_listed, report.doubles_silent), (0, 1));
    assert_eq!(report.count(Violation::SilentDouble), 1);
    assert_eq!(report.findings[0].key, "b");
}

#[test]
fn a_listed_double_whose_later_execution_repeats_the_attempt_is_silent() {
    // A reservation lost in a failover: the retry ran as attempt 1 again.
    let mut h = clean();
    h.executions.push(execution("b", Some(1), 40, 3));
    h.listed.push(listed("b", "takeover", 2));
    let report = check(&h);
    assert_eq!((report.doubles_listed, report.doubles_silent), (0, 1));
    // Without an attempt header at all, likewise.
    let mut h = clean();
    h.executions.push(execution("b", None, 40, 3));
    h.listed.push(listed("b", "takeover", 2));
    assert_eq!(check(&h).doubles_silent, 1);
}

#[test]
fn a_listed_double_with_a_new_attempt_passes() {
    let mut h = clean();
    h.executions.push(execution("b", Some(2), 40, 3));
    h.listed.push(listed("b", "takeover", 2));
    let report = check(&h);
    assert!(report.clean(), "{report}");
    assert_eq!((report.doubles_listed, report.doubles_silent), (1, 0));
}

#[test]
fn answers_of_two_listed_executions_are_a_listed_change() {
    // A paused gateway's own attempt answered its client after the takeover's answer
    // was recorded and replayed.
    let mut h = clean();
    h.executions.push(execution("b", Some(2), 40, 3));
    h.listed.push(listed("b", "takeover", 2));
    h.requests.push(answered("b", 70, 201, 3, false));
    let report = check(&h);
    assert!(report.clean(), "{report}");
    assert_eq!((report.changed_listed, report.changed_silent), (1, 0));
}

#[test]
fn a_changed_answer_without_a_listed_double_is_a_violation() {
    let mut h = clean();
    // The replay differs from the first answer although `a` executed once: its body
    // is none of `a`'s executions.
    h.requests.push(answered("a", 50, 201, 2, true));
    let report = check(&h);
    assert_eq!((report.changed_listed, report.changed_silent), (0, 1));
    assert_eq!(report.count(Violation::ChangedAnswer), 1);
}

#[test]
fn a_status_change_of_the_same_body_is_a_change() {
    let mut h = clean();
    h.requests.push(answered("a", 50, 200, 1, true));
    assert_eq!(check(&h).changed_silent, 1);
}

#[test]
fn a_silent_double_whose_clients_saw_both_answers_is_a_change_too() {
    let mut h = clean();
    h.executions.push(execution("a", Some(1), 35, 4));
    h.requests.push(answered("a", 45, 201, 4, false));
    let report = check(&h);
    assert_eq!(report.doubles_silent, 1);
    assert_eq!(report.changed_silent, 1);
}

#[test]
fn an_execution_after_the_answer_was_received_is_lost() {
    let mut h = clean();
    // `a` was answered at 30 ms; it ran again at 500 ms as attempt 1 (its record was
    // lost), listed as nothing.
    h.executions.push(execution("a", Some(1), 500, 5));
    let report = check(&h);
    assert_eq!((report.lost_listed, report.lost), (0, 1), "{report}");
    assert_eq!(report.count(Violation::Lost), 1);
    // One that started before the answer was received is not lost.
    let mut h = clean();
    h.executions.push(execution("a", Some(2), 25, 5));
    h.listed.push(listed("a", "takeover", 2));
    let report = check(&h);
    assert_eq!((report.lost_listed, report.lost), (0, 0), "{report}");
}

#[test]
fn a_listed_takeover_after_the_answer_was_received_is_a_listed_loss() {
    // `a` was answered at 30 ms but its answer could not be recorded; a takeover ran
    // it again at 500 ms as attempt 2, listed.
    let mut h = clean();
    h.executions.push(execution("a", Some(2), 500, 5));
    h.listed.push(listed("a", "takeover", 2));
    let report = check(&h);
    assert!(report.clean(), "{report}");
    assert_eq!((report.lost_listed, report.lost), (1, 0));
    assert_eq!(report.doubles_listed, 1);
}

#[test]
fn a_key_without_a_final_answer_by_the_bound_is_unfinished() {
    let mut h = clean();
    h.keys.push("c".into());
    h.requests.push(problem("c", 30, 409));
    h.requests.push(lost("c", 60));
    let report = check(&h);
    assert_eq!(report.unfinished, 1);
    assert_eq!(report.count(Violation::Unfinished), 1);
    // An answer after the bound is too late.
    h.requests.push(answered("c", 1200, 201, 6, false));
    h.executions.push(execution("c", Some(1), 1100, 6));
    assert_eq!(check(&h).unfinished, 1);
    // In time, fine.
    h.bound = ms(1200);
    assert!(check(&h).clean());
}

#[test]
fn the_table_row_has_every_figure() {
    let mut h = clean();
    h.executions.push(execution("b", Some(2), 40, 3));
    h.listed.push(listed("b", "takeover", 2));
    let row = check(&h).row("redis", "pause");
    assert_eq!(
        row,
        "| redis | pause | 2 | 6 | 3 | 1 / 0 | 0 / 0 | 0 / 0 | 0 |"
    );
    assert_eq!(
        Report::TABLE_HEAD
            .lines()
            .next()
            .unwrap()
            .matches('|')
            .count(),
        row.matches('|').count()
    );
}
