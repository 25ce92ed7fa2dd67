//! `drums bench`'s command line.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use drums_client::Global;

#[derive(Debug, Parser)]
#[command(
    name = "drums-bench",
    bin_name = "drums bench",
    version,
    about = "Benchmarks that print the same tables every time"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: BenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Warm pools: a take from a ready pool (p50, p95), and resets per hour
    /// of 4 workers (take or restore, a 2 s episode, remove) with a pool of
    /// 4 against plain restores, interleaved, headless and desktop.
    Pool {
        /// Takes timed from a ready pool, per profile.
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        /// Segments per arm (pool, restore), alternating.
        #[arg(long, default_value_t = 3)]
        segments: usize,
        /// Seconds per segment.
        #[arg(long, default_value_t = 20.0)]
        segment_secs: f64,
        #[arg(long)]
        json: bool,
    },
    /// Cold start: create-to-ready latency, and host memory per added session.
    Start {
        #[arg(long, default_value = "headless")]
        profile: String,
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        #[arg(long)]
        json: bool,
    },
    /// The inspector: its overhead on a syscall-heavy workload (interleaved
    /// with and without), turn_end latency, and the labelled corpus's
    /// confusion matrix.
    Inspect {
        /// Rounds of the overhead comparison, and turns timed for latency.
        #[arg(short = 'n', default_value_t = 10)]
        n: usize,
        #[arg(long)]
        json: bool,
    },
    /// What the security boundary costs: start and restore with the hardened
    /// default against --privileged, interleaved in one run.
    Confinement {
        #[arg(long, default_value = "headless")]
        profile: String,
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        #[arg(long)]
        json: bool,
    },
    /// Checkpoint and restore of each workload of the checkpointability
    /// corpus (file watchers, ptys, unlinked files, locks, SQLite, kernel
    /// objects) against a plain headless session, interleaved in one run.
    Corpus {
        #[arg(short = 'n', default_value_t = 5)]
        n: usize,
        #[arg(long)]
        json: bool,
    },
    /// The v1 and v2 cgroup freezers for a files artifact (freeze, read-only
    /// btrfs snapshot, thaw), interleaved on a 20-process workload. Runs
    /// in-process as root, without drumsd.
    Freeze {
        #[arg(short = 'n', default_value_t = 50)]
        n: usize,
        #[arg(long)]
        json: bool,
    },
    /// The coordinator's LLM proxy: added latency per request (plain,
    /// streamed, from a session) against its own mock, interleaved;
    /// requests per second with 16 sessions; the exposed delay per turn.
    /// JSON keys are in `crates/bench/src/proxy.rs`.
    Proxy {
        /// Requests per arm for the added latency.
        #[arg(short = 'n', default_value_t = 200)]
        n: usize,
        /// Turns per session for the exposed delay (16 sessions at once).
        #[arg(long, default_value_t = 3)]
        turns: usize,
        /// The proxy, as agents on this host reach it.
        #[arg(long, default_value = "127.0.0.1:7080")]
        proxy: std::net::SocketAddr,
        /// The bench's mock upstream listens on 127.0.0.1:PORT; drumsd must
        /// have --llm-upstream openai=http://127.0.0.1:PORT.
        #[arg(long, default_value_t = 7090)]
        mock_port: u16,
        #[command(flatten)]
        ab: AbArgs,
        #[arg(long)]
        json: bool,
    },
    /// The checkpoint engine's versions (docs/engine.md): files-only,
    /// process-only and full versions of a headless and a desktop session,
    /// interleaved; their frozen time and bytes written; rollback to each;
    /// recovery, by `drums recover` and after `kill -9` of drumsd;
    /// queue wait with 1, 4 and 16 sessions ending turns at once, promotion
    /// off and on. JSON keys are in `crates/bench/src/engine.rs`.
    Engine {
        /// Measured rounds (after one unmeasured round).
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        #[command(flatten)]
        ab: AbArgs,
        #[arg(long)]
        json: bool,
    },
    /// OCI images against skopeo+umoci and podman, from a registry the
    /// bench starts on loopback (drums' default rootfs as the image): pull
    /// and unpack, import of an oci-archive of it (against podman load),
    /// create to ready and exec, interleaved; the disk that 10
    /// images on one base take. Needs root, podman, runc, skopeo, umoci,
    /// docker-registry. JSON keys are in `crates/bench/src/image.rs`.
    Image {
        /// Measured rounds (after one unmeasured round).
        #[arg(short = 'n', default_value_t = 5)]
        n: usize,
        /// The tree the image is made of.
        #[arg(long, default_value = "/var/lib/drums/images/default/rootfs")]
        base: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Cold start vs hygienic restore, interleaved; forks of 1, 4, 8;
    /// memory per session cold vs restored; dump time and image size.
    Restore {
        #[arg(long, default_value = "headless")]
        profile: String,
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        #[arg(long)]
        json: bool,
    },
}

/// `--ab OTHER`: the bench against this build's drumsd and the one at
/// OTHER, each a private daemon of the bench's own, in one run (ab.rs).
#[derive(Debug, Clone, clap::Args)]
pub struct AbArgs {
    /// Arm B's drumsd (with its drums-init and drums-guest beside it), e.g.
    /// the parent commit's build; arm A is this build's. The bench then
    /// starts both daemons itself and ignores --socket, --proxy and
    /// --mock-port.
    #[arg(long, value_name = "OTHER_DRUMSD")]
    pub ab: Option<PathBuf>,
    /// With --ab: runs per arm, alternating A, B then B, A; the rounds
    /// (-n) are split among them.
    #[arg(long, default_value_t = 2, requires = "ab")]
    pub segments: usize,
}
