//! drumsd's command line and its defaults.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use drums_session::ManagerConfig;

#[derive(Debug, Parser)]
#[command(
    name = "drumsd",
    version,
    about = "The drums daemon: owns sessions and serves the API"
)]
pub struct Cli {
    #[command(flatten)]
    pub daemon: DaemonArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Manage images without a running daemon.
    #[command(subcommand)]
    Image(ImageCommand),
}

#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build an image with debootstrap (cached: a no-op when it is up to date).
    Build {
        #[arg(default_value = "default")]
        name: String,
        /// Debian mirror; default: the one in this machine's apt sources.
        #[arg(long)]
        mirror: Option<String>,
    },
}

#[derive(Debug, Clone, Args)]
pub struct DaemonArgs {
    /// Where drums keeps its catalog, store and sessions.
    #[arg(
        long,
        env = "DRUMS_STATE_DIR",
        default_value = "/var/lib/drums",
        global = true
    )]
    pub state_dir: PathBuf,
    /// The API socket; default STATE_DIR/drumsd.sock.
    #[arg(long, env = "DRUMS_SOCKET", global = true)]
    pub socket: Option<PathBuf>,
    /// Where images live; default STATE_DIR/images.
    #[arg(long, env = "DRUMS_IMAGES_DIR", global = true)]
    pub images_dir: Option<PathBuf>,
    /// Where drums-init and drums-guest are; default: next to drumsd.
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// The host bridge sessions attach to.
    #[arg(long, default_value = "drums0")]
    pub bridge: String,
    /// The sessions' network, CIDR; the bridge takes the first address.
    #[arg(long, default_value = "10.213.0.0/16")]
    pub subnet: String,
    /// A port drums serves to sessions on the bridge address, as tcp:PORT or
    /// udp:PORT (repeatable). The firewall drops every other connection a
    /// session opens to the host; none by default. See docs/security.md.
    #[arg(long = "bridge-service", value_name = "PROTO:PORT")]
    pub bridge_services: Vec<drums_net::Service>,
    /// Parent cgroup of every session's cgroup.
    #[arg(long, default_value = "drums")]
    pub cgroup_parent: String,
    /// Size of the sparse btrfs store image, in GiB, when the state directory is
    /// not on btrfs.
    #[arg(long, default_value_t = 64)]
    pub store_gib: u64,
    /// Seconds a new session may take to answer before create fails.
    #[arg(long, default_value_t = 20)]
    pub ready_timeout: u64,
    /// Test-only: serve POST /v1/debug/faults.
    #[arg(long)]
    pub enable_fault_injection: bool,
    /// Turn on KSM (host-wide) while drumsd runs, so identical pages of
    /// sessions, above all restored siblings, are stored once; the previous
    /// settings come back when drumsd stops. See docs/desktop.md.
    #[arg(long)]
    pub ksm: bool,
}

impl DaemonArgs {
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.state_dir.join("drumsd.sock"))
    }

    pub fn images_dir(&self) -> PathBuf {
        self.images_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("images"))
    }

    pub fn manager_config(&self) -> anyhow::Result<ManagerConfig> {
        let (subnet, prefix) = parse_cidr(&self.subnet)?;
        let bin_src = match &self.bin_dir {
            Some(d) => d.clone(),
            None => std::env::current_exe()
                .context("find drumsd's own path")?
                .parent()
                .map(PathBuf::from)
                .context("drumsd's path has no parent")?,
        };
        if self.bridge.is_empty() || self.bridge.len() > 15 {
            bail!("bridge name {:?} must be 1 to 15 characters", self.bridge);
        }
        Ok(ManagerConfig {
            state_dir: self.state_dir.clone(),
            images_dir: self.images_dir(),
            bin_src,
            bridge: self.bridge.clone(),
            subnet,
            prefix,
            bridge_services: self.bridge_services.clone(),
            cgroup_parent: self.cgroup_parent.clone(),
            store_size: self.store_gib << 30,
            fault_injection: self.enable_fault_injection,
            ready_timeout: Duration::from_secs(self.ready_timeout),
        })
    }
}

fn parse_cidr(s: &str) -> anyhow::Result<(Ipv4Addr, u8)> {
    let (a, p) = s
        .split_once('/')
        .with_context(|| format!("subnet {s:?} is not in CIDR form like 10.213.0.0/16"))?;
    let addr: Ipv4Addr = a.parse().with_context(|| format!("subnet address {a:?}"))?;
    let prefix: u8 = p.parse().with_context(|| format!("subnet prefix {p:?}"))?;
    if !(8..=29).contains(&prefix) {
        bail!("subnet prefix /{prefix} must be between /8 and /29");
    }
    let mask = u32::MAX << (32 - prefix);
    if u32::from(addr) & !mask != 0 {
        bail!(
            "subnet {s} has host bits set; use {}/{prefix}",
            Ipv4Addr::from(u32::from(addr) & mask)
        );
    }
    Ok((addr, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_services_are_empty_by_default_and_checked() {
        let cli = Cli::try_parse_from(["drumsd"]).unwrap();
        assert!(cli.daemon.bridge_services.is_empty());
        let cli = Cli::try_parse_from([
            "drumsd",
            "--bridge-service",
            "tcp:8080",
            "--bridge-service",
            "udp:53",
        ])
        .unwrap();
        let got: Vec<String> = cli
            .daemon
            .bridge_services
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["tcp:8080", "udp:53"]);
        let e = Cli::try_parse_from(["drumsd", "--bridge-service", "tcp:0"]).unwrap_err();
        assert!(e.to_string().contains("invalid service \"tcp:0\""), "{e}");
    }

    #[test]
    fn cidr() {
        assert_eq!(
            parse_cidr("10.213.0.0/16").unwrap(),
            (Ipv4Addr::new(10, 213, 0, 0), 16)
        );
        assert!(parse_cidr("10.213.0.1/16")
            .unwrap_err()
            .to_string()
            .contains("host bits"));
        assert!(parse_cidr("10.213.0.0").is_err());
        assert!(parse_cidr("10.213.0.0/31").is_err());
    }
}
