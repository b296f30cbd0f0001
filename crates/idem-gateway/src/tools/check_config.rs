//! `idem check-config`: the settings resolved as `idem serve` would, the store pinged,
//! the listen addresses bound and the TLS files loaded, without serving; or, with
//! `--diff FILE`, what a reload with FILE would change.

use std::process::ExitCode;

use crate::cli::CheckConfigArgs;
use crate::config::{GatewayConfig, ServeArgs};
use crate::exit;
use crate::store;

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
    let store_state = match store::check(&config.store, &config.store_options).await {
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
