//! The statements PostgreSQL and SQLite spell alike (SQL's `ON CONFLICT`, partial
//! indexes, sub-selects with a `LIMIT`), which their [`SqlDatabase`](crate::SqlDatabase)
//! implementations share.

pub(crate) fn insert_if_absent(insert: &str, key: &str) -> String {
    format!("{insert} ON CONFLICT ({key}) DO NOTHING")
}

pub(crate) fn upsert(insert: &str, key: &str, columns: &[&str]) -> String {
    let set: Vec<String> = columns
        .iter()
        .map(|c| format!("{c} = excluded.{c}"))
        .collect();
    format!(
        "{insert} ON CONFLICT ({key}) DO UPDATE SET {}",
        set.join(", ")
    )
}

pub(crate) fn delete_limited(table: &str, key: &str, filter: &str, limit: &str) -> String {
    let columns = key.trim_start_matches('(').trim_end_matches(')');
    format!(
        "DELETE FROM {table} WHERE {key} IN (SELECT {columns} FROM {table} \
         WHERE {filter} LIMIT {limit})"
    )
}

pub(crate) fn create_index(name: &str, table: &str, columns: &str, filter: Option<&str>) -> String {
    let index = format!("CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns})");
    match filter {
        Some(filter) => format!("{index} WHERE {filter}"),
        None => index,
    }
}
