//! `drums-guest --listen unix:/run/drums/guest.sock [--listen tcp:127.0.0.1:PORT]…`

use std::io::IsTerminal;
use std::process::ExitCode;

use drums_guest::{Listener, DEFAULT_SOCKET};

const USAGE: &str = "\
usage: drums-guest [--listen ADDR]...

The drums guest agent: serves the guest API inside a session.

options:
  --listen ADDR   where to listen, repeatable; unix:/PATH or tcp:IP:PORT
                  (default: unix:/run/drums/guest.sock)
  -h, --help      print this help
  -V, --version   print the version

logging goes to stderr; set RUST_LOG (e.g. RUST_LOG=debug) to change the level.";

fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Vec<Listener>>, String> {
    let mut listeners = Vec::new();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let value = match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("drums-guest {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--listen" => args.next().ok_or("--listen needs a value")?,
            _ => match arg.strip_prefix("--listen=") {
                Some(value) => value.to_owned(),
                None => return Err(format!("unknown argument {arg:?}")),
            },
        };
        listeners.push(value.parse::<Listener>().map_err(|e| e.to_string())?);
    }
    if listeners.is_empty() {
        listeners.push(Listener::Unix(DEFAULT_SOCKET.into()));
    }
    Ok(Some(listeners))
}

fn main() -> ExitCode {
    let listeners = match parse_args(std::env::args().skip(1)) {
        Ok(Some(listeners)) => listeners,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("drums-guest: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };

    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // stderr is normally a log file kept by init: no colour codes there.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();

    // One thread: the agent mostly waits on pipes and sockets, and every
    // session runs one, so memory matters more than parallelism. The blocking
    // pool (file I/O) is capped and its idle threads exit quickly.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(4)
        .thread_keep_alive(std::time::Duration::from_secs(2))
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("failed to start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(drums_guest::serve(listeners)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{}", drums_guest::error::chain(&e));
            ExitCode::FAILURE
        }
    }
}
