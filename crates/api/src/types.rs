//! Request and response bodies. Field names are the JSON names.

use std::collections::BTreeMap;

use crate::states::{Egress, JobState, Network, Priority, Profile, SessionState, VersionState};
use serde::{Deserialize, Serialize};

/// `POST /v1/sessions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `headless` (default) or `desktop` (Xvfb, openbox, Chromium and the
    /// OSWorld protocol on port 5000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Desktop options; only with `profile: desktop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desktop: Option<DesktopOptions>,
    /// Image name; default `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    /// `bridge` (default) or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Run without the session's confinement (all capabilities, no seccomp
    /// filter, /proc and /sys unmasked and writable, every device), as
    /// Podman's `--privileged`. Only ever on when asked for by name.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privileged: bool,
    /// `none` (default) or `nat` (bridge sessions only): leave the host
    /// through NAT; the host and private ranges stay unreachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<String>,
    /// Start the OCI image's default process (`Entrypoint` then `Cmd`, with
    /// its `Env`, `WorkingDir` and `User`) once the session is ready, as
    /// `podman run -d` does; its output goes to /var/log/drums/main.log in
    /// the session.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub run: bool,
}

/// What a desktop session shows when it starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DesktopOptions {
    /// The page Chromium opens (default: a titled local page).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Screen size as `WIDTHxHEIGHT` (default `1280x800`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub screen: Option<String>,
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
    /// The session's writable layer on the btrfs store (a qgroup limit on its
    /// subvolume's referenced bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
}

/// A session as the API reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub id: String,
    pub name: String,
    pub profile: Profile,
    pub image: String,
    pub state: SessionState,
    pub hostname: String,
    pub network: Network,
    #[serde(default)]
    pub egress: Egress,
    pub ip: Option<String>,
    pub mac: Option<String>,
    pub limits: Limits,
    pub init_pid: Option<i32>,
    pub created_at_ms: i64,
    /// Restores between this session and a cold start (0: cold).
    #[serde(default)]
    pub generation: u64,
    /// The checkpoint this session was restored from.
    #[serde(default)]
    pub origin: Option<String>,
    /// Runs without confinement (see `CreateSession::privileged`).
    #[serde(default)]
    pub privileged: bool,
    /// The ports its OCI image's config exposes (`8080/tcp`): what the
    /// image says it serves, reachable at the session's address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// The warm pool holding it until it is taken; `None` for a session of
    /// its own.
    #[serde(default)]
    pub pool: Option<String>,
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

/// `POST /v1/sessions/{id}/exec`; passed through to the guest agent
/// unchanged, or with an OCI image's defaults (which is why unknown fields
/// are refused here as the guest refuses them, not dropped).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    /// Answer at once with `{"pid":N}` and leave the command running, as
    /// `podman exec -d`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detach: bool,
    /// A detached command's stdout and stderr, appended: a path inside the
    /// session; `/dev/null` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<String>,
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

/// An image sessions start from: one drums built (`kind: drums`, by
/// debootstrap) or an OCI image pulled or imported (`kind: oci`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Image {
    /// A drums image's name; an OCI image's first reference, or its id.
    pub name: String,
    /// `drums` or `oci`.
    #[serde(default = "drums_kind")]
    pub kind: String,
    /// An OCI image's id (`sha256:` of its config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Every reference naming an OCI image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    #[serde(default)]
    pub suite: String,
    #[serde(default)]
    pub variant: String,
    #[serde(default)]
    pub packages: Vec<String>,
    pub size_bytes: u64,
    /// Of `size_bytes`, what is stored once for this and other images
    /// (OCI layers they share).
    #[serde(default)]
    pub shared_bytes: u64,
    /// Layers, base first (OCI).
    #[serde(default)]
    pub layers: u32,
    pub created_at: i64,
}

fn drums_kind() -> String {
    "drums".into()
}

/// `POST /v1/images/pull`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PullRequest {
    pub reference: String,
    /// Plain HTTP to the registry.
    #[serde(default)]
    pub insecure: bool,
    /// Basic credentials for the registry, read by the client from its
    /// auth.json or docker config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// One line of a pull's answer once it streams (`POST /v1/images/pull`,
/// NDJSON): its steps as they happen, then `done` or `error`, last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PullEvent {
    Resolved {
        reference: String,
        id: String,
        layers: usize,
    },
    Layer {
        index: usize,
        digest: String,
        /// Bytes so far and in all; both 0 for a layer already stored.
        done: u64,
        total: u64,
        stored: bool,
    },
    Applying {
        index: usize,
    },
    /// The pull is stored under `names`.
    Done {
        id: String,
        names: Vec<String>,
    },
    /// The pull failed after its answer began (an error before that is the
    /// answer's status and error body).
    Error {
        message: String,
    },
}

/// The answer to a pull or import, and `DELETE /v1/images/{image}`'s.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImageRef {
    /// The image id; none when a removal only untagged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
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
    /// Where the LLM proxy listens on the host (`--llm-proxy-local`), if it
    /// does: an agent outside a session calls `http://ADDR/s/SESSION/v1`.
    #[serde(default)]
    pub llm_proxy_local: Option<String>,
}

/// `PUT /v1/sessions/{session}/replication`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationRequest {
    /// The longest an answer is held for a replica (default 30000).
    pub timeout_ms: Option<u64>,
}

/// A session's replication gate: answers are held until the replica of
/// their turn's version on another host is acknowledged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Replication {
    pub session: String,
    pub timeout_ms: u64,
    /// Versions an answer waits on, oldest first, not yet acknowledged.
    pub pending: Vec<String>,
    pub last_acked: Option<String>,
}

/// `GET /v1/sessions/{session}/replication/next`: the oldest version an
/// answer waits on; `POST .../replication/ack`: its replica is made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaVersion {
    pub version: String,
}

/// `GET /v1/capacity`: what this host holds and may still take, for a
/// scheduler that places sessions over several hosts (`drums.ray`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capacity {
    /// Sessions held now, warm pools' members included.
    pub sessions: u64,
    /// drumsd's `--max-sessions`; `None`: no such limit.
    pub max_sessions: Option<u64>,
    /// What all sessions together may use (the cgroup parent's memory
    /// limit, `--sessions-memory`); `None`: no limit.
    pub sessions_memory_bytes: Option<u64>,
    /// The sum of the sessions' own memory limits (a session without one
    /// counts nothing).
    pub memory_committed_bytes: u64,
    /// The memory limit a session gets when its request names none
    /// (`--default-memory`); `None`: unlimited.
    pub default_memory_bytes: Option<u64>,
    /// The host's MemAvailable now.
    pub memory_available_bytes: u64,
    /// CPUs the host has online.
    pub cpus: u64,
}

/// `POST /v1/debug/faults` (only when drumsd runs with `--enable-fault-injection`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    /// A fault point such as `create.subvolume`; null clears it.
    pub point: Option<String>,
    /// Hold the step at the point forever instead of failing it (only the
    /// points in drums_session's `faults::HOLD_POINTS`): a test then kills
    /// drumsd there, as a crash would.
    #[serde(default)]
    pub hold: bool,
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

/// `POST /v1/checkpoints`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateCheckpoint {
    /// Session id or name.
    pub session: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The checkpoint may have its browser state reset on restore.
    #[serde(default)]
    pub clean: bool,
    /// Keep the session running after the dump (default: it stops, as with
    /// `podman container checkpoint`).
    #[serde(default)]
    pub leave_running: bool,
}

/// A published checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub id: String,
    pub name: String,
    pub session_id: String,
    pub created_at_ms: i64,
    pub clean: bool,
    pub profile: String,
    pub image: String,
    pub format_version: u32,
    pub images_bytes: u64,
    pub dump_ms: f64,
    pub frozen_ms: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckpointList {
    pub checkpoints: Vec<Checkpoint>,
}

/// `POST /v1/checkpoints/{id}/restore` and `POST /v1/sessions/{id}/fork`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    #[serde(default = "one")]
    pub count: usize,
    /// Name of the restored session; only with `count: 1` (siblings of a
    /// larger restore are named by drums).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

fn one() -> usize {
    1
}

/// `POST /v1/images/{image}/tag`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TagImage {
    /// The new name, a reference (`base:1`, `localhost/base:1`).
    pub name: String,
}

/// `POST /v1/pools`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreatePool {
    /// The checkpoint's id or name.
    pub checkpoint: String,
    #[serde(default = "one_u32")]
    pub size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

fn one_u32() -> u32 {
    1
}

/// A warm pool (docs/pools.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    pub id: String,
    pub name: String,
    /// The checkpoint's id.
    pub checkpoint: String,
    pub size: u32,
    /// Members running and not yet taken.
    pub ready: u32,
    /// Members being restored.
    pub restoring: u32,
    /// Members handed out by this drumsd since it started.
    pub taken: u64,
    pub created_at_ms: i64,
    /// Why the pool is short and not restoring: the host out of room, or
    /// the refill's last error.
    pub waiting_on: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolList {
    pub pools: Vec<Pool>,
}

/// `POST /v1/pools/{pool}/take`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakeRequest {
    /// How long to wait for a ready member when none is (default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `POST /v1/sessions/{id}/fork`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    #[serde(default = "one")]
    pub count: usize,
    /// Name of the sibling; only with `count: 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// One of the session's done versions (id, name or number): siblings of
    /// it, without a new checkpoint. Absent: a checkpoint of the session now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// Keep the checkpoint the fork makes. Without it, that checkpoint is
    /// removed when the last session restored from it goes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
}

/// The siblings a restore or fork started, all ready.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreResult {
    pub checkpoint: String,
    pub sessions: Vec<Session>,
    /// False only for the checkpoint a fork made without `keep`: it is
    /// removed when the last session restored from it goes.
    #[serde(default = "kept")]
    pub checkpoint_kept: bool,
}

fn kept() -> bool {
    true
}

/// `GET /v1/audit?a=..&b=..`: isolation between two sessions, and whether
/// they are clones.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditReport {
    pub a: String,
    pub b: String,
    /// Every check below passed.
    pub passed: bool,
    /// Shared kernel objects and namespaces (the seed's C3 audit).
    pub isolation: Vec<AuditCheck>,
    /// What hygiene must make differ.
    pub clone: Vec<AuditCheck>,
    /// What stays identical between siblings by design.
    pub identical_by_design: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditCheck {
    pub what: String,
    pub a: String,
    pub b: String,
    pub ok: bool,
    pub note: String,
}

/// What a turn changed, as the inspector classifies it: `none` needs no
/// checkpoint, `files` a file-system snapshot, `processes` a CRIU dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TurnClass {
    None,
    Files,
    Processes,
    Both,
}

impl TurnClass {
    pub fn of(files: bool, processes: bool) -> TurnClass {
        match (files, processes) {
            (false, false) => TurnClass::None,
            (true, false) => TurnClass::Files,
            (false, true) => TurnClass::Processes,
            (true, true) => TurnClass::Both,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TurnClass::None => "none",
            TurnClass::Files => "files",
            TurnClass::Processes => "processes",
            TurnClass::Both => "both",
        }
    }

    pub fn files(self) -> bool {
        matches!(self, TurnClass::Files | TurnClass::Both)
    }

    pub fn processes(self) -> bool {
        matches!(self, TurnClass::Processes | TurnClass::Both)
    }
}

/// A name that is none of a closed set's (a turn class, a policy).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} ({choices})")]
pub struct UnknownName {
    pub what: &'static str,
    pub value: String,
    pub choices: &'static str,
}

impl std::str::FromStr for TurnClass {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<TurnClass, UnknownName> {
        match s {
            "none" => Ok(TurnClass::None),
            "files" => Ok(TurnClass::Files),
            "processes" => Ok(TurnClass::Processes),
            "both" => Ok(TurnClass::Both),
            _ => Err(UnknownName {
                what: "turn class",
                value: s.to_owned(),
                choices: "none, files, processes, both",
            }),
        }
    }
}

/// `POST /v1/sessions/{session}/turn/begin`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TurnBegun {
    pub session: String,
    /// Turns are numbered from 1 per session.
    pub turn: u64,
}

/// `POST /v1/sessions/{session}/turn/end`, and each line of
/// `GET /v1/sessions/{session}/coordinator`: a turn's net effects on the session.
/// The window is from the previous turn's end (or the first turn's begin) to
/// this end, so what background processes do between turns is never lost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnEffects {
    pub session: String,
    pub turn: u64,
    pub class: TurnClass,
    pub files: Vec<FileEffect>,
    /// Processes spawned and still alive, gone, or re-executed.
    pub processes: Vec<ProcessEffect>,
    /// Processes that lived through the turn and ran, so may have changed memory.
    pub dirtied: Vec<DirtiedProcess>,
    /// How long turn_end took to classify, in microseconds.
    pub latency_us: u64,
    /// The version the turn's end asked for, if it asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<TurnCheckpoint>,
}

/// One path whose state differs at the boundary, relative to the session root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEffect {
    pub path: String,
    /// `created`, `modified`, `deleted`, or `unknown` when the inspector could
    /// not tell (an unreadable path, io_uring, lost events): always an effect.
    pub change: String,
    /// The operations seen, such as `write`, `rename`, `chmod`.
    pub ops: Vec<String>,
    /// The processes that did it.
    pub by: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEffect {
    pub pid: i32,
    pub comm: String,
    /// `spawned` (alive at the boundary, not before), `exited`, `exec`, or
    /// `ipc` (it made or used System V or POSIX IPC objects, which outlive it).
    pub change: String,
    /// The program it executed, when seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exe: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirtiedProcess {
    pub pid: i32,
    pub comm: String,
    /// CPU time it used in the turn, in microseconds.
    pub cpu_us: u64,
    /// Page faults it took in the turn.
    pub faults: u64,
    /// Why it counts: `ran`, or `written by <pid>` (process_vm_writev, ptrace).
    pub reason: String,
}

/// `POST /v1/sessions/{session}/agent`: exclude a process (and the processes
/// descended from it now) from process tracking.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarkAgent {
    /// The process id as the host sees it.
    pub pid: i32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentMarked {
    pub session: String,
    /// Every process now excluded, the marked one first.
    pub pids: Vec<i32>,
}

/// `GET /v1/keys/host`: the key this host signs checkpoint archives with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostKey {
    /// `ed25519 <base64 public key>`.
    pub key: String,
    /// The key with a comment naming this host: the line to add to another
    /// host's `STATE/trusted-keys` for it to accept this host's archives.
    pub trusted_keys_line: String,
}

/// When a turn's end takes a version (see docs/engine.md):
/// - `selective` (the default): as the inspector's class says;
/// - `full`: both artifacts at every turn (Crab's baseline);
/// - `files`: a files artifact at every turn, never the processes (the
///   chat+files baseline; such a version restores as a cold start);
/// - `off`: none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    #[default]
    Selective,
    Full,
    Files,
    Off,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Selective => "selective",
            Policy::Full => "full",
            Policy::Files => "files",
            Policy::Off => "off",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Policy, UnknownName> {
        match s {
            "selective" => Ok(Policy::Selective),
            "full" => Ok(Policy::Full),
            "files" => Ok(Policy::Files),
            "off" => Ok(Policy::Off),
            _ => Err(UnknownName {
                what: "policy",
                value: s.to_owned(),
                choices: "selective, full, files, off",
            }),
        }
    }
}

/// `POST /v1/sessions/{session}/turn/end`'s optional body.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndTurn {
    /// Take a version of the session as the turn's effects ask.
    #[serde(default)]
    pub checkpoint: bool,
    #[serde(default)]
    pub policy: Option<Policy>,
    /// Answer only once the version is durable (or failed).
    #[serde(default)]
    pub wait: bool,
}

/// The version a turn's end asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnCheckpoint {
    /// What the policy and the turn's class ask for: `none`, `files`,
    /// `process` or `full`; or `over_budget`: none, since the session's turn
    /// ends took as many versions as drumsd's `--turn-versions-per-minute`
    /// lets them (the next one taken is whole). The job may take more (a full version) when a
    /// pairing would not be valid; the version says what it took and why.
    pub decision: String,
    /// The job taking it; none when the decision is `none`.
    pub job: Option<String>,
    /// With `wait`: the durable version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<SessionVersion>,
}

/// One artifact's cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ArtifactCost {
    /// Bytes the artifact wrote.
    pub bytes: u64,
    /// Bytes it holds without writing them: process images' pages that an
    /// earlier version's images hold too, shared on disk.
    #[serde(default)]
    pub shared_bytes: u64,
    pub frozen_ms: f64,
    pub total_ms: f64,
}

/// A version of a session: `GET /v1/sessions/{session}/versions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionVersion {
    pub id: String,
    pub session_id: String,
    /// 1, 2, … in the session's history.
    pub number: u64,
    pub state: VersionState,
    /// A person pinned it as a checkpoint (its name), so retention keeps it.
    pub pinned: bool,
    pub name: String,
    pub parent: Option<String>,
    pub turn: Option<u64>,
    /// The class of the turns it covers, or `manual`.
    pub class: String,
    pub policy: String,
    /// `full`, `files` or `process`; empty until it is done.
    pub took: String,
    pub reason: Option<String>,
    /// The versions whose artifacts it uses.
    pub files_of: Option<String>,
    pub process_of: Option<String>,
    pub files: Option<ArtifactCost>,
    pub process: Option<ArtifactCost>,
    pub created_at_ms: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionVersions {
    pub versions: Vec<SessionVersion>,
}

/// `POST /v1/sessions/{session}/rollback`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollback {
    /// A version's id or number; the session's newest done version if absent.
    #[serde(default)]
    pub to: Option<String>,
}

/// `POST /v1/self/rollback` of drumsd's session API, and `POST /v1/rollback`
/// of the guest agent that forwards to it (see docs/agent-tool.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SelfRollback {
    /// A version's number or id; the version the session is at if absent.
    #[serde(default)]
    pub to: Option<VersionRef>,
}

/// A version as an agent names it: its number (`3` or `"3"`) or its id. A
/// model's tool call may send either, so both are taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum VersionRef {
    Number(u64),
    Text(String),
}

impl std::fmt::Display for VersionRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VersionRef::Number(n) => write!(f, "{n}"),
            VersionRef::Text(t) => f.write_str(t),
        }
    }
}

/// The answer to a self rollback, sent before the rollback starts: the
/// caller's process is replaced by the version's state moments later.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollingBack {
    /// The version's number.
    pub rolling_back_to: u64,
    /// The version's id.
    pub version: String,
}

/// A checkpoint job: `GET /v1/jobs/{job}`, `POST /v1/jobs/{job}/promote`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub state: JobState,
    /// Its queue (while queued).
    pub priority: Priority,
    /// The version it took, once done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Once it ran: from its (oldest merged) submission to its start, and
    /// its run, in milliseconds; the priority it started at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ran_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_as: Option<Priority>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One request the coordinator (drumsd's LLM proxy) saw from a session: a
/// turn boundary, what the turn's end took, and what it cost the agent.
/// `GET /v1/sessions/{session}/coordinator`, and `drums turns SESSION`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoordinatedTurn {
    pub session: String,
    /// The inspector's turn this request ended; none for a session's first
    /// request, and for one sent while another of the session's was still
    /// answered (not a boundary).
    pub turn: Option<u64>,
    /// The request's place in the session's exchange log.
    pub seq: Option<u64>,
    /// `live` (asked upstream, logged), `replayed` (answered from the log:
    /// a fast-forward), `forked` (differed from the log, which forked
    /// there; asked upstream), `none` (not logged).
    pub log: String,
    /// `openai` or `anthropic`.
    pub style: String,
    pub path: String,
    /// The upstream's status, or the proxy's own when it answered itself.
    pub status: u16,
    pub stream: bool,
    /// What the turn's end took: `none`, `files`, `process`, `full`;
    /// `over_budget` (none: the session's turn ends are past their budget of
    /// versions); `first` (nothing to end), `concurrent` (not a boundary), or `error` (the
    /// turn could not be ended; see `error`).
    pub decision: String,
    /// The inspector's class of the turn this request ended (absent in
    /// records older than the field).
    #[serde(default)]
    pub class: Option<TurnClass>,
    pub job: Option<String>,
    /// The durable version, once the job is done.
    pub version: Option<String>,
    /// Bytes the version wrote (files and process images).
    pub version_bytes: Option<u64>,
    /// Bytes its process images hold without writing them: pages shared
    /// with an earlier version's (absent in records older than the field).
    #[serde(default)]
    pub version_shared_bytes: Option<u64>,
    /// From the request's arrival to the upstream's last byte, in ms.
    pub upstream_ms: f64,
    /// How long the end of the answer was held for the version (the delay
    /// the agent saw), in ms.
    pub held_ms: f64,
    /// From the upstream's end to the release of the answer's end, in ms:
    /// the turn's end, the hold, the exchange log; all the delay the agent
    /// saw after the model's (0 in records older than the field).
    #[serde(default)]
    pub release_ms: f64,
    /// How long the answer's end was held for the replica of its version
    /// on another host, in ms (0 when the session has no replication gate).
    #[serde(default)]
    pub replica_ms: f64,
    /// How that hold ended: `acked`, `timed_out` or `off` (the gate went
    /// off); null when the session has no replication gate.
    #[serde(default)]
    pub replica: Option<String>,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// The client went away before the answer's end.
    pub client_gone: bool,
    pub error: Option<String>,
    pub started_at_ms: i64,
}

/// `GET /v1/sessions/{session}/coordinator`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CoordinatedTurns {
    pub turns: Vec<CoordinatedTurn>,
}
