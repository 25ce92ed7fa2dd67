//! The guest agent's API (`drums-guest`, on `/run/drums/guest.sock` inside a
//! session): the requests drumsd sends it and the answers it reads, defined
//! once here so the host that writes them and the guest that parses them
//! share one type (the guest's own endpoints: `docs/guest-api.md`).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The request body of `POST /v1/hygiene`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HygieneRequest {
    pub hostname: String,
    /// 32 lowercase hex digits, as systemd expects in `/etc/machine-id`.
    pub machine_id: String,
    /// The restore generation; written for processes to read.
    pub generation: u64,
    /// The sibling's new address, for `/etc/hosts`; drumsd has already
    /// configured it on the interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_timeout_ms: Option<u64>,
}

/// The answer to `POST /v1/hygiene`. Pid lists are sorted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HygieneReport {
    pub hostname: String,
    pub generation: u64,
    /// Registered processes that were sent their signal.
    pub signalled: Vec<u32>,
    /// Of those, the ones that acknowledged this generation in time.
    pub acked: Vec<u32>,
    /// Registrations removed because they no longer name a live registrant.
    pub stale_removed: Vec<u32>,
    /// Registrations the agent could not tie to their process (it may not
    /// look at the process's open files), so it neither signalled nor
    /// removed them: those processes were not reseeded.
    #[serde(default)]
    pub unverified: Vec<u32>,
    pub elapsed_us: u64,
}

/// The answer to `GET /v1/hygiene`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HygieneStatus {
    /// 0 for a session that was never restored.
    pub generation: u64,
    /// Pids with a registration file, valid or not (checked only when
    /// signalling).
    pub registered: Vec<u32>,
    /// What the last `POST /v1/hygiene` did, since this agent started (a
    /// restored agent starts from its checkpoint, which never holds one:
    /// drumsd checkpoints before it restores).
    #[serde(default)]
    pub last: Option<HygieneReport>,
}

/// The request body of `POST /v1/desktop`: start the desktop profile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesktopStart {
    /// `WIDTHxHEIGHT`, default 1280x800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The whole start's budget, until agent-ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// The request body of `POST /v1/desktop/hygiene`: a restored desktop's browser
/// takes its sibling's identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrowserHygiene {
    /// The sibling's new hostname, for the profile lock.
    pub hostname: String,
    /// Reset cookies, storage and renderers.
    #[serde(default)]
    pub clean: bool,
}
