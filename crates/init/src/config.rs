//! The messages between drumsd and drums-init. They live only on a pipe between
//! two binaries of the same build, so they carry no version.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Everything stage 0 and stage 1 need; written by drumsd as one JSON line.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitConfig {
    pub session_id: String,
    pub hostname: String,
    /// 32 lowercase hex digits, written to /etc/machine-id.
    pub machine_id: String,
    /// The session's address, for /etc/hosts.
    pub ip: Option<String>,
    /// Every cgroup.procs file the session must join before it unshares.
    pub cgroup_procs: Vec<PathBuf>,
    /// The session's root: an overlay drumsd mounted on the host (its layers
    /// idmapped for a user namespace). Stage 1 binds it onto itself in the
    /// session's mount namespace and builds the rest there.
    pub root: PathBuf,
    /// Make the session's namespaces in a user namespace of their own. Stage
    /// 0 reports [`Report::MapIds`] and waits for drumsd's `mapped` line:
    /// only host root can write a map of another range.
    #[serde(default)]
    pub user_namespace: bool,
    /// Host directory holding drums-init and drums-guest, and the host's
    /// loader and libraries they run on ([`crate::loader`]), bind-mounted
    /// read-only.
    pub bin_dir: PathBuf,
    /// Name servers for /etc/resolv.conf: drumsd's, for a session with
    /// egress; empty otherwise (the image's file is kept).
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// Turns off the session's confinement: capabilities, seccomp, the
    /// masked and read-only /proc and /sys paths, and the device allow-list
    /// (`drums create --privileged`, as Podman's). Off unless asked for.
    #[serde(default)]
    pub privileged: bool,
    /// The port of drumsd's session API on the session's gateway, which
    /// stage 2 passes to the guest agent for its rollback tool; `None`
    /// without a network or when drumsd serves none.
    #[serde(default)]
    pub session_api_port: Option<u16>,
    /// Test-only: fail at this step ("init.cgroup", "init.unshare", "init.mount",
    /// "init.pivot", "init.exec").
    #[serde(default)]
    pub fault: Option<String>,
}

/// What drums-init reports on stdout, one JSON line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    /// Stage 0 is in its new user namespace: drumsd writes its uid and gid
    /// maps, then sends `mapped`.
    MapIds,
    /// Stage 0: the host pid of the session's PID 1.
    Pid(i32),
    /// Stage 1: the root is built and the network is in place; stage 2 starts.
    Ok,
    /// Any stage: what failed, with the failing operation named.
    Error(String),
}

impl InitConfig {
    pub(crate) fn check_fault(&self, point: &str) -> Result<(), crate::InitError> {
        match &self.fault {
            Some(f) if f == point => Err(crate::InitError::Injected(point.to_owned())),
            _ => Ok(()),
        }
    }
}
