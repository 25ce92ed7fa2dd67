//! drums-bench (`drums bench`): parse the command line, run one bench.

use clap::Parser;
use drums_bench::args::Cli;

fn main() {
    let cli = Cli::parse();
    drums_client::exit::run_main(false, drums_bench::run(&cli.global, &cli.command))
}
