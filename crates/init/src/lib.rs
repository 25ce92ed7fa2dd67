//! The session's init: how a drums session comes to life, and its PID 1.
//!
//! drumsd starts `drums-init` on the host with a pipe on stdin and stdout and
//! writes one line of JSON, the [`InitConfig`]. Then:
//!
//! - **stage 0** (host namespaces) joins the session's cgroups, so every process
//!   of the session is accounted for from its first instruction, unshares the
//!   mount, UTS, IPC, net and PID namespaces, forks, reports the child's host pid
//!   ([`Report::Pid`]) and exits. drumsd is a child subreaper, so the child
//!   becomes drumsd's.
//! - **stage 1** (PID 1 of the new PID namespace) calls `setsid` (CRIU refuses a
//!   session leader outside the namespace), builds the root (overlay, /proc, /sys,
//!   a private /dev, /run, the drums binaries read-only), pivots into it and
//!   detaches the old root. Meanwhile drumsd configures the network namespace;
//!   stage 1 waits for its `go` line, reports [`Report::Ok`], closes every
//!   inherited fd, puts stdio on the session's own /dev/null and re-execs itself
//!   from inside the new root, so no mapping points into the host's file system.
//!   That exec, and stage 2's of the guest agent, run the session's copies
//!   of the programs, on the host's loader and libraries installed beside
//!   the binaries ([`loader`]): the image's libc may be older, musl, or absent.
//! - **stage 2** (`--stage2`) is the long-lived PID 1: it supervises the guest
//!   agent and reaps orphans. It logs to `/run/drums/init.log` inside the session,
//!   never to a host file (CRIU refuses to restore a growing host log).

pub mod capabilities;
pub mod config;
pub mod loader;
pub mod resolve;
pub mod root;
pub mod seccomp;
pub mod stage;

pub use config::{InitConfig, Report};

/// Where the drums binaries appear inside every session.
pub const BIN_DIR: &str = "/run/drums/bin";
/// The guest agent's socket inside every session.
pub const GUEST_SOCKET: &str = "/run/drums/guest.sock";
/// The init's log inside every session.
pub const INIT_LOG: &str = "/run/drums/init.log";

/// The search path of every program drums starts in a session.
pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The whole environment drums-init starts with, from drumsd and at each of
/// its own execs: nothing of drumsd's own environment may reach a session,
/// where its root reads `/proc/1/environ` and a checkpoint keeps it. drumsd
/// is often started by the CLI from a user's shell, so that environment
/// holds the user's secrets (`OPENAI_API_KEY` and the like) — exactly what
/// the sandbox keeps from the code it runs. An allow-list, not a deny-list:
/// a name drums did not choose never passes.
pub fn environment() -> [(&'static str, &'static str); 2] {
    [("PATH", PATH), loader::LIBRARY_PATH]
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("read init config from stdin")]
    ReadConfig(#[source] std::io::Error),
    #[error("parse init config")]
    ParseConfig(#[source] serde_json::Error),
    #[error(transparent)]
    Sys(#[from] drums_sys::SysError),
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{op}: {source}")]
    Nix {
        op: &'static str,
        #[source]
        source: nix::Error,
    },
    #[error(transparent)]
    Walk(#[from] resolve::WalkError),
    #[error(transparent)]
    Caps(#[from] capabilities::CapsError),
    #[error(transparent)]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("injected fault at {0}")]
    Injected(String),
    #[error("drumsd closed the control pipe before the network was ready")]
    Abandoned,
}

pub(crate) fn io(
    op: &'static str,
    path: impl AsRef<std::path::Path>,
) -> impl FnOnce(std::io::Error) -> InitError {
    let path = path.as_ref().display().to_string();
    move |source| InitError::Io { op, path, source }
}
