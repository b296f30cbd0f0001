//! `idem migrate`: brings a SQL store's schema to this build's version, or with
//! `--dry-run` prints the SQL that would, writing nothing; for teams whose database
//! administrators own the schema and run the gateway with `--no-migrate`.

use std::process::ExitCode;

use idem_core::{MigrationPlan, Schema};

use crate::cli::MigrateArgs;
use crate::exit;
use crate::store::{self, OpenError, StoreOptions};

/// Runs `idem migrate`; prints to standard output and returns the exit code.
pub(crate) async fn run(args: MigrateArgs) -> ExitCode {
    match migrate(&args).await {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err((code, e)) => {
            eprintln!("idem migrate: {e}");
            ExitCode::from(code)
        }
    }
}

/// What the command prints, or its exit status and error.
async fn migrate(args: &MigrateArgs) -> Result<String, (u8, String)> {
    let url = args.store.url();
    let namespace = args.store.namespace();
    let options = StoreOptions {
        namespace: namespace.map_err(|e| (exit::CONFIG, format!("--store-namespace: {e}")))?,
        ..StoreOptions::default()
    };
    let failed = |e: OpenError| (exit::of_open(&e), e.to_string());
    let shown = store::redact(url.trim());
    let Some(plan) = store::plan(url, options.clone()).await.map_err(failed)? else {
        let kind = store::kind(url).unwrap_or("store");
        return Ok(format!(
            "the {kind} store at {shown} keeps no schema: nothing to migrate\n"
        ));
    };
    if plan.to < plan.from.unwrap_or(0) {
        return Err((
            exit::RUNTIME,
            format!(
                "table {} at {shown} has schema version {}, newer than this build's {}: \
                 run the newer build's `idem migrate`, or this build's gateway will not \
                 open it",
                plan.table,
                plan.from.unwrap_or(0),
                plan.to
            ),
        ));
    }
    if plan.is_current() {
        return Ok(format!(
            "table {} at {shown} is at schema version {}: nothing to migrate\n",
            plan.table, plan.to
        ));
    }
    if args.dry_run {
        return Ok(dry_run(&plan, url, &shown));
    }
    let opened = StoreOptions {
        schema: Schema::Migrate,
        ..options
    };
    let store = store::open_with(url, opened).await.map_err(failed)?;
    store.close().await;
    Ok(format!(
        "migrated table {} at {shown} from schema version {} to {}\n",
        plan.table,
        version_name(plan.from),
        plan.to
    ))
}

/// The plan as a SQL script, one transaction, with a comment saying what it is for.
fn dry_run(plan: &MigrationPlan, url: &str, shown: &str) -> String {
    let begin = match store::kind(url) {
        // The write lock up front, as the store takes it.
        Some("sqlite") => "BEGIN IMMEDIATE;",
        _ => "BEGIN;",
    };
    let mut script = format!(
        "-- idem migrate --dry-run: table {} at {shown}, schema version {} to {}.\n\
         -- Nothing was written. Run this as one transaction, or run `idem migrate`.\n\
         {begin}\n",
        plan.table,
        version_name(plan.from),
        plan.to
    );
    for statement in &plan.statements {
        script.push_str(statement.trim().trim_end_matches(';'));
        script.push_str(";\n");
    }
    script.push_str("COMMIT;\n");
    script
}

fn version_name(version: Option<u32>) -> String {
    version.map_or_else(|| "none (no table yet)".to_owned(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dry_run_is_one_transaction_of_every_statement() {
        let plan = MigrationPlan {
            table: "idem_records".into(),
            from: None,
            to: 2,
            statements: vec![
                "CREATE TABLE a (x INT)".into(),
                "CREATE INDEX b ON a (x);".into(),
            ],
        };
        let script = dry_run(&plan, "sqlite://idem.db", "sqlite://idem.db");
        let lines: Vec<&str> = script.lines().collect();
        assert!(
            lines[0].starts_with("-- idem migrate --dry-run: table idem_records"),
            "{script}"
        );
        assert!(lines[0].contains("none (no table yet) to 2"), "{script}");
        assert_eq!(
            lines[2..],
            [
                "BEGIN IMMEDIATE;",
                "CREATE TABLE a (x INT);",
                "CREATE INDEX b ON a (x);",
                "COMMIT;"
            ]
        );
    }
}
