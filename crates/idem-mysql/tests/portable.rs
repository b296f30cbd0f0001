//! The migration stays within what MySQL 8.0/8.4 and MariaDB 10.6+ both accept (the
//! guide's page on their differences): its index is declared inside
//! `CREATE TABLE IF NOT EXISTS`, never by `CREATE INDEX IF NOT EXISTS` (MariaDB's only);
//! no `RETURNING` or `JSON` column; every table names its engine. Reads the statements
//! only: MySQL itself is not on the test machines.

#[test]
fn the_migration_uses_only_what_mysql_and_mariadb_both_accept() {
    let statements = idem_mysql::schema::migration_statements("idem_records", 0).unwrap();
    assert!(statements.len() >= 4, "{statements:#?}");
    for statement in &statements {
        let upper = statement.to_ascii_uppercase();
        assert!(
            upper.starts_with("CREATE TABLE IF NOT EXISTS ") || upper.starts_with("INSERT INTO "),
            "{statement}"
        );
        for refused in ["CREATE INDEX", "RETURNING", " JSON"] {
            assert!(!upper.contains(refused), "{refused} in {statement}");
        }
        if upper.starts_with("CREATE TABLE") {
            assert!(upper.contains("ENGINE=INNODB"), "{statement}");
        }
    }
}
