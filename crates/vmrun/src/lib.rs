//! `vmrun` for drums: the subset of VMware's vmrun that OSWorld's `vmware`
//! provider calls, so `DesktopEnv(provider_name="vmware", path_to_vm=X.vmx)`
//! resets its desktop by a drums restore instead of a VM snapshot revert.
//!
//! A `.vmx` path names a small drums session spec ([`vmx`]); each command
//! ([`command`]) becomes a few drumsd API calls ([`ops`]); the `.vmx` paths of
//! running sessions, which drumsd does not know, are kept in a [`registry`].
//! See docs/vmrun.md.

pub mod command;
pub mod ops;
pub mod registry;
pub mod vmx;

use std::path::PathBuf;

use clap::Parser;
use drums_client::{Failure, Global};

use command::{Command, UsageError};
use ops::{At, Ctx, OpError, Outcome, Vm};
use registry::Registry;
use vmx::{Spec, VmxError};

/// vmrun exits 255 on any error, and scripts written for it test for that.
pub const EXIT_ERROR: i32 = 255;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// clap's message, first line only: its help text is about `drums`.
    #[error("drums options: {0}")]
    Options(String),
    #[error("{at}: cannot open VM")]
    Vmx {
        at: At,
        #[source]
        source: VmxError,
    },
    #[error("{at}: resolve the path")]
    Path {
        at: At,
        #[source]
        source: std::io::Error,
    },
    #[error("connect to drumsd")]
    Connect(#[source] Failure),
    #[error(transparent)]
    Op(#[from] OpError),
}

/// drums' connection options, read by clap exactly as `drums` reads them
/// (flags, then `DRUMS_STATE_DIR`, `DRUMS_SOCKET`, `DRUMS_NO_AUTOSTART`).
#[derive(Debug, Parser)]
#[command(name = "vmrun", no_binary_name = true)]
struct DrumsOptions {
    #[command(flatten)]
    global: Global,
}

fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_owned()
}

/// Run one vmrun command line (without the program name).
pub async fn run(args: &[String]) -> Result<Outcome, Error> {
    let inv = command::parse(args)?;
    let global = DrumsOptions::try_parse_from(&inv.drums_args)
        .map_err(|e| Error::Options(clap_message(&e)))?
        .global;
    let at = At {
        verb: inv.command.verb(),
        vmx: inv.command.vmx().cloned(),
    };
    // The spec is read before connecting: a bad .vmx must not start a daemon.
    let vm = match inv.command.vmx() {
        Some(p) => {
            let spec = Spec::load(p).map_err(|source| Error::Vmx {
                at: at.clone(),
                source,
            })?;
            let vmx = ops::normalize(p).map_err(|source| Error::Path {
                at: at.clone(),
                source,
            })?;
            Some((spec, vmx))
        }
        None => None,
    };
    let registry = Registry::new(Registry::default_path(
        &global.state_dir,
        std::env::var_os(registry::ENV).map(PathBuf::from),
    ));
    let client = drums_client::connect::client(&global)
        .await
        .map_err(Error::Connect)?;
    let ctx = Ctx { client, registry };
    let vm = vm.as_ref().map(|(spec, vmx)| Vm {
        at: at.clone(),
        vmx: vmx.clone(),
        spec,
    });
    let vm = || vm.as_ref().expect("every command but list names a .vmx");
    Ok(match &inv.command {
        Command::List => ops::list(&ctx).await?,
        Command::Start { .. } => ops::start(&ctx, vm()).await?,
        Command::GetGuestIpAddress { wait, .. } => ops::guest_ip(&ctx, vm(), *wait).await?,
        Command::Snapshot { name, .. } => ops::snapshot(&ctx, vm(), name).await?,
        Command::RevertToSnapshot { name, .. } => ops::revert(&ctx, vm(), name).await?,
        Command::Stop { .. } => ops::stop(&ctx, vm()).await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drums_options_reach_the_cli_global() {
        let g = DrumsOptions::try_parse_from([
            "--socket",
            "/t/s.sock",
            "--state-dir=/t/state",
            "--no-autostart",
        ])
        .unwrap()
        .global;
        assert_eq!(g.socket.as_deref(), Some(std::path::Path::new("/t/s.sock")));
        assert_eq!(g.state_dir, std::path::Path::new("/t/state"));
        assert!(g.no_autostart);
        let e = DrumsOptions::try_parse_from(["--socket"]).unwrap_err();
        assert!(
            !clap_message(&e).starts_with("error:"),
            "{}",
            clap_message(&e)
        );
    }
}
