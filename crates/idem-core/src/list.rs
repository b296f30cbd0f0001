//! Listing records for operators ([`Store::list`](crate::Store::list)), and what makes a
//! record's outcome ambiguous: the gateway could not know what the request did, so an
//! operator must reconcile it with the business's own records.

use std::fmt;
use std::time::Duration;

use crate::{Endpoint, Key, Record, RecordState, Scope, StoreError, Tenant, Timestamp};

/// The most records one [`Store::list`](crate::Store::list) call returns, whatever
/// [`ListQuery::limit`] asks for.
pub const MAX_LIST_LIMIT: usize = 1000;

/// The records one call returns unless [`ListQuery::limit`] says otherwise.
pub const DEFAULT_LIST_LIMIT: usize = 100;

/// Why a record's outcome is ambiguous: the request was sent on, and what it did is not
/// known from the record alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Ambiguity {
    /// The record was taken over after an earlier attempt's lease lapsed (attempt > 1,
    /// SPEC S7): the earlier attempt may have acted before it died.
    Takeover,
    /// The record is in progress and its lease has lapsed: the attempt died or gave up
    /// without an answer, and nobody has retried since.
    Orphaned,
    /// The upstream sent no complete answer by the deadline after the request was sent
    /// (a 504 `upstream-timeout`); the record stays in progress until its lease lapses.
    UpstreamTimeout,
    /// The connection to the upstream broke after the request was sent (a 504
    /// `upstream-connection-lost`); the record stays in progress until its lease lapses.
    UpstreamConnectionLost,
    /// The answer was over the response limit: the request ran, and a problem was
    /// recorded in place of its answer.
    AnswerTooLarge,
    /// The handler failed or panicked after it started: the request may have had
    /// effects, and a 500 was recorded.
    HandlerFailed,
}

impl Ambiguity {
    /// Every reason, for a metrics endpoint that lists each at zero before it first
    /// happens. Kept beside [`as_str`](Self::as_str).
    pub const ALL: [Ambiguity; 6] = [
        Ambiguity::Takeover,
        Ambiguity::Orphaned,
        Ambiguity::UpstreamTimeout,
        Ambiguity::UpstreamConnectionLost,
        Ambiguity::AnswerTooLarge,
        Ambiguity::HandlerFailed,
    ];

    /// A short, stable name (`takeover`, `orphaned`, `upstream_timeout`,
    /// `upstream_connection_lost`, `answer_too_large`, `handler_failed`), for metric
    /// labels, logs and listings.
    pub fn as_str(self) -> &'static str {
        match self {
            Ambiguity::Takeover => "takeover",
            Ambiguity::Orphaned => "orphaned",
            Ambiguity::UpstreamTimeout => "upstream_timeout",
            Ambiguity::UpstreamConnectionLost => "upstream_connection_lost",
            Ambiguity::AnswerTooLarge => "answer_too_large",
            Ambiguity::HandlerFailed => "handler_failed",
        }
    }

    /// The reason named by [`as_str`](Self::as_str).
    pub fn parse(name: &str) -> Option<Ambiguity> {
        Ambiguity::ALL.into_iter().find(|a| a.as_str() == name)
    }
}

impl fmt::Display for Ambiguity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Record {
    /// Why this record's outcome is ambiguous at `now`, if it is: the reason its answer
    /// was recorded with; for one in progress, the reason its attempt left it so
    /// ([`in_progress_ambiguity`](Record::in_progress_ambiguity)), else
    /// [`Ambiguity::Orphaned`] when its lease has lapsed; else [`Ambiguity::Takeover`]
    /// when it is a later attempt than the first.
    pub fn ambiguity(&self, now: Timestamp) -> Option<Ambiguity> {
        match &self.state {
            RecordState::Completed { response, .. } => {
                if let Some(reason) = response.ambiguity() {
                    return Some(reason);
                }
            }
            RecordState::InProgress { lease_until } => {
                if let Some(reason) = self.in_progress_ambiguity {
                    return Some(reason);
                }
                if *lease_until <= now {
                    return Some(Ambiguity::Orphaned);
                }
            }
            RecordState::Tombstone { .. } => {}
        }
        (self.attempt > 1).then_some(Ambiguity::Takeover)
    }
}

/// Which state [`ListQuery::state`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StateFilter {
    /// Records an attempt still holds, or held until its lease lapsed.
    InProgress,
    /// Records with an answer.
    Completed,
}

impl StateFilter {
    /// `in_progress` or `completed`.
    pub fn as_str(self) -> &'static str {
        match self {
            StateFilter::InProgress => "in_progress",
            StateFilter::Completed => "completed",
        }
    }

    /// The filter named by [`as_str`](Self::as_str).
    pub fn parse(name: &str) -> Option<StateFilter> {
        match name {
            "in_progress" => Some(StateFilter::InProgress),
            "completed" => Some(StateFilter::Completed),
            _ => None,
        }
    }
}

/// Where a listing resumes: opaque text that one [`ListPage::next`] handed out, to pass
/// back as [`ListQuery::after`] to the same store. Its form is the store's own (a SQL
/// store's last primary key, Redis's `SCAN` position); a store given one it cannot read
/// answers [`StoreError::InvalidCursor`](crate::StoreError::InvalidCursor).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ListCursor(String);

impl ListCursor {
    /// A cursor holding `parts`, for a store to read back with
    /// [`parts`](Self::parts): each part's length as a big-endian `u32`, then its bytes,
    /// all in lowercase hex, so the text is safe in a URL and a header.
    pub fn from_parts<P: AsRef<[u8]>>(parts: &[P]) -> ListCursor {
        let mut raw = Vec::new();
        for part in parts {
            let part = part.as_ref();
            raw.extend_from_slice(&(part.len() as u32).to_be_bytes());
            raw.extend_from_slice(part);
        }
        ListCursor(hex::encode(raw))
    }

    /// A cursor from its text, as a caller got it from [`as_str`](Self::as_str);
    /// `None` when the text cannot be one.
    pub fn parse(text: &str) -> Option<ListCursor> {
        let cursor = ListCursor(text.to_owned());
        cursor.raw_parts().map(|_| cursor)
    }

    /// The text to hand to a caller.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parts [`from_parts`](Self::from_parts) stored, or
    /// [`StoreError::InvalidCursor`](crate::StoreError::InvalidCursor) when there are not
    /// `count` of them, each UTF-8.
    pub fn parts(&self, count: usize) -> crate::Result<Vec<String>> {
        let invalid = || crate::StoreError::InvalidCursor(self.0.clone());
        let parts = self.raw_parts().ok_or_else(invalid)?;
        if parts.len() != count {
            return Err(invalid());
        }
        parts
            .into_iter()
            .map(|p| String::from_utf8(p).map_err(|_| invalid()))
            .collect()
    }

    /// The parts [`from_parts`](Self::from_parts) stored, as bytes, or
    /// [`StoreError::InvalidCursor`](crate::StoreError::InvalidCursor) when there are not
    /// `count` of them.
    pub fn byte_parts(&self, count: usize) -> crate::Result<Vec<Vec<u8>>> {
        match self.raw_parts() {
            Some(parts) if parts.len() == count => Ok(parts),
            _ => Err(crate::StoreError::InvalidCursor(self.0.clone())),
        }
    }

    fn raw_parts(&self) -> Option<Vec<Vec<u8>>> {
        let raw = hex::decode(&self.0).ok()?;
        let mut rest = &raw[..];
        let mut parts = Vec::new();
        while !rest.is_empty() {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let len = u32::from_be_bytes(*len) as usize;
            if tail.len() < len {
                return None;
            }
            parts.push(tail[..len].to_vec());
            rest = &tail[len..];
        }
        (!parts.is_empty()).then_some(parts)
    }
}

impl ListCursor {
    /// The cursor of a store that lists in scope order (tenant, endpoint, key, as a SQL
    /// store's primary key sorts them): resumes after `scope`.
    pub fn after_scope(scope: &Scope) -> ListCursor {
        ListCursor::from_parts(&[
            scope.tenant().as_str(),
            scope.endpoint_str(),
            scope.key().as_str(),
        ])
    }

    /// What [`after_scope`](Self::after_scope) stored: the tenant, endpoint (empty in
    /// internal mode) and key.
    pub fn scope_parts(&self) -> crate::Result<[String; 3]> {
        let [t, e, k]: [String; 3] = self
            .parts(3)?
            .try_into()
            .map_err(|_| StoreError::InvalidCursor(self.0.clone()))?;
        Ok([t, e, k])
    }
}

impl Scope {
    /// A scope from the columns a SQL store keeps it in: the tenant, the endpoint (the
    /// empty string in internal mode, as [`endpoint_str`](Scope::endpoint_str) writes
    /// it) and the key; [`StoreError::Corrupt`] when the key is no valid key.
    pub fn from_columns(tenant: &str, endpoint: &str, key: &str) -> crate::Result<Scope> {
        let key = Key::new(key).map_err(|e| StoreError::Corrupt(format!("stored key: {e}")))?;
        let endpoint = (!endpoint.is_empty()).then(|| Endpoint::from_raw(endpoint));
        Ok(Scope::from_parts(Tenant::new(tenant), endpoint, key))
    }
}

impl fmt::Debug for ListCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ListCursor").field(&self.0).finish()
    }
}

impl fmt::Display for ListCursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What [`Store::list`](crate::Store::list) returns: records that have not expired,
/// filtered, a page at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only records in this state; any state when `None`.
    pub state: Option<StateFilter>,
    /// Only records created at least this long ago, by the store's clock.
    pub older_than: Option<Duration>,
    /// Only records whose outcome is ambiguous ([`Record::ambiguity`]).
    pub ambiguous: bool,
    /// Where to resume: the [`ListPage::next`] of the previous page.
    pub after: Option<ListCursor>,
    /// The most records to return, at least 1 and at most [`MAX_LIST_LIMIT`] (a store
    /// reads it through [`limit`](Self::limit)).
    pub limit: usize,
}

impl Default for ListQuery {
    fn default() -> ListQuery {
        ListQuery {
            state: None,
            older_than: None,
            ambiguous: false,
            after: None,
            limit: DEFAULT_LIST_LIMIT,
        }
    }
}

impl ListQuery {
    /// Every record, [`DEFAULT_LIST_LIMIT`] at a time.
    pub fn new() -> ListQuery {
        ListQuery::default()
    }

    /// Keeps records in `state` only.
    pub fn state(mut self, state: StateFilter) -> ListQuery {
        self.state = Some(state);
        self
    }

    /// Keeps records created at least `age` ago only.
    pub fn older_than(mut self, age: Duration) -> ListQuery {
        self.older_than = Some(age);
        self
    }

    /// Keeps records whose outcome is ambiguous only.
    pub fn ambiguous(mut self) -> ListQuery {
        self.ambiguous = true;
        self
    }

    /// Resumes after `cursor`.
    pub fn after(mut self, cursor: ListCursor) -> ListQuery {
        self.after = Some(cursor);
        self
    }

    /// Sets the most records per page (bounded, see [`limit`](Self::limit)).
    pub fn with_limit(mut self, limit: usize) -> ListQuery {
        self.limit = limit;
        self
    }

    /// The most records one page holds: the query's, clamped to 1..=[`MAX_LIST_LIMIT`].
    pub fn limit(&self) -> usize {
        self.limit.clamp(1, MAX_LIST_LIMIT)
    }

    /// The latest creation time a record may have to be listed at `now`, if the query
    /// asks for an age.
    pub fn created_by(&self, now: Timestamp) -> Option<Timestamp> {
        self.older_than.map(|age| {
            Timestamp::from_millis(now.as_millis().saturating_sub(crate::duration_millis(age)))
        })
    }

    /// Whether `record` belongs in the listing at `now`: not expired, not a tombstone
    /// (SPEC S16: what is left of an expired record, with nothing to reconcile that its
    /// completion did not settle), and every filter holds. Stores that narrow their scan
    /// by other means run this last, so that all of them list the same records.
    pub fn matches(&self, record: &Record, now: Timestamp) -> bool {
        if record.is_expired(now) || matches!(record.state, RecordState::Tombstone { .. }) {
            return false;
        }
        let state_ok = match self.state {
            None => true,
            Some(StateFilter::Completed) => record.is_completed(),
            Some(StateFilter::InProgress) => !record.is_completed(),
        };
        let age_ok = self
            .created_by(now)
            .is_none_or(|latest| record.created_at <= latest);
        state_ok && age_ok && (!self.ambiguous || record.ambiguity(now).is_some())
    }
}

/// One page of [`Store::list`](crate::Store::list).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListPage {
    /// The records, at most the query's [`limit`](ListQuery::limit). A page may hold
    /// fewer, even none, and still have a `next`: a store bounds the work of one call.
    pub records: Vec<Record>,
    /// Where the next page starts; `None` once the listing is complete.
    pub next: Option<ListCursor>,
}

impl ListPage {
    /// The page of a store that lists in scope order (tenant, endpoint, key, as the SQL
    /// stores' primary key sorts them): `read`, at most the query's limit of records in
    /// that order, and whether more were there (`more`). The next page resumes after the
    /// last record read ([`ListCursor::after_scope`]), and the page keeps the records
    /// [`ListQuery::matches`] at `now`.
    pub fn in_scope_order(
        mut read: Vec<Record>,
        more: bool,
        query: &ListQuery,
        now: Timestamp,
    ) -> ListPage {
        let next = read
            .last()
            .filter(|_| more)
            .map(|last| ListCursor::after_scope(&last.scope));
        read.retain(|r| query.matches(r, now));
        ListPage {
            records: read,
            next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_its_parts() {
        let c = ListCursor::from_parts(&["tenant", "", "k-1"]);
        let parsed = ListCursor::parse(c.as_str()).expect("parses");
        assert_eq!(parsed.parts(3).unwrap(), ["tenant", "", "k-1"]);
        assert!(parsed.parts(2).is_err());
        assert_eq!(parsed.byte_parts(3).unwrap()[2], b"k-1");
        assert!(parsed.byte_parts(4).is_err());
        for bad in ["", "zz", "00000005ab", "0000"] {
            assert!(ListCursor::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn every_reason_has_its_own_label() {
        let labels: Vec<&str> = Ambiguity::ALL.iter().map(|a| a.as_str()).collect();
        assert_eq!(
            labels,
            [
                "takeover",
                "orphaned",
                "upstream_timeout",
                "upstream_connection_lost",
                "answer_too_large",
                "handler_failed"
            ]
        );
        for a in Ambiguity::ALL {
            assert_eq!(Ambiguity::parse(a.as_str()), Some(a));
        }
    }

    #[test]
    fn limit_is_bounded() {
        assert_eq!(ListQuery::new().limit(), DEFAULT_LIST_LIMIT);
        assert_eq!(ListQuery::new().with_limit(0).limit(), 1);
        assert_eq!(
            ListQuery::new().with_limit(1_000_000).limit(),
            MAX_LIST_LIMIT
        );
    }
}
