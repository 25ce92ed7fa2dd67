//! A client of drumsd, as `drums`, `vmrun` and the benches share it: the
//! connection options, finding drumsd and starting one when none answers
//! ([`connect`]), the exit codes failures map to ([`exit`]), a streamed
//! exec ([`exec`]) and the tables people read ([`table`]).

use std::path::PathBuf;

use clap::Args;

pub mod connect;
pub mod exec;
pub mod exit;
pub mod table;

pub use exit::Failure;

/// How a client finds drumsd: flags, then `DRUMS_STATE_DIR`, `DRUMS_SOCKET`
/// and `DRUMS_NO_AUTOSTART`.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// drumsd's state directory (used to find and, if needed, start the daemon).
    #[arg(
        long,
        env = "DRUMS_STATE_DIR",
        default_value = "/var/lib/drums",
        global = true
    )]
    pub state_dir: PathBuf,
    /// drumsd's socket; default STATE_DIR/drumsd.sock.
    #[arg(long, env = "DRUMS_SOCKET", global = true)]
    pub socket: Option<PathBuf>,
    /// Never start a daemon; fail if none answers. The variable takes what
    /// the Python SDK takes: 1, true, yes or on (0, false, no, off: autostart).
    #[arg(
        long,
        env = "DRUMS_NO_AUTOSTART",
        global = true,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub no_autostart: bool,
}

/// Parse "512M", "1G", "1048576" (one parser for the CLI, vmrun and drumsd's config).
pub use drums_api::parse_size;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1M").is_err());
        for bad in ["0", "nan", "inf", "18446744073709551616", "1e30G"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }
}
