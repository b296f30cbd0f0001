//! The command line: `idem serve`, `idem check-config`, `idem check`, `idem keys
//! show|purge`, `idem demo`, `idem demo-upstream`, `idem completions SHELL` and `idem man`.
//!
//! Every `serve` option ([`ServeArgs`]) is also read from an `IDEM_*` environment
//! variable and from the TOML file given by `--config`. The command line wins over the
//! environment, which wins over the file, which wins over the defaults (see
//! [`crate::config`]).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

pub(crate) use crate::config::ServeArgs;
use crate::config::{TENANT_SECRET_ENV, TenantSecret};
pub(crate) use crate::logging::LogFormat;
use crate::store::Namespace;

/// What `idem --version` shows after the name: the crate's version and, where the build
/// knew it, the commit (`0.1.0 (1a2b3c4d5)`, `-dirty` after it when the tree had
/// changes). The commit comes from `IDEM_BUILD_COMMIT` at build time, else from the
/// packaged crate's record of the commit it was packaged from, else from git in a
/// checkout; without any, the version stands alone.
pub(crate) const VERSION: &str = env!("IDEM_VERSION");

/// `idem`: idempotency keys for any HTTP API.
#[derive(Debug, Parser)]
#[command(name = "idem", version = VERSION, about, propagate_version = true)]
pub(crate) struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,

    /// Log format on standard error.
    #[arg(
        long,
        env = "IDEM_LOG_FORMAT",
        global = true,
        value_enum,
        default_value = "text"
    )]
    pub(crate) log_format: LogFormat,

    /// Log lines held for standard error while its reader is behind; past them, lines
    /// are dropped and counted in `idem_log_lines_dropped_total` rather than stall
    /// serving.
    #[arg(
        long,
        env = "IDEM_LOG_BUFFER_LINES",
        global = true,
        value_name = "N",
        default_value_t = crate::logging::DEFAULT_BUFFER_LINES,
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1_048_576)
    )]
    pub(crate) log_buffer_lines: usize,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the gateway in front of an upstream HTTP API.
    Serve(Box<ServeArgs>),
    /// Check a configuration without serving: resolve the settings (flags, IDEM_*
    /// variables, --config), open the store and ping it, print the result.
    CheckConfig(Box<CheckConfigArgs>),
    /// Inspect or delete stored idempotency records.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Bring a SQL store's schema to this build's version (what `serve` does at start
    /// unless --no-migrate), or print the SQL that would with --dry-run.
    Migrate(MigrateArgs),
    /// Show what the gateway prevents: the same payments, under the same faults, sent to a
    /// naive demo API straight and through `idem serve`, charges counted side by side.
    Demo(crate::tools::demo_run::DemoArgs),
    /// Check whether an API's Idempotency-Key support holds: replays, concurrent
    /// duplicates, lost answers, payload mismatches, keys, tenants. It creates real
    /// resources: point it at staging.
    Check(Box<idem_check::CheckArgs>),
    /// Run a naive demo payments API (no idempotency of its own) to try the gateway on.
    DemoUpstream {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:3000")]
        listen: std::net::SocketAddr,
    },
    /// Print a completion script for a shell on standard output, e.g.
    /// `idem completions bash > /usr/share/bash-completion/completions/idem`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page idem(1) on standard output (`idem man | man -l -`), or
    /// write a page for every command into a directory.
    Man {
        /// Write idem.1, idem-serve.1, … into this directory (made if missing) and list
        /// them, instead of printing idem(1).
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
}

/// `idem check-config`: the serve settings to check, and what to compare them with.
#[derive(Debug, Args, Clone)]
pub(crate) struct CheckConfigArgs {
    /// Print what a reload (SIGHUP, POST /reload) with FILE in place of the --config
    /// file would change, setting by setting, and which changes take a restart; the
    /// store is not opened.
    #[arg(long, value_name = "FILE")]
    pub(crate) diff: Option<PathBuf>,
    /// The settings, as `idem serve` takes them.
    #[command(flatten)]
    pub(crate) serve: ServeArgs,
}

/// `idem migrate`.
#[derive(Debug, Args, Clone)]
pub(crate) struct MigrateArgs {
    /// The store, as the gateway names it.
    #[command(flatten)]
    pub(crate) store: StoreArgs,

    /// Print the SQL the migration would run, as one transaction, and write nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// The store an operator's command opens (`keys`, `migrate`): the gateway's `--store`
/// and `--store-namespace`, from the same variables.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct StoreArgs {
    /// Record store URL [default: sqlite://idem.db].
    #[arg(long, env = "IDEM_STORE", value_name = "URL", hide_env_values = true)]
    pub(crate) store: Option<String>,

    /// The gateway's --store-namespace [default: idem].
    #[arg(long, env = "IDEM_STORE_NAMESPACE", value_name = "NAME")]
    pub(crate) store_namespace: Option<String>,
}

impl StoreArgs {
    /// The store's URL: the one given, else the gateway's default.
    pub(crate) fn url(&self) -> &str {
        self.store
            .as_deref()
            .unwrap_or(crate::config::DEFAULT_STORE)
    }

    /// The namespace given, checked; `None` for the stores' own.
    pub(crate) fn namespace(&self) -> Result<Option<Namespace>, idem_core::NamespaceError> {
        self.store_namespace
            .as_deref()
            .map(Namespace::new)
            .transpose()
    }
}

/// `idem keys …`.
#[derive(Debug, Subcommand)]
pub(crate) enum KeysCommand {
    /// Print the record of one key as JSON.
    Show(KeyTarget),
    /// Delete one key's record, or with --expired every expired record.
    Purge(PurgeArgs),
    /// List records as JSON lines: in progress for too long, ambiguous, or all.
    List(ListArgs),
}

/// `idem keys list`: records that have not expired, one JSON object per line (scope
/// digest, key, tenant, endpoint, state, attempt, times, status, ambiguity reason).
#[derive(Debug, Args, Clone)]
pub(crate) struct ListArgs {
    /// Only records in this state: `in_progress` or `completed`.
    #[arg(long, value_name = "STATE")]
    pub(crate) state: Option<String>,

    /// Only records created at least this long ago (`90s`, `5m`, `1h`).
    #[arg(long, value_name = "DURATION")]
    pub(crate) older_than: Option<String>,

    /// Only records whose outcome the gateway could not know: taken over after a
    /// lapsed lease, in progress with a lapsed lease, or recorded after the upstream or
    /// handler failed mid-way.
    #[arg(long)]
    pub(crate) ambiguous: bool,

    /// The most records to print; where to resume is then printed to standard error.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) limit: usize,

    /// Resume after this cursor (as printed when a previous run stopped at --limit).
    #[arg(long, value_name = "CURSOR")]
    pub(crate) after: Option<String>,

    /// The store, as the gateway names it.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

/// Which record: a key and the scope it lives in.
#[derive(Debug, Args, Clone)]
pub(crate) struct KeyTarget {
    /// The key, as the client sent it (quoted or bare).
    pub(crate) key: String,

    /// The tenant as stored: `anonymous` or `hmac-sha256:<hex>` (see
    /// --tenant-credential-env).
    #[arg(long, value_name = "T")]
    pub(crate) tenant: Option<String>,

    /// How the gateway names tenants, to name one from its credentials.
    #[command(flatten)]
    pub(crate) tenants: TenantArgs,

    /// The endpoint in public scope mode, `METHOD /path/or/{template}`; leave out in
    /// internal mode.
    #[arg(long, value_name = "E")]
    pub(crate) endpoint: Option<String>,

    /// The store, as the gateway names it.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

/// `idem keys purge`.
#[derive(Debug, Args, Clone)]
pub(crate) struct PurgeArgs {
    /// The key to delete (quoted or bare); leave out with --expired.
    #[arg(required_unless_present = "expired")]
    pub(crate) key: Option<String>,

    /// Delete every expired record, in bounded batches.
    #[arg(long, conflicts_with = "key")]
    pub(crate) expired: bool,

    /// The tenant as stored (see `keys show`).
    #[arg(long, value_name = "T")]
    pub(crate) tenant: Option<String>,

    /// How the gateway names tenants, to name one from its credentials.
    #[command(flatten)]
    pub(crate) tenants: TenantArgs,

    /// The endpoint in public scope mode, `METHOD /path`.
    #[arg(long, value_name = "E")]
    pub(crate) endpoint: Option<String>,

    /// The store, as the gateway names it.
    #[command(flatten)]
    pub(crate) store: StoreArgs,
}

/// How `idem keys` names a tenant from its credentials, as the gateway does: the same
/// tenant headers and secret as `idem serve`.
#[derive(Debug, Args, Clone, Default)]
pub(crate) struct TenantArgs {
    /// Names of environment variables holding the tenant's credentials: one per tenant
    /// header, in the order of --tenant-header (the Authorization value, say). Keeps
    /// the credentials off the command line.
    #[arg(
        long,
        value_name = "VAR,…",
        value_delimiter = ',',
        conflicts_with = "tenant"
    )]
    pub(crate) tenant_credential_env: Option<Vec<String>>,

    /// The gateway's --tenant-header [default: Authorization].
    #[arg(
        long,
        env = "IDEM_TENANT_HEADER",
        value_name = "LIST",
        value_delimiter = ','
    )]
    pub(crate) tenant_header: Option<Vec<String>>,

    /// The gateway's --tenant-secret-file; IDEM_TENANT_SECRET may hold the secret
    /// instead [default: the secret the store keeps].
    #[arg(long, env = "IDEM_TENANT_SECRET_FILE", value_name = "PATH")]
    pub(crate) tenant_secret_file: Option<PathBuf>,

    /// The secret itself, from `IDEM_TENANT_SECRET` only.
    #[arg(skip = TenantSecret::from_env())]
    pub(crate) tenant_secret: Option<TenantSecret>,
}

impl Cli {
    /// Parses the process's arguments, exiting with clap's message (status 2) when they
    /// are wrong. Every subcommand's `--version` prints what `idem --version` does,
    /// not clap's `idem-serve 0.1.0`.
    pub(crate) fn parse_args() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let matches = named_idem(Cli::command()).get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// `cmd` with each subcommand, at every depth, shown under the name `idem`.
fn named_idem(cmd: clap::Command) -> clap::Command {
    cmd.mut_subcommands(|sub| named_idem(sub.display_name("idem")))
}

/// `IDEM_*` environment variables that are no setting but look like a misspelt one,
/// each with the setting it resembles: `IDEM_STORE_URL` (for `IDEM_STORE`),
/// `IDEM_TTL_SECS`, `IDEM_LEASES`. Such a variable is otherwise ignored, and the
/// gateway would start on a default (`IDEM_STORE_URL=postgres://…` would leave it on
/// its own SQLite file, executing duplicates that reach another gateway). Variables of
/// other tools that merely start with `IDEM_` are not listed.
pub(crate) fn misspelt_env_vars(names: impl IntoIterator<Item = String>) -> Vec<(String, String)> {
    use clap::CommandFactory;
    let cli = Cli::command();
    let serve = cli
        .find_subcommand("serve")
        .expect("the serve command")
        .get_arguments();
    let mut known: Vec<String> = cli
        .get_arguments()
        .chain(serve)
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect();
    // Read by the log filter, not by clap; the secret is read apart from the flags.
    known.push("IDEM_LOG".to_owned());
    known.push(TENANT_SECRET_ENV.to_owned());
    names
        .into_iter()
        .filter(|name| name.starts_with("IDEM_") && !known.contains(name))
        .filter_map(|name| {
            let like = known.iter().find(|k| {
                name.strip_prefix(k.as_str())
                    .is_some_and(|rest| rest.starts_with('_'))
                    || strsim::levenshtein(&name, k) <= 2
            })?;
            Some((name, like.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn serve_flags_parse_with_their_issue_names() {
        let cli = Cli::try_parse_from([
            "idem",
            "serve",
            "--upstream",
            "http://127.0.0.1:3000",
            "--listen",
            "127.0.0.1:9000",
            "--store",
            "memory://",
            "--admin",
            "9091",
            "--require-key",
            "--ttl",
            "2h",
            "--lease",
            "500ms",
            "--upstream-timeout",
            "5s",
            "--body-limit",
            "64KiB",
            "--tenant-header",
            "X-Api-Key,Stripe-Account",
            "--require-tenant",
            "--tenant-secret-file",
            "/run/secrets/idem-tenant",
            "--scope",
            "internal",
            "--keyed-methods",
            "POST,PUT",
            "--release-statuses",
            "409,503",
            "--path-normalization",
            "rfc3986,trailing-slash",
        ])
        .unwrap();
        let Command::Serve(args) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(args.upstream.as_deref(), Some("http://127.0.0.1:3000"));
        assert!(args.require_key);
        assert_eq!(args.ttl, Some(Duration::from_secs(7200)));
        assert_eq!(args.lease, Some(Duration::from_millis(500)));
        assert_eq!(args.upstream_timeout, Some(Duration::from_secs(5)));
        assert_eq!(args.body_limit, Some(64 * 1024));
        assert_eq!(args.scope, Some(idem_core::ScopeMode::Internal));
        assert_eq!(
            args.tenant_header,
            Some(vec!["X-Api-Key".to_owned(), "Stripe-Account".to_owned()])
        );
        assert!(args.require_tenant);
        assert_eq!(
            args.tenant_secret_file.as_deref(),
            Some(std::path::Path::new("/run/secrets/idem-tenant"))
        );
        assert_eq!(
            args.keyed_methods,
            Some(vec!["POST".to_owned(), "PUT".to_owned()])
        );
        assert_eq!(
            args.release_statuses,
            Some(vec!["409".to_owned(), "503".to_owned()])
        );
        assert_eq!(
            args.path_normalization,
            Some(vec!["rfc3986".to_owned(), "trailing-slash".to_owned()])
        );
    }

    #[test]
    fn misspelt_settings_in_the_environment_are_found() {
        let names = [
            "IDEM_STORE_URL",
            "IDEM_TTL_SECONDS",
            "IDEM_LEASES",
            "IDEM_UPSTRAEM",
            "IDEM_LOG_LEVEL",
            // Settings, and other tools' variables: not listed.
            "IDEM_STORE",
            "IDEM_STORE_POOL",
            "IDEM_LOG",
            "IDEM_LOG_FORMAT",
            "IDEM_TENANT_SECRET",
            "IDEM_TENANT_SECRET_FILE",
            "IDEM_REQUIRE_TENANT",
            "IDEM_TEST_POSTGRES_URL",
            "IDEM_REQUIRE_SERVICES",
            "IDEM_LOAD_ONLY",
            "IDEM_INBOX_CONSUMER",
            "IDEM_RACE_TENANT",
            "IDEM_BENCH_SECS",
            "PATH",
        ];
        let found = misspelt_env_vars(names.map(String::from));
        let found: Vec<(&str, &str)> = found
            .iter()
            .map(|(n, k)| (n.as_str(), k.as_str()))
            .collect();
        assert_eq!(
            found,
            [
                ("IDEM_STORE_URL", "IDEM_STORE"),
                ("IDEM_TTL_SECONDS", "IDEM_TTL"),
                ("IDEM_LEASES", "IDEM_LEASE"),
                ("IDEM_UPSTRAEM", "IDEM_UPSTREAM"),
                ("IDEM_LOG_LEVEL", "IDEM_LOG"),
            ]
        );
    }

    #[test]
    fn bad_duration_is_rejected_with_examples() {
        let err = Cli::try_parse_from(["idem", "serve", "--ttl", "soon"]).unwrap_err();
        assert!(err.to_string().contains("24h"), "{err}");
    }

    #[test]
    fn purge_needs_a_key_or_expired() {
        assert!(Cli::try_parse_from(["idem", "keys", "purge"]).is_err());
        assert!(Cli::try_parse_from(["idem", "keys", "purge", "--expired"]).is_ok());
        assert!(Cli::try_parse_from(["idem", "keys", "purge", "k1"]).is_ok());
        assert!(Cli::try_parse_from(["idem", "keys", "purge", "k1", "--expired"]).is_err());
    }
}
