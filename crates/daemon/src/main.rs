//! drumsd: parse the command line, start tracing, run.

use clap::Parser;
use drums_api::error_chain;
use drums_daemon::{config::ImageCommand, Cli, Command};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let failed = match cli.command {
        None => drums_daemon::run(cli.daemon)
            .await
            .err()
            .map(|e| error_chain(&e)),
        Some(Command::Image(ImageCommand::Build { name, mirror })) => {
            drums_daemon::server::build_image(&cli.daemon, &name, mirror)
                .err()
                .map(|e| error_chain(&e))
        }
    };
    if let Some(why) = failed {
        eprintln!("drumsd: {why}");
        std::process::exit(1);
    }
}
