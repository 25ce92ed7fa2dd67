//! Request and response bodies. Field names are the JSON names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /v1/sessions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `headless` (default). `desktop` arrives with the desktop profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Image name; default `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    /// `bridge` (default) or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
}

/// A session as the API reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub name: String,
    pub profile: String,
    pub image: String,
    /// `creating`, `running` or `removing`.
    pub state: String,
    pub hostname: String,
    pub network: String,
    pub ip: Option<String>,
    pub mac: Option<String>,
    pub limits: Limits,
    pub init_pid: Option<i32>,
    pub created_at_ms: i64,
}

/// `GET /v1/sessions/{id}/stats`: what the session's cgroup accounts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStats {
    /// Memory charged to the session (anonymous memory and page cache).
    pub memory_bytes: Option<u64>,
    /// Live processes.
    pub pids: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionList {
    pub sessions: Vec<Session>,
}

/// `POST /v1/sessions/{id}/exec`; passed through to the guest agent unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// One line of an exec's `application/x-ndjson` response stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ExecFrame {
    /// `{"stream":"stdout"|"stderr","data":"<base64>"}`
    Output { stream: String, data: String },
    /// The last frame.
    Exit { exit: ExitStatus },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExitStatus {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Image {
    pub name: String,
    pub suite: String,
    pub variant: String,
    pub packages: Vec<String>,
    pub size_bytes: u64,
    pub created_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageList {
    pub images: Vec<Image>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Version {
    pub version: String,
    pub api: String,
    pub pid: u32,
    pub state_dir: String,
}

/// `POST /v1/debug/faults` (only when drumsd runs with `--enable-fault-injection`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    /// A fault point such as `create.subvolume`; null clears it.
    pub point: Option<String>,
}

/// Every error response: `{"error":{"kind":..,"message":..}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// A stable snake_case kind: `bad_request`, `not_found`, `conflict`,
    /// `command_not_found`, `path_escapes_root`, `internal`, ...
    pub kind: String,
    pub message: String,
}
