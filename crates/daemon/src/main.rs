//! drumsd: parse the command line, start tracing, run.

use clap::Parser;
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
    let result = match cli.command {
        None => drums_daemon::run(cli.daemon).await,
        Some(Command::Image(ImageCommand::Build { name, mirror })) => {
            drums_daemon::server::build_image(&cli.daemon, &name, mirror)
        }
    };
    if let Err(e) = result {
        eprintln!("drumsd: {e:#}");
        std::process::exit(1);
    }
}
