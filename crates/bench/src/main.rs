//! drums-bench (`drums bench`): parse the command line, run one bench.

use clap::Parser;
use drums_bench::args::Cli;

fn main() {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drums: start the async runtime: {e}");
            std::process::exit(drums_client::exit::INTERNAL);
        }
    };
    let code = match rt.block_on(drums_bench::run(&cli.global, &cli.command)) {
        Ok(code) => code,
        Err(f) => {
            eprintln!("drums: {}", f.message);
            f.code
        }
    };
    std::process::exit(code);
}
