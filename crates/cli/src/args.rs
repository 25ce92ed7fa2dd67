//! The command line.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
// The connection options and the size parser are the client's, shared with
// vmrun and the benches.
pub use drums_client::{parse_size, Global};

#[derive(Debug, Parser)]
#[command(
    name = "drums",
    version,
    about = "Sandboxes for AI agents: sessions, checkpoints, forks"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct BuildArgs {
    /// The build context: the directory COPY and ADD read from.
    pub context: PathBuf,
    /// The Dockerfile (default CONTEXT/Dockerfile).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// The image's name (a reference: base:1, localhost/base:1).
    #[arg(short = 't', long = "tag")]
    pub tag: String,
    /// Build arguments (ARG), KEY=VALUE.
    #[arg(long = "build-arg", value_name = "KEY=VALUE")]
    pub build_args: Vec<String>,
    /// Give RUN steps the host's network (for apt-get, pip install). Without
    /// it they have none.
    #[arg(long)]
    pub network: bool,
    /// Build even if an image of the same inputs was built before.
    #[arg(long)]
    pub no_cache: bool,
    /// The FROM images' registries are plain HTTP or self-signed (a local
    /// registry).
    #[arg(long)]
    pub insecure: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum PoolCmd {
    /// Keep SIZE hygienic siblings of a checkpoint ready; prints the pool's name.
    Create {
        checkpoint: String,
        #[arg(long, default_value_t = 1)]
        size: u32,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List pools: ready members, members being restored, and what a short
    /// pool waits on.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Take a ready member (an ordinary session from now on); prints its id.
    Take {
        pool: String,
        /// Seconds to wait when no member is ready (drumsd's default: 30).
        #[arg(long)]
        timeout: Option<f64>,
        #[arg(long)]
        json: bool,
    },
    /// Remove pools and their members not taken.
    Rm {
        #[arg(required = true)]
        pools: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ImageCmd {
    /// Import a `docker save` archive, an oci-archive, or an OCI image
    /// layout directory; prints the image's id.
    Import {
        file: PathBuf,
        /// The image's name instead of the archive's (`podman load`'s tag).
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Name an OCI image NAME too (`podman tag`); the name moves off any
    /// image that had it.
    Tag { image: String, name: String },
    /// Remove images (by reference or id); refused while a session or a
    /// checkpoint uses one. A reference on an image with others is untagged.
    Rm {
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// List images (as `drums images`).
    Ls {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create a session and print its id once it is ready.
    Create(CreateArgs),
    /// Run a command in a session; streams its output and exits with its code.
    Exec(ExecArgs),
    /// Copy a file between the host and a session (SESSION:PATH), either way.
    Cp { src: String, dst: String },
    /// List sessions.
    Ps {
        #[arg(long)]
        json: bool,
    },
    /// Remove sessions and everything they own.
    Rm {
        #[arg(required = true)]
        sessions: Vec<String>,
    },
    /// List images: drums' own and OCI images, with the bytes they share.
    Images {
        #[arg(long)]
        json: bool,
    },
    /// Pull an OCI image from a registry (credentials from auth.json or
    /// ~/.docker/config.json); prints its id.
    Pull {
        /// e.g. `registry.example:5000/team/task:v1`; `alpine` means
        /// `docker.io/library/alpine:latest`, as in podman.
        reference: String,
        /// Plain HTTP to the registry.
        #[arg(long)]
        insecure: bool,
        /// No progress.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Build an image from a Dockerfile with buildah and store it as a drums
    /// image (docs/build.md); builds are cached by their inputs.
    Build(BuildArgs),
    /// OCI images: import an archive, tag, remove.
    #[command(subcommand)]
    Image(ImageCmd),
    /// Checkpoint a session (CRIU + a btrfs snapshot), or `checkpoint rm ID`.
    Checkpoint(CheckpointCmd),
    /// Warm pools: siblings of a checkpoint kept restored and ready, handed
    /// out at once (docs/pools.md).
    #[command(subcommand)]
    Pool(PoolCmd),
    /// This host's key for signing checkpoint archives.
    #[command(subcommand)]
    Key(KeyCmd),
    /// List published checkpoints.
    Checkpoints {
        #[arg(long)]
        json: bool,
    },
    /// Restore a checkpoint as N hygienic siblings, concurrently.
    Restore {
        checkpoint: String,
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[arg(long)]
        json: bool,
    },
    /// Checkpoint a running session and restore N siblings of it.
    Fork {
        session: String,
        #[arg(long, default_value_t = 1)]
        count: usize,
        /// Siblings of one of its versions (number or id) instead of a new
        /// checkpoint: branching for tree search and RL rollouts.
        #[arg(long)]
        at: Option<String>,
        /// Keep the checkpoint the fork makes; without it, the checkpoint is
        /// removed when the last sibling restored from it goes.
        #[arg(long, conflicts_with = "at")]
        keep: bool,
        #[arg(long)]
        json: bool,
    },
    /// Audit two sessions: isolation from each other, and whether they are clones.
    Audit {
        a: String,
        b: String,
        #[arg(long)]
        json: bool,
    },
    /// Stream each turn's class and effects as it ends (turns are marked by
    /// the coordinator, or by hand with `drums turn`).
    Inspect {
        session: String,
        /// One TurnEffects JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// What the LLM proxy saw of a session: each model request, the turn it
    /// ended, what the turn's end took, and how long the answer was held.
    Turns {
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// A session's versions: what each turn's end (or checkpoint) took.
    Versions {
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// The same session (name, address, hostname) continues from one of its
    /// versions: by number or id, the one it is at by default.
    Rollback {
        session: String,
        #[arg(long)]
        to: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// A session whose processes died comes back from its newest version.
    Recover {
        session: String,
        #[arg(long)]
        json: bool,
    },
    /// Mark an agent's turn boundaries by hand; `end` prints what the turn did.
    #[command(subcommand)]
    Turn(TurnCommand),
    /// Show what drums does, on this machine, in a minute.
    Demo,
    /// Benchmarks that print the same tables every time (`drums-bench`,
    /// beside `drums`; `drums bench --help` lists them).
    #[command(disable_help_flag = true)]
    Bench(Passthrough),
    /// The evaluation of selective checkpointing (docs/eval.md): traces
    /// replayed by agents through the coordinator under five recovery
    /// strategies and seeded faults, and many sessions at once; writes
    /// results.json, summary.md and figures. Runs drumsds of its own
    /// (`drums-eval`, beside `drums`).
    #[command(disable_help_flag = true)]
    Eval(Passthrough),
}

/// A subcommand run by its own program: every argument after its name goes
/// to that program as it was given, `--help` included.
#[derive(Debug, Args)]
pub struct Passthrough {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<std::ffi::OsString>,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// headless, or desktop (Xvfb, openbox, Chromium, OSWorld's port 5000).
    #[arg(long, default_value = "headless")]
    pub profile: String,
    /// desktop: the page Chromium opens (default: a titled local page).
    #[arg(long)]
    pub url: Option<String>,
    /// desktop: screen size, WIDTHxHEIGHT (default 1280x800).
    #[arg(long)]
    pub screen: Option<String>,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub image: Option<String>,
    /// Memory limit: bytes, or with a K, M or G suffix.
    #[arg(long)]
    pub memory: Option<String>,
    /// Maximum number of processes.
    #[arg(long)]
    pub pids: Option<u64>,
    /// CPU limit in cores (e.g. 0.5).
    #[arg(long, value_parser = parse_cpus)]
    pub cpus: Option<f64>,
    /// Disk quota of the session's writable layer: bytes, or with a K, M, G or
    /// T suffix (default: drumsd's --default-disk).
    #[arg(long)]
    pub disk: Option<String>,
    /// bridge (own address, reachable from the host, no egress) or none.
    #[arg(long)]
    pub network: Option<String>,
    /// Run without confinement: every capability, no seccomp filter, /proc
    /// and /sys writable, every device. For sessions that need it; never a
    /// default (docs/security.md).
    #[arg(long)]
    pub privileged: bool,
    /// none (default: nothing beyond the bridge) or nat (reach the outside
    /// through the host's NAT; the host and private ranges stay unreachable).
    #[arg(long, value_name = "none|nat")]
    pub egress: Option<String>,
    /// Start the OCI image's default process (Entrypoint + Cmd) once ready,
    /// as `podman run -d`; its output: /var/log/drums/main.log inside.
    #[arg(long)]
    pub run: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CheckpointCmd {
    #[command(subcommand)]
    pub sub: Option<CheckpointSub>,
    #[command(flatten)]
    pub args: CheckpointArgs,
}

#[derive(Debug, Subcommand)]
pub enum CheckpointSub {
    /// Remove checkpoints: images, snapshot and record.
    Rm {
        #[arg(required = true)]
        checkpoints: Vec<String>,
    },
    /// Write a checkpoint to one archive file. An existing regular file is
    /// replaced (as `cp` and `tar -f` do); anything else needs --force.
    Export {
        checkpoint: String,
        file: PathBuf,
        /// Replace FILE even when it is not a regular file (a device node, a
        /// fifo, a socket or a symlink). A directory is never replaced.
        #[arg(long)]
        force: bool,
    },
    /// Import an archive written by `checkpoint export`. It must be signed
    /// by this host or a key in STATE/trusted-keys.
    Import {
        file: PathBuf,
        #[arg(long)]
        json: bool,
        /// Accept an unsigned archive, or one signed by a key this host does
        /// not trust. Its CRIU images will run as root here: use it only for
        /// an archive whose origin you know.
        #[arg(long)]
        trust_unsigned: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeyCmd {
    /// Print this host's public key as a line for another host's
    /// STATE/trusted-keys.
    Show {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct CheckpointArgs {
    /// The session to checkpoint.
    pub session: Option<String>,
    #[arg(long)]
    pub name: Option<String>,
    /// Declare the checkpoint clean: a restore may reset browser state.
    #[arg(long)]
    pub clean: bool,
    /// Keep the session running (by default it stops once dumped).
    #[arg(long)]
    pub leave_running: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    pub session: String,
    /// User name or uid inside the session.
    #[arg(long, short)]
    pub user: Option<String>,
    #[arg(long)]
    pub cwd: Option<String>,
    /// K=V, repeatable.
    #[arg(long = "env", short)]
    pub env: Vec<String>,
    /// Seconds before the command is killed.
    #[arg(long)]
    pub timeout: Option<f64>,
    /// Leave it running and print its pid, as `podman exec -d`.
    #[arg(long, short)]
    pub detach: bool,
    /// With --detach: where its output goes inside the session (appended).
    #[arg(long, requires = "detach")]
    pub log: Option<String>,
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum TurnCommand {
    /// A turn begins; the first one starts inspecting the session.
    Begin { session: String },
    /// The turn ends: its class and net effects.
    End {
        session: String,
        #[arg(long)]
        json: bool,
        /// Take a version of the session as the turn's effects ask.
        #[arg(long)]
        checkpoint: bool,
        /// selective (default), full, files or off.
        #[arg(long, value_parser = |s: &str| s.parse::<drums_api::Policy>())]
        policy: Option<drums_api::Policy>,
        /// Answer once the version is durable.
        #[arg(long)]
        wait: bool,
    },
    /// Exclude an agent process living in the session (its pid there), and
    /// its current descendants, from process tracking.
    Agent { session: String, pid: i32 },
    /// Stop inspecting the session.
    Stop { session: String },
}

/// A CPU limit, by the same check drumsd applies (the host's CPU count is
/// left to drumsd, which knows the host it runs on).
pub fn parse_cpus(s: &str) -> Result<f64, drums_api::CpusError> {
    drums_api::parse_cpus(s, None)
}
