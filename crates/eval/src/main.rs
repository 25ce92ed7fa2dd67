//! drums-eval (`drums eval`): parse the command line, run the evaluation.

use clap::Parser;
use drums_eval::cli::Cli;

fn main() {
    let cli = Cli::parse();
    // The evaluation drives many agents, daemons and a mock model at once:
    // it gets every core.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drums: start the async runtime: {e}");
            std::process::exit(drums_client::exit::INTERNAL);
        }
    };
    let code = match rt.block_on(drums_eval::cli::run(&cli.global, &cli.args)) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("drums: {}", f.message);
            f.code
        }
    };
    std::process::exit(code);
}
