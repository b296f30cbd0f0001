//! [`Store::list`](crate::Store::list) for the memory store: every shard read under its
//! lock in turn, in the SQL stores' order (tenant, endpoint, key), so that a cursor is
//! the last listed scope's parts.

use crate::{ListPage, ListQuery, Record, Result, Scope};

use super::{MemoryStore, lock};

/// A scope's place in the listing order, as the SQL stores' primary key sorts it.
fn sort_key(scope: &Scope) -> (&str, &str, &str) {
    (
        scope.tenant().as_str(),
        scope.endpoint_str(),
        scope.key().as_str(),
    )
}

impl MemoryStore {
    /// One page of the listing: one pass over the records held, which the store's
    /// bound on entries bounds.
    pub(super) fn list_page(&self, query: &ListQuery) -> Result<ListPage> {
        let now = self.clock.now();
        let after = query.after.as_ref().map(|c| c.parts(3)).transpose()?;
        let after = after
            .as_ref()
            .map(|p| (p[0].as_str(), p[1].as_str(), p[2].as_str()));
        let limit = query.limit();
        let mut records: Vec<Record> = Vec::new();
        for shard in self.shards.shards.iter() {
            let inner = lock(shard);
            records.extend(
                inner
                    .records
                    .values()
                    .filter(|r| after.is_none_or(|a| sort_key(&r.scope) > a))
                    .filter(|r| query.matches(r, now))
                    .cloned(),
            );
        }
        records.sort_unstable_by(|a, b| sort_key(&a.scope).cmp(&sort_key(&b.scope)));
        let more = records.len() > limit;
        records.truncate(limit);
        Ok(ListPage::in_scope_order(records, more, query, now))
    }
}
