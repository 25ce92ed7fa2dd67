//! drums-eval (`drums eval`): parse the command line, run the evaluation.

use clap::Parser;
use drums_eval::cli::Cli;

fn main() {
    let cli = Cli::parse();
    // The evaluation drives many agents, daemons and a mock model at once:
    // it gets every core.
    drums_client::exit::run_main(true, drums_eval::cli::run(&cli.global, &cli.args))
}
