//! The drumsd an eval worker drives: a private one (drums_bench::daemon),
//! so that workers never share a daemon (a `kill -9` of one is a fault of
//! its worker's session only), with the turn policy of the strategy it
//! runs. A fault kills it with SIGKILL; it is started again on the same
//! state, as a supervisor would.

use std::net::SocketAddr;
use std::path::PathBuf;

use drums_api::{Client, Policy};
use drums_bench::daemon::{Private, Spec};

use crate::EvalError;

pub use drums_bench::daemon::tag;

/// Where every eval daemon's binaries and images are.
#[derive(Debug, Clone)]
pub struct Setup {
    pub bin_dir: PathBuf,
    pub images_dir: PathBuf,
    /// The mock LLM upstream every daemon sends OpenAI requests to.
    pub upstream: SocketAddr,
    /// Under which each daemon gets a state directory.
    pub work: PathBuf,
    /// Where the daemons' logs go (kept with the results).
    pub logs: PathBuf,
    /// The second octet of the daemons' subnets, `10.NET.N.0/24`.
    pub net: u8,
}

/// A second octet for the eval's subnets that no route of this host uses.
pub fn free_net() -> Result<u8, EvalError> {
    drums_bench::daemon::free_net().map_err(daemon_error)
}

fn daemon_error(e: drums_bench::daemon::DaemonError) -> EvalError {
    EvalError::Daemon(drums_api::error_chain(&e))
}

/// What an agent needs of a drumsd: its API and its LLM proxy. Both stay
/// the same across a restart.
#[derive(Debug, Clone)]
pub struct Handle {
    pub client: Client,
    /// The LLM proxy for agents on this host.
    pub proxy: SocketAddr,
}

pub struct Drumsd {
    pub handle: Handle,
    pub policy: Policy,
    daemon: Private,
}

impl Drumsd {
    /// Starts daemon number `n` (0..250) of this eval with `policy`.
    pub async fn start(setup: &Setup, n: u32, policy: Policy) -> Result<Drumsd, EvalError> {
        let tag = tag();
        let spec = Spec {
            drumsd: setup.bin_dir.join("drumsd"),
            bin_dir: setup.bin_dir.clone(),
            images_dir: setup.images_dir.clone(),
            state: setup.work.join(format!("drumsd-{n}")),
            bridge: format!("drev{tag}x{n}"),
            subnet: format!("10.{}.{n}.0/24", setup.net),
            cgroup_parent: format!("drums-eval-{tag}-{n}"),
            proxy: drums_bench::daemon::free_port().map_err(daemon_error)?,
            // Agents here are outside: no proxy or session API on the bridge
            // is needed, but both stay, as a user's drumsd has them.
            args: vec![
                "--store-gib".into(),
                "8".into(),
                "--enable-fault-injection".into(),
                "--turn-policy".into(),
                policy.as_str().into(),
                "--llm-upstream".into(),
                format!("openai=http://{}", setup.upstream),
            ],
            log: setup
                .logs
                .join(format!("drumsd-{n}-{}.log", policy.as_str())),
        };
        let daemon = Private::start(spec).await.map_err(daemon_error)?;
        Ok(Drumsd {
            handle: Handle {
                client: daemon.client.clone(),
                proxy: daemon.proxy,
            },
            policy,
            daemon,
        })
    }

    pub fn log_path(&self) -> PathBuf {
        self.daemon.spec().log.clone()
    }

    /// Whether the daemon is still running (a restart may have failed).
    pub fn is_running(&mut self) -> bool {
        self.daemon.is_running()
    }

    /// `kill -9`, then a new drumsd on the same state, once the old one is
    /// reaped.
    pub async fn kill9_and_restart(&mut self) -> Result<(), EvalError> {
        self.daemon.kill9_and_restart().await.map_err(daemon_error)
    }

    /// SIGTERM: drumsd removes every session and its own resources.
    pub async fn stop(self) -> Result<(), EvalError> {
        self.daemon.stop().await.map_err(daemon_error)
    }
}
