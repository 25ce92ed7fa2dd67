//! `drums-guest --listen unix:/run/drums/guest.sock [--listen tcp:127.0.0.1:PORT]…`

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use drums_guest::{HygieneConfig, Listener, SessionApi, DEFAULT_SOCKET};

const USAGE: &str = "\
usage: drums-guest [--listen ADDR]... [--etc-dir DIR] [--run-dir DIR]
                   [--session-api-port PORT]

The drums guest agent: serves the guest API inside a session.

options:
  --listen ADDR    where to listen, repeatable; unix:/PATH or tcp:IP:PORT
                   (default: unix:/run/drums/guest.sock)
  --etc-dir DIR    where /v1/hygiene rewrites hostname, hosts and machine-id
                   (default: /etc; other values are for tests)
  --run-dir DIR    where the generation file and the reseed directory are
                   (default: /run/drums; other values are for tests)
  --session-api-port PORT
                   drumsd's session API on the default gateway, where
                   /v1/versions and /v1/rollback go (given by drums-init;
                   without it they answer 501)
  -h, --help       print this help
  -V, --version    print the version

logging goes to stderr; set RUST_LOG (e.g. RUST_LOG=debug) to change the level.";

struct Options {
    listeners: Vec<Listener>,
    hygiene: HygieneConfig,
    session_api: SessionApi,
}

/// The error is the usage message the agent prints before it exits: text
/// for the operator, with no source to keep.
fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut listeners = Vec::new();
    let mut hygiene = HygieneConfig::default();
    let mut session_api = SessionApi::default();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let (name, value) = match arg.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "-V" | "--version" => {
                println!("drums-guest {}", env!("CARGO_PKG_VERSION"));
                return Ok(None);
            }
            "--listen" | "--etc-dir" | "--run-dir" | "--session-api-port" => {
                let value = args.next().ok_or_else(|| format!("{arg} needs a value"))?;
                (arg.clone(), value)
            }
            _ => match arg.split_once('=') {
                Some((
                    name @ ("--listen" | "--etc-dir" | "--run-dir" | "--session-api-port"),
                    value,
                )) => (name.to_owned(), value.to_owned()),
                _ => return Err(format!("unknown argument {arg:?}")),
            },
        };
        match name.as_str() {
            "--listen" => listeners.push(value.parse::<Listener>().map_err(|e| e.to_string())?),
            "--etc-dir" => hygiene.etc_dir = absolute_dir(&name, &value)?,
            "--session-api-port" => {
                let port = value
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| {
                        format!("{name} must be a port from 1 to 65535, got {value:?}")
                    })?;
                session_api.port = Some(port);
            }
            _ => hygiene.run_dir = absolute_dir(&name, &value)?,
        }
    }
    if listeners.is_empty() {
        listeners.push(Listener::Unix(DEFAULT_SOCKET.into()));
    }
    Ok(Some(Options {
        listeners,
        hygiene,
        session_api,
    }))
}

/// The agent's cwd is whatever init gave it, so a relative directory would
/// mean something different from what the caller saw. (A usage message, as
/// [`parse_args`]'s.)
fn absolute_dir(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.starts_with('/') {
        Ok(value.into())
    } else {
        Err(format!("{name} must be an absolute path, got {value:?}"))
    }
}

/// What drums-init sets for the guest's own loader inside a session
/// (`drums_init::loader::LIBRARY_PATH`): the host's libraries, which the
/// session's commands must never inherit.
const DRUMS_LIBRARY_PATH: (&str, &str) = ("LD_LIBRARY_PATH", "/run/drums/bin/lib");

fn main() -> ExitCode {
    // First, while there is one thread: every command has a clean
    // environment already, and this keeps any later child from inheriting it.
    let (var, libs) = DRUMS_LIBRARY_PATH;
    if std::env::var_os(var).is_some_and(|v| v == libs) {
        std::env::remove_var(var);
    }
    let options = match parse_args(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
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

    match drums_guest::server::serve_blocking(
        options.listeners,
        options.hygiene,
        options.session_api,
    ) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{}", drums_guest::error::lowercase_chain(&e));
            ExitCode::FAILURE
        }
    }
}
