//! The `idem` binary: see `idem --help` and the crate README.

use std::process::ExitCode;

use clap::Parser;
use idem_gateway::cli::{Cli, Command};
use idem_gateway::config::GatewayConfig;
use idem_gateway::serve::{Gateway, Mode, shutdown_signal};
use idem_gateway::{demo, keys, logging};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => {
            let config = match GatewayConfig::resolve(&args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("idem: {e}");
                    return ExitCode::from(2);
                }
            };
            let mode = if args.passthrough {
                Mode::PassThrough
            } else {
                Mode::Idempotent
            };
            let gateway = match Gateway::bind(&config, mode).await {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("idem: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // One line on standard output per listener, for scripts and tests that start
            // the gateway on port 0.
            println!("idem listening on http://{}", gateway.local_addr());
            if let Some(admin) = gateway.admin_addr() {
                println!("idem admin on http://{admin}");
            }
            gateway.run(shutdown_signal()).await;
            ExitCode::SUCCESS
        }
        Command::Keys(cmd) => keys::run(cmd).await,
        Command::DemoUpstream { listen } => match demo::run(listen).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("idem: demo upstream on {listen}: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
