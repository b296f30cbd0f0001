//! [`Namespace`]: the one rule for the names a store puts its records under.

use std::fmt;
use std::sync::Arc;

/// The namespace of a store that is given none: the SQL stores keep their records in
/// `idem_records`, the Redis store under keys that start `idem:`.
pub const DEFAULT_NAMESPACE: &str = "idem";

/// The longest namespace, in bytes: PostgreSQL keeps 63 bytes of an identifier and
/// silently cuts longer ones, so two long names could end up one table.
pub const MAX_NAMESPACE_LEN: usize = 63;

/// Prefixes the SQL engines keep for themselves: SQLite refuses to create a table
/// starting `sqlite_`, and PostgreSQL looks up a name starting `pg_` in its catalog
/// first, where one of its own may shadow the store's.
const RESERVED_PREFIXES: &[&str] = &["pg_", "sqlite_"];

/// The tables the SQL stores record their schema versions in (SQLite's, then
/// PostgreSQL's): records kept under either name would overwrite the bookkeeping.
const RESERVED_NAMES: &[&str] = &["idem_schema_versions", "idem_schema_migrations"];

/// A name under which a store keeps its records: a table of a SQL store (the SQLite and
/// PostgreSQL stores and inboxes) or the start of a Redis store's keys.
///
/// One rule for every store, so that a name that works on one works on the others: 1
/// to [`MAX_NAMESPACE_LEN`] ASCII letters, digits and underscores, not starting with a
/// digit, with neither of the SQL engines' reserved prefixes (`pg_`, `sqlite_`, in any
/// case) and not the name of a store's schema table. The name is spliced into SQL as it
/// is, unquoted, which is safe because nothing else is admitted; both SQL engines
/// compare such names without regard to case, so `Orders` and `orders` name one table
/// there (and two key prefixes in Redis).
///
/// A store that derives more names from it (an index, a second table) checks them with
/// [`suffixed`](Self::suffixed), by the same rule.
///
/// # Examples
///
/// ```
/// use idem_core::Namespace;
///
/// let orders = Namespace::new("orders").unwrap();
/// assert_eq!(orders.suffixed("_records").unwrap().as_str(), "orders_records");
/// assert!(Namespace::new("orders; DROP TABLE x").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace(Arc<str>);

/// A name that is not a [`Namespace`], and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct NamespaceError {
    name: String,
    /// What a store added to a valid namespace, if this name is one it derived.
    suffix: Option<String>,
    reason: Reason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Characters,
    Length,
    ReservedPrefix(&'static str),
    ReservedName,
}

impl NamespaceError {
    /// The name refused, as given (with the suffix, for a derived one).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn message(&self) -> String {
        let name = &self.name;
        match (self.reason, &self.suffix) {
            (Reason::Length, Some(suffix)) => format!(
                "{:?} is too long a namespace here: with {suffix:?} after it, the name \
                 {name:?} has {} bytes, and at most {MAX_NAMESPACE_LEN} fit",
                &name[..name.len() - suffix.len()],
                name.len()
            ),
            (Reason::Length, None) => format!(
                "a namespace has at most {MAX_NAMESPACE_LEN} bytes; {name:?} has {}",
                name.len()
            ),
            (Reason::Characters, _) => format!(
                "{name:?} is not a namespace: use ASCII letters, digits and underscores, \
                 starting with a letter or an underscore"
            ),
            (Reason::ReservedPrefix(prefix), _) => format!(
                "{name:?} is not a namespace: names starting {prefix:?} are the SQL \
                 engines' own"
            ),
            (Reason::ReservedName, _) => {
                format!("{name:?} is not a namespace: it is the name of a store's schema table")
            }
        }
    }
}

impl Namespace {
    /// The namespace `name`, if the rule admits it.
    pub fn new(name: &str) -> Result<Namespace, NamespaceError> {
        check(name, None)?;
        Ok(Namespace(name.into()))
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// This name with `suffix` after it (`orders` + `_records`), for a store that
    /// derives a table or index name from its namespace; refused by the same rule,
    /// which in practice means when it grows too long.
    pub fn suffixed(&self, suffix: &str) -> Result<Namespace, NamespaceError> {
        let name = format!("{}{suffix}", self.0);
        check(&name, Some(suffix))?;
        Ok(Namespace(name.into()))
    }
}

fn check(name: &str, suffix: Option<&str>) -> Result<(), NamespaceError> {
    let refuse = |reason| NamespaceError {
        name: name.to_owned(),
        suffix: suffix.map(str::to_owned),
        reason,
    };
    let mut chars = name.chars();
    let starts_well = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !starts_well || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(refuse(Reason::Characters));
    }
    if name.len() > MAX_NAMESPACE_LEN {
        return Err(refuse(Reason::Length));
    }
    let lower = name.to_ascii_lowercase();
    if let Some(prefix) = RESERVED_PREFIXES.iter().find(|p| lower.starts_with(**p)) {
        return Err(refuse(Reason::ReservedPrefix(prefix)));
    }
    if RESERVED_NAMES.contains(&lower.as_str()) {
        return Err(refuse(Reason::ReservedName));
    }
    Ok(())
}

impl Default for Namespace {
    fn default() -> Namespace {
        Namespace(DEFAULT_NAMESPACE.into())
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Namespace {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Namespace {
    type Err = NamespaceError;

    fn from_str(name: &str) -> Result<Namespace, NamespaceError> {
        Namespace::new(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name the four former rules (SQLite table, PostgreSQL table, inbox table,
    /// gateway namespace) admitted that is safe on every store is admitted.
    #[test]
    fn plain_identifiers_are_namespaces() {
        for ok in [
            "idem",
            "idem_records",
            "idem_records_case_0a1b2c3d7",
            "payments_v2",
            "_staging",
            "_t",
            "_x9",
            "a",
            "t",
            "Records2",
            "Inbox2",
            "Payments",
            &"a".repeat(MAX_NAMESPACE_LEN),
        ] {
            let ns = Namespace::new(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            assert_eq!(ns.as_str(), ok);
            assert_eq!(ns.to_string(), ok);
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_reason() {
        for bad in [
            "",
            "9lives",
            "1records",
            "pay-ments",
            "idem-records",
            "a b",
            "idem records",
            "a:b",
            "sch.tbl",
            "schema.table",
            "idem;drop",
            "t; DROP TABLE x",
            "\"quoted\"",
            "tablé",
        ] {
            let e = Namespace::new(bad).unwrap_err();
            assert!(e.to_string().contains("is not a namespace"), "{bad:?}: {e}");
            assert_eq!(e.name(), bad);
        }
        for reserved in ["pg_records", "PG_x", "sqlite_master", "SQLITE_x"] {
            let e = Namespace::new(reserved).unwrap_err();
            assert!(e.to_string().contains("the SQL engines' own"), "{e}");
        }
        for reserved in ["idem_schema_versions", "idem_schema_migrations"] {
            let e = Namespace::new(reserved).unwrap_err();
            assert!(e.to_string().contains("schema table"), "{e}");
        }
        let e = Namespace::new(&"n".repeat(MAX_NAMESPACE_LEN + 1)).unwrap_err();
        assert!(e.to_string().contains("at most 63 bytes"), "{e}");
    }

    #[test]
    fn a_derived_name_keeps_to_the_same_rule() {
        let ns = Namespace::new("orders").unwrap();
        assert_eq!(ns.suffixed("_records").unwrap().as_str(), "orders_records");
        // 55 bytes and an 8-byte suffix fit; 56 do not.
        let fits = Namespace::new(&"n".repeat(55)).unwrap();
        assert_eq!(fits.suffixed("_records").unwrap().as_str().len(), 63);
        let long = Namespace::new(&"n".repeat(56)).unwrap();
        let e = long.suffixed("_records").unwrap_err();
        let message = e.to_string();
        assert!(
            message.contains(&format!("{:?} is too long", "n".repeat(56))),
            "{message}"
        );
        assert!(message.contains("has 64 bytes"), "{message}");
        assert!(ns.suffixed("-x").is_err());
    }

    #[test]
    fn the_default_is_idem() {
        assert_eq!(Namespace::default().as_str(), DEFAULT_NAMESPACE);
        assert_eq!("orders".parse::<Namespace>().unwrap().as_str(), "orders");
    }
}
