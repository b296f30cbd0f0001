//! The `idem` binary: see `idem --help` and the crate README.

use std::io::Write;
use std::process::ExitCode;

use idem_gateway::cli::{Cli, Command, ServeArgs};
use idem_gateway::config::GatewayConfig;
use idem_gateway::serve::{Gateway, Mode, shutdown_signal};
use idem_gateway::tools::{completions, demo, keys, man};
use idem_gateway::{logging, store};

/// Every request allocates (headers, bodies; on keyed ones the fingerprint, the record
/// and the recorded answer too); mimalloc serves that faster than glibc's allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let logs = logging::init(cli.log_format, cli.log_buffer_lines);
    let code = run(cli, &logs).await;
    logs.finish();
    code
}

async fn run(cli: Cli, logs: &logging::Logs) -> ExitCode {
    if matches!(cli.command, Command::Serve(_) | Command::CheckConfig(_)) {
        warn_of_misspelt_env_vars();
    }
    match cli.command {
        Command::Serve(args) => {
            // The file is read once: what is served and what a reload is compared with.
            let (layered, config) = match GatewayConfig::resolve_layered(&args) {
                Ok(both) => both,
                Err(e) => {
                    eprintln!("idem: {e}");
                    return ExitCode::from(idem_gateway::exit::CONFIG);
                }
            };
            let mode = if args.passthrough {
                Mode::PassThrough
            } else {
                Mode::Idempotent
            };
            // Before binding: the proxy's default connection cap is derived from it.
            for warning in config.warnings().await {
                tracing::warn!("{warning}");
            }
            let open_files = idem_gateway::listener::raise_fd_limit();
            tracing::info!(open_file_limit = open_files, "open-file limit");
            let gateway = match Gateway::bind(&config, mode).await {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("idem: {e}");
                    return ExitCode::from(e.exit_code());
                }
            };
            // SIGHUP and POST /reload read the configuration file again.
            let gateway = gateway.reloadable((*args).clone(), layered);
            // Listened for before the gateway says it listens.
            let shutdown = shutdown_signal();
            // One line on standard output per listener, for scripts and tests that start
            // the gateway on port 0; queued like the log, so that a reader that went
            // away (`| head -1`) or stopped reading never stops the gateway.
            let scheme = |tls: bool| if tls { "https" } else { "http" };
            tracing::info!(
                listen = %gateway.local_addr(),
                tls = config.tls.is_some(),
                admin = gateway.admin_addr().map(|a| a.to_string()),
                "listening"
            );
            // The log is written by a thread of its own: the start's lines are out
            // before a script that waits for the listening line reads the log.
            logs.settle(std::time::Duration::from_millis(500)).await;
            logs.stdout_line(&format!(
                "idem listening on {}://{}",
                scheme(config.tls.is_some()),
                gateway.local_addr()
            ));
            if let Some(admin) = gateway.admin_addr() {
                logs.stdout_line(&format!(
                    "idem admin on {}://{admin}",
                    scheme(config.admin_tls.is_some())
                ));
            }
            gateway.run(shutdown).await;
            ExitCode::SUCCESS
        }
        Command::CheckConfig(args) => match &args.diff {
            Some(file) => check_diff(&args.serve, file).await,
            None => check(&args.serve).await,
        },
        Command::Keys(cmd) => keys::run(cmd).await,
        Command::Migrate(args) => idem_gateway::tools::migrate::run(args).await,
        Command::Demo(args) => idem_gateway::tools::demo_run::run(args).await,
        Command::Check(args) => idem_check::run(&args).await,
        Command::DemoUpstream { listen } => match demo::run(listen).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("idem: demo upstream on {listen}: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Completions { shell } => print(&completions::script(shell)),
        Command::Man { out_dir: None } => print(&man::idem_page()),
        Command::Man { out_dir: Some(dir) } => match man::write_pages(&dir) {
            Ok(pages) => {
                for page in pages {
                    println!("{}", page.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "idem: cannot write the manual pages into {}: {e}",
                    dir.display()
                );
                ExitCode::FAILURE
            }
        },
    }
}

/// Writes `bytes` to standard output; a reader that went away (`| head`) is an error
/// said once, not a panic.
fn print(bytes: &[u8]) -> ExitCode {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem: cannot write to standard output: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs each `IDEM_*` variable that is no setting but resembles one: it is ignored, and
/// the setting it was meant for keeps its default.
fn warn_of_misspelt_env_vars() {
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for (variable, setting) in idem_gateway::cli::misspelt_env_vars(names) {
        tracing::warn!(
            %variable,
            %setting,
            "an environment variable that is not a setting is ignored; did you mean {setting}?"
        );
    }
}

/// `check-config --diff FILE`: what a reload with FILE in place of the `--config` file
/// would change, setting by setting, and which of those changes take a restart.
async fn check_diff(args: &ServeArgs, file: &std::path::Path) -> ExitCode {
    let (before_args, before) = match GatewayConfig::resolve_layered(args) {
        Ok(both) => both,
        Err(e) => {
            eprintln!("idem: the configuration in force: {e}");
            return ExitCode::from(idem_gateway::exit::CONFIG);
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
            return ExitCode::from(idem_gateway::exit::CONFIG);
        }
    };
    for warning in after.warnings().await {
        eprintln!("idem: warning: {warning}");
    }
    let changes = idem_gateway::config::diff::diff(&before, &before_args, &after, &after_args);
    print!("{}", idem_gateway::config::diff::render(&changes));
    ExitCode::SUCCESS
}

async fn check(args: &ServeArgs) -> ExitCode {
    let (layered, config) = match GatewayConfig::resolve_layered(args) {
        Ok(both) => both,
        Err(e) => {
            eprintln!("idem: {e}");
            return ExitCode::from(idem_gateway::exit::CONFIG);
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
            return ExitCode::from(idem_gateway::exit::RUNTIME);
        }
    }
    for (listener, files) in [("proxy", &config.tls), ("admin", &config.admin_tls)] {
        if let Some(files) = files
            && let Err(e) = files.load()
        {
            eprintln!("idem: the {listener} listener's TLS: {e}");
            return ExitCode::from(idem_gateway::exit::RUNTIME);
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
