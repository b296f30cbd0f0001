//! The `idem` command: the command line parsed, the log started, and the command it
//! names run; the `idem` binary is [`main`] on a Tokio runtime.

use std::io::Write;
use std::process::ExitCode;

use crate::cli::{Cli, Command};
use crate::config::{GatewayConfig, ServeArgs};
use crate::exit;
use crate::logging::{self, Logs};
use crate::serve::{Gateway, Mode, shutdown_signal};
use crate::tools::{check_config, completions, demo, demo_run, keys, man, migrate};

/// Runs `idem` as the process's arguments say (`idem serve`, `idem check-config`,
/// `idem keys …`, `idem migrate`, `idem check`, `idem demo`, …; see `idem --help`) and
/// returns its exit status: 0 done, 1 a failure at run time, 2 a configuration wrong
/// as written (3: `idem check` found nothing at the API's URL). Arguments that do not
/// parse end the process with clap's message and status 2 (`--help` and `--version`
/// with 0).
///
/// Logs go to standard error, as `--log-format` and `IDEM_LOG` say, from the call until
/// it returns.
pub async fn main() -> ExitCode {
    let cli = Cli::parse_args();
    let logs = logging::init(cli.log_format, cli.log_buffer_lines);
    let code = run(cli, &logs).await;
    logs.finish();
    code
}

async fn run(cli: Cli, logs: &Logs) -> ExitCode {
    if matches!(cli.command, Command::Serve(_) | Command::CheckConfig(_)) {
        warn_of_misspelt_env_vars();
    }
    match cli.command {
        Command::Serve(args) => serve(&args, logs).await,
        Command::CheckConfig(args) => check_config::run(&args).await,
        Command::Keys(cmd) => keys::run(cmd).await,
        Command::Migrate(args) => migrate::run(args).await,
        Command::Demo(args) => demo_run::run(args).await,
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

/// `idem serve`: the gateway bound and run until SIGTERM or Ctrl-C, reloading its
/// configuration on SIGHUP and `POST /reload`.
async fn serve(args: &ServeArgs, logs: &Logs) -> ExitCode {
    // The file is read once: what is served and what a reload is compared with.
    let (layered, config) = match GatewayConfig::resolve_layered(args) {
        Ok(both) => both,
        Err(e) => {
            eprintln!("idem: {e}");
            return ExitCode::from(exit::CONFIG);
        }
    };
    let mode = if args.passthrough {
        Mode::PassThrough
    } else {
        Mode::Idempotent
    };
    // Before binding: the proxy's default connection cap is derived from it.
    for warning in config.warnings().await {
        tracing::warn!(target: "idem", "{warning}");
    }
    let open_files = crate::listener::raise_fd_limit();
    tracing::info!(target: "idem", open_file_limit = open_files, "open-file limit");
    let gateway = match Gateway::bind(&config, mode).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("idem: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    // SIGHUP and POST /reload read the configuration file again.
    let gateway = gateway.reloadable(args.clone(), layered);
    // Listened for before the gateway says it listens.
    let shutdown = shutdown_signal();
    // One line on standard output per listener, for scripts and tests that start
    // the gateway on port 0; queued like the log, so that a reader that went
    // away (`| head -1`) or stopped reading never stops the gateway.
    let scheme = |tls: bool| if tls { "https" } else { "http" };
    tracing::info!(
        target: "idem",
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
    for (variable, setting) in crate::cli::misspelt_env_vars(names) {
        tracing::warn!(
            target: "idem",
            %variable,
            %setting,
            "an environment variable that is not a setting is ignored; did you mean {setting}?"
        );
    }
}
