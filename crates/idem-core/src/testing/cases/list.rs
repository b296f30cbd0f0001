//! Listing records for operators: what each filter keeps, and paging that returns every
//! record once.

use std::collections::HashMap;

use super::*;
use crate::{
    Ambiguity, Clock, ListCursor, ListPage, ListQuery, MAX_LIST_LIMIT, Record, StateFilter,
};

/// Every page of `query`, followed to its end; panics if that takes absurdly many.
async fn list_all<S: Store>(store: &S, query: ListQuery) -> (Vec<Record>, Vec<ListPage>) {
    let mut query = query;
    let mut records = Vec::new();
    let mut pages = Vec::new();
    for _ in 0..10_000 {
        let page = store.list(&query).await.expect("list");
        assert!(
            page.records.len() <= query.limit(),
            "a page holds at most the limit: {} > {}",
            page.records.len(),
            query.limit()
        );
        records.extend(page.records.iter().cloned());
        let next = page.next.clone();
        pages.push(page);
        match next {
            Some(cursor) => query.after = Some(cursor),
            None => return (records, pages),
        }
    }
    panic!("the listing did not end");
}

/// The scopes' keys a listing returned, sorted, each as many times as listed.
fn keys_of(records: &[Record]) -> Vec<String> {
    let mut keys: Vec<String> = records
        .iter()
        .map(|r| r.scope.key().as_str().to_owned())
        .collect();
    keys.sort();
    keys
}

fn sorted(keys: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    keys.sort();
    keys
}

/// `state`, `older_than` and `ambiguous` each keep what they say, together too; an
/// expired record is never listed; each listed record says why it is ambiguous.
pub async fn list_filters_by_state_age_and_ambiguity<S: Store>(store: S, clock: ManualClock) {
    let scope = |key: &str| test_scope("/v1/charges", key);
    // At the start: a live attempt (renewed below), an answer, an answer whose outcome
    // is ambiguous, an attempt that dies, one that dies and is taken over, and one that
    // expires.
    let live = acquire(&store, &request(&scope("live"), "{}")).await;
    let done = acquire(&store, &request(&scope("done"), "{}")).await;
    store.complete(&done, &response()).await.expect("complete");
    let too_large = acquire(&store, &request(&scope("too-large"), "{}")).await;
    let ambiguous = StoredResponse::new(502, "too large").with_ambiguity(Ambiguity::AnswerTooLarge);
    store
        .complete(&too_large, &ambiguous)
        .await
        .expect("complete");
    acquire(&store, &request(&scope("orphan"), "{}")).await;
    let recovered = scope("recovered");
    acquire(&store, &request(&recovered, "{}")).await;
    let short = request(&scope("expired"), "{}").ttl(Duration::from_secs(1));
    let expired = acquire(&store, &short).await;
    store
        .complete(&expired, &response())
        .await
        .expect("complete");

    clock.advance(LEASE / 2);
    store.renew(&live, LEASE).await.expect("renew");
    clock.advance(LEASE / 2 + Duration::from_secs(1));
    // The lapsed attempt is taken over, and the new one completes.
    let second = acquire(&store, &request(&recovered, "{}")).await;
    assert_eq!(second.attempt, 2);
    store
        .complete(&second, &response())
        .await
        .expect("complete");
    // A fresh attempt, younger than the others.
    acquire(&store, &request(&scope("fresh"), "{}")).await;

    let cases = [
        (
            ListQuery::new(),
            vec!["live", "done", "too-large", "orphan", "recovered", "fresh"],
        ),
        (
            ListQuery::new().state(StateFilter::InProgress),
            vec!["live", "orphan", "fresh"],
        ),
        (
            ListQuery::new()
                .state(StateFilter::InProgress)
                .older_than(LEASE),
            vec!["live", "orphan"],
        ),
        (
            ListQuery::new().state(StateFilter::Completed),
            vec!["done", "too-large", "recovered"],
        ),
        (
            ListQuery::new().ambiguous(),
            vec!["too-large", "orphan", "recovered"],
        ),
        (
            ListQuery::new().ambiguous().state(StateFilter::Completed),
            vec!["too-large", "recovered"],
        ),
        (ListQuery::new().older_than(LEASE * 2), vec![]),
    ];
    for (query, expected) in cases {
        let (records, _) = list_all(&store, query.clone()).await;
        assert_eq!(keys_of(&records), sorted(&expected), "{query:?}");
    }

    let now = clock.now();
    let (records, _) = list_all(&store, ListQuery::new().ambiguous()).await;
    let reasons: HashMap<String, Option<Ambiguity>> = records
        .iter()
        .map(|r| (r.scope.key().as_str().to_owned(), r.ambiguity(now)))
        .collect();
    assert_eq!(reasons["too-large"], Some(Ambiguity::AnswerTooLarge));
    assert_eq!(reasons["orphan"], Some(Ambiguity::Orphaned));
    assert_eq!(reasons["recovered"], Some(Ambiguity::Takeover));
    // A listed record is the record `get` shows.
    for record in &records {
        assert_eq!(
            store.get(&record.scope).await.expect("get").as_ref(),
            Some(record)
        );
    }
}

/// Paging through small pages returns every matching record exactly once, whatever
/// the filter, and a page never holds more than the limit.
pub async fn list_pages_return_each_record_exactly_once<S: Store>(store: S, _clock: ManualClock) {
    let mut all = Vec::new();
    let mut completed = Vec::new();
    for i in 0..23 {
        let key = format!("page-{i:02}");
        let lease = acquire(&store, &request(&test_scope("/v1/pages", &key), "{}")).await;
        if i % 2 == 0 {
            store.complete(&lease, &response()).await.expect("complete");
            completed.push(key.clone());
        }
        all.push(key);
    }
    all.sort();
    completed.sort();
    for limit in [1, 5, 23, 100] {
        let (records, pages) = list_all(&store, ListQuery::new().with_limit(limit)).await;
        assert_eq!(keys_of(&records), all, "limit {limit}");
        if limit < 23 {
            assert!(pages.len() > 1, "23 records in pages of {limit}");
        }
        let (records, _) = list_all(
            &store,
            ListQuery::new()
                .state(StateFilter::Completed)
                .with_limit(limit),
        )
        .await;
        assert_eq!(keys_of(&records), completed, "completed, limit {limit}");
    }
}

/// However many records a caller asks for, a page holds at most [`MAX_LIST_LIMIT`];
/// paging on finds the rest. A cursor the store never handed out is refused.
pub async fn list_limit_is_bounded<S: Store>(store: S, _clock: ManualClock) {
    let count = MAX_LIST_LIMIT + 1;
    let tenant_scope = test_scope("/v1/bounded", "first");
    for i in 0..count {
        let scope = crate::Scope::from_parts(
            tenant_scope.tenant().clone(),
            tenant_scope.endpoint().cloned(),
            crate::Key::new(format!("bounded-{i:04}")).expect("key"),
        );
        acquire(&store, &request(&scope, "{}")).await;
    }
    let query = ListQuery::new().with_limit(usize::MAX);
    assert_eq!(query.limit(), MAX_LIST_LIMIT);
    let page = store.list(&query).await.expect("list");
    assert!(page.records.len() <= MAX_LIST_LIMIT);
    assert!(page.next.is_some(), "more records than one page holds");
    let (records, _) = list_all(&store, query).await;
    assert_eq!(records.len(), count);

    let foreign = ListCursor::from_parts(&["a", "b", "c", "d", "e"]);
    match store.list(&ListQuery::new().after(foreign)).await {
        Err(StoreError::InvalidCursor(_)) => {}
        other => panic!("a foreign cursor must be refused, got {other:?}"),
    }
}
