//! `idem check-config`: the settings resolved as `idem serve` would, the store pinged,
//! the listen addresses bound and the TLS files loaded, without serving; or, with
//! `--diff FILE`, what a reload with FILE would change.

use std::process::ExitCode;

use crate::cli::CheckConfigArgs;
use crate::config::{GatewayConfig, ServeArgs};
use crate::exit;
use crate::store::{self, OpenError, StoreOptions};

/// Runs `idem check-config`; prints to standard output and returns the exit code.
pub(crate) async fn run(args: &CheckConfigArgs) -> ExitCode {
    match &args.diff {
        Some(file) => check_diff(&args.serve, file).await,
        None => check(&args.serve).await,
    }
}

/// `check-config --diff FILE`: what a reload with FILE in place of the `--config` file
/// would change, setting by setting, and which of those changes take a restart.
async fn check_diff(args: &ServeArgs, file: &std::path::Path) -> ExitCode {
    let (before_args, before) = match GatewayConfig::resolve_layered(args) {
        Ok(both) => both,
        Err(e) => {
            eprintln!("idem: the configuration in force: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    let mut next = args.clone();
    next.config = Some(file.to_owned());
    let (after_args, after) = match GatewayConfig::resolve_layered(&next) {
        Ok(both) => both,
        Err(e) => {
            eprintln!(
                "idem: {}: {e}; a reload with it would be refused",
                file.display()
            );
            return ExitCode::from(exit::CONFIG);
        }
    };
    for warning in after.warnings().await {
        eprintln!("idem: warning: {warning}");
    }
    let changes = crate::config::diff::diff(&before, &before_args, &after, &after_args);
    print!("{}", crate::config::diff::render(&changes));
    ExitCode::SUCCESS
}

async fn check(args: &ServeArgs) -> ExitCode {
    let (layered, config) = match GatewayConfig::resolve_layered(args) {
        Ok(both) => both,
        Err(e) => {
            eprintln!("idem: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    let store_state = match store_state(&config.store, &config.store_options).await {
        Ok(state) => state,
        Err((code, e)) => {
            eprintln!("idem: {e}");
            return ExitCode::from(code);
        }
    };
    for (listener, addr) in [("listen", Some(config.listen)), ("admin", config.admin)] {
        if let Some(addr) = addr
            && let Err(e) = std::net::TcpListener::bind(addr)
        {
            eprintln!("idem: {listener} {addr} cannot be bound: {e}");
            return ExitCode::from(exit::RUNTIME);
        }
    }
    for (listener, files) in [("proxy", &config.tls), ("admin", &config.admin_tls)] {
        if let Some(files) = files
            && let Err(e) = files.load()
        {
            eprintln!("idem: the {listener} listener's TLS: {e}");
            return ExitCode::from(exit::RUNTIME);
        }
    }
    for warning in config.warnings().await {
        eprintln!("idem: warning: {warning}");
    }
    println!(
        "# idem check-config: the store is {store_state}; the listen address{} can be \
         bound{}.",
        if config.admin.is_some() { "es" } else { "" },
        if config.tls.is_some() || config.admin_tls.is_some() {
            "; the TLS files are usable"
        } else {
            ""
        }
    );
    println!(
        "# Every setting as resolved from the command line, the IDEM_* variables, the \
         --config file and the defaults, in the file's form:"
    );
    print!("{}", config.to_toml(&layered));
    println!("# ok");
    ExitCode::SUCCESS
}

/// What `idem check-config` finds of the store `url` names, writing nothing (no file,
/// no table, no migration, no `-wal` left behind): a sentence for its report, or the
/// exit status and the error. A SQLite file that is not there yet is fine when its
/// directory is (`serve` creates it); a store without this build's schema is fine
/// unless `options` say not to migrate.
async fn store_state(url: &str, options: &StoreOptions) -> Result<String, (u8, OpenError)> {
    let url = url.trim();
    let migrates = options.schema == idem_core::Schema::Migrate;
    if store::kind(url) == Some("sqlite") {
        let path = url
            .split_once("://")
            .map_or("", |(_, rest)| rest)
            .split('?')
            .next()
            .unwrap_or_default();
        let path = std::path::Path::new(path);
        if !path.exists() && migrates {
            let dir = match path.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => std::path::Path::new("."),
            };
            if !dir.is_dir() {
                return Err((
                    exit::CONFIG,
                    OpenError::failed(
                        "sqlite",
                        url,
                        format!("the directory {} does not exist", dir.display()),
                    ),
                ));
            }
            return Ok("not there yet: serve creates it".to_owned());
        }
    }
    let inspect = StoreOptions {
        schema: idem_core::Schema::Existing,
        ..options.clone()
    };
    let store = match store::open_with(url, inspect).await {
        Ok(store) => store,
        Err(OpenError::NoSchema { .. }) if migrates => {
            return Ok("reachable; serve creates its table".to_owned());
        }
        Err(e @ OpenError::Failed { .. }) if migrates && e.to_string().contains("idem migrate") => {
            return Ok("reachable; serve migrates its schema".to_owned());
        }
        // Wrong as written, like the settings; else a failure to reach or use it.
        Err(e) => return Err((exit::of_open(&e), e)),
    };
    let pinged = store.ping().await;
    store.close().await;
    match pinged {
        Ok(()) => Ok("reachable".to_owned()),
        Err(e) => {
            let kind = store::kind(url).unwrap_or("store");
            Err((exit::RUNTIME, OpenError::unreachable(kind, url, e)))
        }
    }
}
