//! drumsd's command line and its defaults.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use drums_session::ManagerConfig;

/// drumsd's command line, where clap cannot check it: the values that
/// depend on each other or on this host.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("subnet {0:?} is not in CIDR form like 10.213.0.0/16")]
    NotCidr(String),
    #[error("subnet address {address:?}")]
    SubnetAddress {
        address: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("subnet prefix {prefix:?}")]
    SubnetPrefix {
        prefix: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("subnet prefix /{0} must be between /8 and /29")]
    PrefixRange(u8),
    #[error("subnet {subnet} has host bits set; use {network}/{prefix}")]
    HostBits {
        subnet: String,
        network: Ipv4Addr,
        prefix: u8,
    },
    #[error("find drumsd's own path")]
    OwnPath(#[source] std::io::Error),
    #[error("drumsd's path has no parent")]
    NoParent,
    #[error("bridge name {0:?} must be 1 to 15 characters")]
    BridgeName(String),
    #[error("--recovery-backoff {first} is over --recovery-backoff-max {max}")]
    Backoff { first: u64, max: u64 },
    #[error("--reissue-command-timeout and --reissue-timeout must be at least 1 second")]
    ReissueTimeout,
    #[error("--llm-proxy-local {value:?}: expected ADDR:PORT or off")]
    LlmProxyLocal {
        value: String,
        #[source]
        source: std::net::AddrParseError,
    },
}

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
    /// The TCP port of drumsd's session API on the bridge address, through
    /// which a process inside a session lists and rolls back its own
    /// session's versions (the agent's rollback tool, docs/agent-tool.md);
    /// added to the bridge services. 0 turns it off.
    #[arg(long, default_value_t = drums_api::SESSION_API_PORT, value_name = "PORT")]
    pub session_api_port: u16,
    /// An upstream of the coordinator's LLM proxy, STYLE=URL, STYLE one of
    /// openai (chat completions, responses) and anthropic (messages), URL
    /// http:// or https:// with an optional path prefix (repeatable). See
    /// docs/coordinator.md.
    #[arg(long = "llm-upstream", value_name = "STYLE=URL")]
    pub llm_upstreams: Vec<String>,
    /// The TCP port of the LLM proxy on the bridge address, for agents inside
    /// sessions; added to the bridge services. 0 turns it off there.
    #[arg(long, default_value_t = drums_api::LLM_PROXY_PORT, value_name = "PORT")]
    pub llm_proxy_port: u16,
    /// Where the LLM proxy listens for agents on this host: ADDR:PORT, or
    /// `off`.
    #[arg(long, default_value = "127.0.0.1:7080", value_name = "ADDR:PORT|off")]
    pub llm_proxy_local: String,
    /// The most bytes of request bodies being read and answers being kept
    /// for the exchange log that one session (or, without one, one address)
    /// may hold in the LLM proxy at once, over all its connections: SIZE. A
    /// request that would pass it is refused (429 `over_budget`); an answer
    /// that would is passed on but not logged.
    #[arg(long, default_value = "128M", value_parser = parse_budget_arg, value_name = "SIZE")]
    pub llm_proxy_session_memory: u64,
    /// Seconds a request's body may take to reach the LLM proxy after its
    /// headers; a slower one is cut off (408 `too_slow`).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600), value_name = "SECS")]
    pub llm_proxy_body_timeout: u64,
    /// The most rows one session's exchange log (the LLM proxy's journal)
    /// may hold. Past it, what no rollback or recovery can reach any more is
    /// pruned; if that is not enough, the session's new model calls are
    /// refused (429 `journal_full`). Also the number of request records kept
    /// per session.
    #[arg(long, default_value_t = drums_coordinator::DEFAULT_JOURNAL_ROWS, value_parser = clap::value_parser!(u64).range(1..), value_name = "N")]
    pub llm_journal_rows: u64,
    /// The most bytes (answers' bodies and headers) one session's exchange
    /// log may hold: SIZE, as for --llm-journal-rows.
    #[arg(long, default_value = "256M", value_parser = parse_budget_arg, value_name = "SIZE")]
    pub llm_journal_bytes: u64,
    /// A name server for sessions with `--egress nat` (repeatable, IPv4):
    /// written to their /etc/resolv.conf, and the only private address they
    /// may reach, on port 53. Default: the IPv4 name servers of this host's
    /// /etc/resolv.conf that sessions can reach (not loopback).
    #[arg(long = "dns", value_name = "ADDR")]
    pub dns: Vec<std::net::Ipv4Addr>,
    /// What the end of each turn the LLM proxy sees takes: `selective` (as
    /// the inspector's class says), `full` (files and processes every
    /// turn), `files` (files only, every turn) or `off` (nothing). See
    /// docs/engine.md; `drums eval` runs one drumsd per policy.
    #[arg(long, default_value = "selective", value_name = "POLICY")]
    pub turn_policy: drums_api::Policy,
    /// Parent cgroup of every session's cgroup.
    #[arg(long, default_value = "drums")]
    pub cgroup_parent: String,
    /// Size of the sparse btrfs store image, in GiB, when the state directory is
    /// not on btrfs.
    #[arg(long, default_value_t = 64)]
    pub store_gib: u64,
    /// Bytes of the store kept from sessions for drumsd's own writes (subvolume
    /// creates, snapshots, deletes): SIZE; default 10% of the store, at least
    /// 256M. All sessions and checkpoints together stop (EDQUOT) at the rest.
    #[arg(long, value_parser = parse_size_arg)]
    pub store_reserve: Option<u64>,
    /// Memory limit of a session whose request names none: SIZE, or "none".
    #[arg(long, default_value = "4G", value_parser = parse_memory_arg)]
    pub default_memory: Limit<u64>,
    /// Task (process and thread) limit of a session whose request names none, or
    /// "none".
    #[arg(long, default_value = "2048", value_parser = parse_pids_arg)]
    pub default_pids: Limit<u64>,
    /// CPU limit, in CPUs, of a session whose request names none, or "none";
    /// default 2, or the host's CPU count if it has fewer.
    #[arg(long, value_parser = parse_cpus_arg)]
    pub default_cpus: Option<Limit<f64>>,
    /// Disk quota of a session whose request names none: SIZE, or "none";
    /// default 10G, or what the store holds for sessions if that is less.
    #[arg(long, value_parser = parse_disk_arg)]
    pub default_disk: Option<Limit<u64>>,
    /// Memory all sessions together may use (the cgroup parent's limit): SIZE,
    /// or "none"; default 75% of the host's RAM.
    #[arg(long, value_parser = parse_memory_arg)]
    pub sessions_memory: Option<Limit<u64>>,
    /// Tasks all sessions together may run (the cgroup parent's pids.max), or
    /// "none"; default 75% of the host's pid_max or threads-max, whichever is
    /// smaller.
    #[arg(long, value_parser = parse_pids_arg)]
    pub sessions_pids: Option<Limit<u64>>,
    /// Seconds a new session may take to answer before create fails.
    #[arg(long, default_value_t = 20)]
    pub ready_timeout: u64,
    /// Seconds one logged command of an agent outside its session may take
    /// when it runs again after a recovery (and a re-issued command, to give
    /// its caller's output again); past it, that re-issue fails. See
    /// docs/coordinator.md.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub reissue_command_timeout: u64,
    /// Seconds all of one recovery's commands may take together.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    pub reissue_timeout: u64,
    /// The most output (SIZE) a command may produce when it runs again after
    /// a recovery, or a re-issue may compare with what its caller had; over
    /// it, that re-issue fails.
    #[arg(long, value_parser = parse_size_arg, default_value = "16M", value_name = "SIZE")]
    pub reissue_output_max: u64,
    /// Seconds the coordinator's watch waits before recovering a session a
    /// second time in a row; doubled for each next one, up to
    /// --recovery-backoff-max. 0 turns the backoff off.
    #[arg(long, default_value_t = 1, value_name = "SECONDS")]
    pub recovery_backoff: u64,
    /// The longest wait between two recoveries of one session.
    #[arg(long, default_value_t = 60, value_name = "SECONDS")]
    pub recovery_backoff_max: u64,
    /// Self rollbacks (the session API's POST /v1/self/rollback) one session
    /// may ask for per minute; more are answered 429 with a Retry-After.
    #[arg(long, default_value_t = 6, value_name = "N")]
    pub self_rollbacks_per_minute: u32,
    /// Versions one session's turn ends (its model calls through the proxy)
    /// may take per minute; a turn end past it takes none, and the next
    /// version taken is whole.
    #[arg(long, default_value_t = 60, value_name = "N")]
    pub turn_versions_per_minute: u32,
    /// Checkpoint dumps that may run at once, host-wide (the engine's
    /// workers, docs/engine.md "The scheduler"). 0: half the cores, at
    /// least one.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub checkpoint_workers: usize,
    /// The most sessions drumsd holds at once, warm pools' members included
    /// (docs/pools.md); a create, restore or pool refill past it is refused
    /// with 409. 0: no limit but the subnet's addresses and the caps.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub max_sessions: u64,
    /// Test-only: serve POST /v1/debug/faults.
    #[arg(long)]
    pub enable_fault_injection: bool,
    /// The only registries `drums pull` may reach (`host[:port]`, comma
    /// separated); any by default. A pull from another is refused before
    /// any connection.
    #[arg(long, value_delimiter = ',')]
    pub allowed_registries: Option<Vec<String>>,
    /// The most one image layer may unpack to (SIZE); a pull or import with
    /// a bigger one is refused. Also the most a layer blob may be.
    #[arg(long, value_parser = parse_size_arg, default_value = "32G")]
    pub image_layer_max: u64,
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

    pub fn manager_config(&self) -> Result<ManagerConfig, ConfigError> {
        let (subnet, prefix) = parse_cidr(&self.subnet)?;
        let bin_src = match &self.bin_dir {
            Some(d) => d.clone(),
            None => std::env::current_exe()
                .map_err(ConfigError::OwnPath)?
                .parent()
                .map(PathBuf::from)
                .ok_or(ConfigError::NoParent)?,
        };
        if self.bridge.is_empty() || self.bridge.len() > 15 {
            return Err(ConfigError::BridgeName(self.bridge.clone()));
        }
        Ok(ManagerConfig {
            state_dir: self.state_dir.clone(),
            images_dir: self.images_dir(),
            bin_src,
            bridge: self.bridge.clone(),
            subnet,
            prefix,
            bridge_services: self.services(),
            session_api_port: self.session_api(),
            nameservers: if self.dns.is_empty() {
                host_nameservers(&std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default())
            } else {
                self.dns.clone()
            },
            cgroup_parent: self.cgroup_parent.clone(),
            store_size: self.store_gib << 30,
            store_reserve: self.store_reserve,
            default_limits: self.default_limits(),
            sessions_caps: self.sessions_caps(),
            fault_injection: self.enable_fault_injection,
            allowed_registries: self.allowed_registries.clone(),
            image_layer_max: self.image_layer_max,
            ready_timeout: Duration::from_secs(self.ready_timeout),
            turn_versions_per_minute: self.turn_versions_per_minute,
            checkpoint_workers: (self.checkpoint_workers > 0).then_some(self.checkpoint_workers),
            max_sessions: (self.max_sessions > 0).then_some(self.max_sessions),
        })
    }
}

impl DaemonArgs {
    /// What one session may make the coordinator do.
    pub fn coordinator_limits(&self) -> Result<drums_coordinator::Limits, ConfigError> {
        if self.recovery_backoff > self.recovery_backoff_max {
            return Err(ConfigError::Backoff {
                first: self.recovery_backoff,
                max: self.recovery_backoff_max,
            });
        }
        if self.reissue_command_timeout == 0 || self.reissue_timeout == 0 {
            return Err(ConfigError::ReissueTimeout);
        }
        Ok(drums_coordinator::Limits {
            reissue_command: Duration::from_secs(self.reissue_command_timeout),
            reissue_total: Duration::from_secs(self.reissue_timeout),
            reissue_output: self.reissue_output_max,
            backoff: drums_coordinator::Backoff {
                first: Duration::from_secs(self.recovery_backoff),
                max: Duration::from_secs(self.recovery_backoff_max),
            },
            session_memory: usize::try_from(self.llm_proxy_session_memory).unwrap_or(usize::MAX),
            body_timeout: Duration::from_secs(self.llm_proxy_body_timeout),
            journal: drums_coordinator::JournalBudget {
                rows: self.llm_journal_rows,
                bytes: self.llm_journal_bytes,
            },
            records: self.llm_journal_rows,
        })
    }

    /// The session API's port, unless it is turned off.
    pub fn session_api(&self) -> Option<u16> {
        (self.session_api_port != 0).then_some(self.session_api_port)
    }

    /// The LLM proxy's port on the bridge address, unless it is turned off.
    pub fn llm_proxy(&self) -> Option<u16> {
        (self.llm_proxy_port != 0).then_some(self.llm_proxy_port)
    }

    /// The LLM proxy's address for agents on this host, unless `off`.
    pub fn llm_proxy_local(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        if self.llm_proxy_local == "off" {
            return Ok(None);
        }
        self.llm_proxy_local
            .parse()
            .map(Some)
            .map_err(|source| ConfigError::LlmProxyLocal {
                value: self.llm_proxy_local.clone(),
                source,
            })
    }

    /// The bridge services: those asked for, the session API's and the LLM
    /// proxy's.
    pub fn services(&self) -> Vec<drums_net::Service> {
        let mut all = self.bridge_services.clone();
        for port in [self.session_api(), self.llm_proxy()].into_iter().flatten() {
            let ours = drums_net::Service {
                proto: drums_net::firewall::Proto::Tcp,
                port,
            };
            if !all.contains(&ours) {
                all.push(ours);
            }
        }
        all
    }
}

/// A limit flag's value: a number, or "none" to turn that limit off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit<T> {
    Set(T),
    None,
}

impl<T: Copy> Limit<T> {
    pub fn get(self) -> Option<T> {
        match self {
            Limit::Set(v) => Some(v),
            Limit::None => None,
        }
    }
}

/// Default CPUs: two, so a desktop's Chromium can render while Xvfb draws, or
/// every CPU of a smaller host.
fn default_cpus() -> f64 {
    drums_cgroup::host_cpus().min(2) as f64
}

impl DaemonArgs {
    /// The per-session defaults; a disk default left unset is resolved against
    /// the store when it is open.
    pub fn default_limits(&self) -> drums_api::Limits {
        drums_api::Limits {
            memory_bytes: self.default_memory.get(),
            pids_max: self.default_pids.get(),
            cpus: match self.default_cpus {
                Some(l) => l.get(),
                None => Some(default_cpus()),
            },
            disk_bytes: self.default_disk.and_then(Limit::get),
        }
    }

    /// The caps on all sessions together.
    pub fn sessions_caps(&self) -> drums_cgroup::ParentCaps {
        let share = drums_cgroup::ParentCaps::host_share();
        drums_cgroup::ParentCaps {
            memory_bytes: self.sessions_memory.map_or(share.memory_bytes, Limit::get),
            pids_max: self.sessions_pids.map_or(share.pids_max, Limit::get),
        }
    }
}

/// A size or limit on drumsd's command line that clap refuses (exit 2),
/// saying this.
#[derive(Debug, thiserror::Error)]
pub enum LimitArgError {
    #[error(transparent)]
    Size(#[from] drums_api::SizeError),
    #[error("{0:?} is below 1M")]
    BudgetBelow1M(String),
    #[error(transparent)]
    Cgroup(#[from] drums_cgroup::LimitsError),
    #[error("invalid pids limit {0:?}: expected a whole number")]
    Pids(String),
    #[error(transparent)]
    Cpus(#[from] drums_api::CpusError),
    #[error("disk limit {0} bytes is below the minimum of 16 MiB")]
    DiskBelowMin(u64),
}

fn none_or<T>(
    s: &str,
    parse: impl FnOnce(&str) -> Result<T, LimitArgError>,
) -> Result<Limit<T>, LimitArgError> {
    if s.trim().eq_ignore_ascii_case("none") {
        Ok(Limit::None)
    } else {
        parse(s).map(Limit::Set)
    }
}

fn parse_size_arg(s: &str) -> Result<u64, LimitArgError> {
    Ok(drums_api::parse_size(s)?)
}

/// A budget: a size of at least 1 MiB (less would refuse every request an
/// SDK makes).
fn parse_budget_arg(s: &str) -> Result<u64, LimitArgError> {
    let n = parse_size_arg(s)?;
    if n < 1 << 20 {
        return Err(LimitArgError::BudgetBelow1M(s.to_owned()));
    }
    Ok(n)
}

/// The same bounds a request's limits are held to, checked when drumsd starts
/// (exit 2) rather than at the first session.
fn cgroup_check(l: drums_cgroup::Limits) -> Result<(), LimitArgError> {
    Ok(l.validate()?)
}

fn parse_memory_arg(s: &str) -> Result<Limit<u64>, LimitArgError> {
    none_or(s, |s| {
        let bytes = parse_size_arg(s)?;
        cgroup_check(drums_cgroup::Limits {
            memory_bytes: Some(bytes),
            ..Default::default()
        })?;
        Ok(bytes)
    })
}

fn parse_pids_arg(s: &str) -> Result<Limit<u64>, LimitArgError> {
    none_or(s, |s| {
        let pids: u64 = s
            .trim()
            .parse()
            .map_err(|_| LimitArgError::Pids(s.to_owned()))?;
        cgroup_check(drums_cgroup::Limits {
            pids_max: Some(pids),
            ..Default::default()
        })?;
        Ok(pids)
    })
}

fn parse_cpus_arg(s: &str) -> Result<Limit<f64>, LimitArgError> {
    none_or(s, |s| {
        Ok(drums_api::parse_cpus(s, Some(drums_cgroup::host_cpus()))?)
    })
}

fn parse_disk_arg(s: &str) -> Result<Limit<u64>, LimitArgError> {
    none_or(s, |s| {
        let bytes = parse_size_arg(s)?;
        if bytes < drums_session::limits::MIN_DISK_BYTES {
            return Err(LimitArgError::DiskBelowMin(bytes));
        }
        Ok(bytes)
    })
}

/// The IPv4 name servers of a resolv.conf that a session could reach through
/// the host: a loopback resolver (systemd-resolved's 127.0.0.53) is the
/// host's alone, so it is left out.
fn host_nameservers(resolv_conf: &str) -> Vec<std::net::Ipv4Addr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse::<std::net::Ipv4Addr>().ok())
        .filter(|a| !a.is_loopback() && !a.is_unspecified())
        .collect()
}

fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8), ConfigError> {
    let (a, p) = s
        .split_once('/')
        .ok_or_else(|| ConfigError::NotCidr(s.to_owned()))?;
    let addr: Ipv4Addr = a.parse().map_err(|source| ConfigError::SubnetAddress {
        address: a.to_owned(),
        source,
    })?;
    let prefix: u8 = p.parse().map_err(|source| ConfigError::SubnetPrefix {
        prefix: p.to_owned(),
        source,
    })?;
    if !(8..=29).contains(&prefix) {
        return Err(ConfigError::PrefixRange(prefix));
    }
    let mask = u32::MAX << (32 - prefix);
    if u32::from(addr) & !mask != 0 {
        return Err(ConfigError::HostBits {
            subnet: s.to_owned(),
            network: Ipv4Addr::from(u32::from(addr) & mask),
            prefix,
        });
    }
    Ok((addr, prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_servers_come_from_resolv_conf_without_loopback() {
        let got = host_nameservers(
            "# comment\nnameserver 127.0.0.53\nnameserver 10.255.255.53\nnameserver ::1\nsearch x\nnameserver 192.0.2.1 \n",
        );
        assert_eq!(
            got,
            vec![
                "10.255.255.53".parse::<std::net::Ipv4Addr>().unwrap(),
                "192.0.2.1".parse().unwrap()
            ]
        );
        let cli = Cli::try_parse_from(["drumsd", "--dns", "198.51.100.2"]).unwrap();
        assert_eq!(
            cli.daemon.dns,
            vec!["198.51.100.2".parse::<std::net::Ipv4Addr>().unwrap()]
        );
        assert!(Cli::try_parse_from(["drumsd", "--dns", "not-an-address"]).is_err());
    }

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
    fn the_proxy_s_budgets_have_defaults_and_refuse_nonsense() {
        let cli = Cli::try_parse_from(["drumsd"]).unwrap();
        assert_eq!(
            cli.daemon.coordinator_limits().unwrap(),
            drums_coordinator::Limits::default()
        );
        let cli = Cli::try_parse_from([
            "drumsd",
            "--llm-proxy-session-memory",
            "16M",
            "--llm-proxy-body-timeout",
            "5",
            "--llm-journal-rows",
            "100",
            "--llm-journal-bytes",
            "1G",
        ])
        .unwrap();
        let l = cli.daemon.coordinator_limits().unwrap();
        assert_eq!(l.session_memory, 16 << 20);
        assert_eq!(l.body_timeout, Duration::from_secs(5));
        assert_eq!(
            (l.journal.rows, l.journal.bytes, l.records),
            (100, 1 << 30, 100)
        );
        for bad in [
            ["--llm-proxy-session-memory", "0"],
            ["--llm-proxy-session-memory", "1K"],
            ["--llm-proxy-body-timeout", "0"],
            ["--llm-journal-rows", "0"],
            ["--llm-journal-bytes", "lots"],
        ] {
            assert!(
                Cli::try_parse_from(["drumsd", bad[0], bad[1]]).is_err(),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_session_api_and_llm_proxy_are_bridge_services_unless_turned_off() {
        let cli = Cli::try_parse_from(["drumsd"]).unwrap();
        assert_eq!(cli.daemon.session_api(), Some(drums_api::SESSION_API_PORT));
        assert_eq!(cli.daemon.llm_proxy(), Some(drums_api::LLM_PROXY_PORT));
        let got: Vec<String> = cli
            .daemon
            .services()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            got,
            [
                format!("tcp:{}", drums_api::SESSION_API_PORT),
                format!("tcp:{}", drums_api::LLM_PROXY_PORT)
            ]
        );
        let cli = Cli::try_parse_from([
            "drumsd",
            "--session-api-port",
            "8000",
            "--bridge-service",
            "tcp:8000",
            "--llm-proxy-port",
            "0",
        ])
        .unwrap();
        let got: Vec<String> = cli
            .daemon
            .services()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, ["tcp:8000"], "listed once");
        let cli = Cli::try_parse_from([
            "drumsd",
            "--session-api-port",
            "0",
            "--llm-proxy-port",
            "0",
            "--llm-proxy-local",
            "off",
        ])
        .unwrap();
        assert_eq!(cli.daemon.session_api(), None);
        assert!(cli.daemon.services().is_empty());
        assert_eq!(cli.daemon.llm_proxy_local().unwrap(), None);
        let cli = Cli::try_parse_from(["drumsd", "--llm-proxy-local", "nowhere"]).unwrap();
        assert!(cli.daemon.llm_proxy_local().is_err());
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

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("drumsd").chain(args.iter().copied()))
    }

    #[test]
    fn limit_defaults() {
        let cli = parse(&[]).unwrap();
        let d = cli.daemon.default_limits();
        assert_eq!(d.memory_bytes, Some(4 << 30));
        assert_eq!(d.pids_max, Some(2048));
        assert_eq!(d.cpus, Some(drums_cgroup::host_cpus().min(2) as f64));
        // Resolved against the store when it is open.
        assert_eq!(d.disk_bytes, None);
        assert_eq!(cli.daemon.store_reserve, None);
        let caps = cli.daemon.sessions_caps();
        assert_eq!(caps, drums_cgroup::ParentCaps::host_share());
        assert!(caps.memory_bytes.unwrap() > 0);
    }

    #[test]
    fn limit_flags_parse_sizes_and_none() {
        let cli = parse(&[
            "--default-memory",
            "512M",
            "--default-pids",
            "none",
            "--default-cpus",
            "0.5",
            "--default-disk",
            "1.5G",
            "--sessions-memory",
            "8G",
            "--sessions-pids",
            "10000",
            "--store-reserve",
            "1G",
        ])
        .unwrap();
        let d = cli.daemon.default_limits();
        assert_eq!(d.memory_bytes, Some(512 << 20));
        assert_eq!(d.pids_max, None);
        assert_eq!(d.cpus, Some(0.5));
        assert_eq!(d.disk_bytes, Some(3 << 29));
        assert_eq!(
            cli.daemon.sessions_caps(),
            drums_cgroup::ParentCaps {
                memory_bytes: Some(8 << 30),
                pids_max: Some(10000)
            }
        );
        assert_eq!(cli.daemon.store_reserve, Some(1 << 30));
        let cli = parse(&["--default-disk", "none", "--sessions-memory", "none"]).unwrap();
        assert_eq!(cli.daemon.default_limits().disk_bytes, None);
        assert_eq!(cli.daemon.sessions_caps().memory_bytes, None);
    }

    /// Bad limits stop drumsd before it starts, with exit code 2 and a message
    /// naming the value.
    #[test]
    fn bad_limit_flags_exit_2() {
        for (flag, value, says) in [
            ("--default-disk", "0", "must be a positive"),
            ("--default-disk", "nan", "must be a positive"),
            ("--default-disk", "inf", "must be a positive"),
            ("--default-disk", "-1G", "must be a positive"),
            (
                "--default-disk",
                "18446744073709551616",
                "exceeds the largest size",
            ),
            ("--default-disk", "1e30G", "exceeds the largest size"),
            ("--default-disk", "1M", "below the minimum of 16 MiB"),
            ("--default-disk", "lots", "use bytes or a number"),
            ("--store-reserve", "0", "must be a positive"),
            ("--default-memory", "1M", "below the minimum of 8 MiB"),
            ("--default-memory", "inf", "must be a positive"),
            ("--default-pids", "0", "below the minimum of 1"),
            ("--default-pids", "-5", "expected a whole number"),
            ("--default-cpus", "nan", "not a finite number"),
            ("--default-cpus", "0", "below the minimum of 0.01"),
            ("--default-cpus", "100000", "exceeds the"),
            ("--sessions-memory", "0", "must be a positive"),
            ("--sessions-pids", "99999999999", "exceeds the maximum"),
        ] {
            // FLAG=VALUE, so "-1G" reaches the parser instead of reading as a flag.
            let err = parse(&[&format!("{flag}={value}")]).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{flag} {value}");
            let text = err.to_string();
            assert!(text.contains(says), "{flag} {value}: {text}");
        }
    }
}
