//! vmrun (drums): run one command, print what vmrun would, exit as it would.

use std::io::Write;

use drums_vmrun::{command, Error, EXIT_ERROR};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if matches!(
        args.first().map(String::as_str),
        Some("-h" | "--help" | "help")
    ) {
        println!("{}", command::USAGE);
        return;
    }
    match drums_vmrun::run(&args).await {
        Ok(out) => {
            print!("{}", out.stdout);
            let _ = std::io::stdout().flush();
            for w in out.warnings {
                eprintln!("vmrun: warning: {w}");
            }
        }
        Err(e) => {
            let usage = matches!(e, Error::Usage(_));
            // On stdout, as VMware's vmrun prints it: OSWorld's provider
            // reads only stdout, so this is where its log can show why.
            println!("Error: {}", drums_api::error_chain(&e));
            if usage {
                eprintln!("{}", command::USAGE);
            }
            let _ = std::io::stdout().flush();
            std::process::exit(EXIT_ERROR);
        }
    }
}
