//! `drums bench freeze`: the two kernel freezers a files artifact can use, on
//! a realistic workload, interleaved round by round (the arm that goes first
//! alternates). It measures a host mechanism, so it runs in-process as root
//! without drumsd: a throwaway cgroup (v1 dirs and the unified v2 dir) with 20
//! processes in it, and a temporary loop-mounted btrfs store whose subvolume
//! the writers write to. Per round and arm: freeze (call to frozen), a
//! read-only snapshot of that subvolume, thaw; the whole is the files
//! artifact. Everything is removed at the end, on error too.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use drums_cgroup::{Cgroup, Devices, FreezeMethod, Limits};
use drums_store::{Store, Written};
use serde_json::json;

use crate::exit::{self, Failure};
use crate::stats::p50_p95;
use crate::table;

const ARMS: [FreezeMethod; 2] = [FreezeMethod::V1, FreezeMethod::V2];
/// The workload: what each of the 20 processes runs (`$F`: its file in the
/// subvolume). Busy loops keep CPUs taken, so freezing has to interrupt
/// running tasks; writers keep the subvolume dirty, half of them forking a
/// child per write; sleepers are the common case of an idle session.
const WORKLOAD: [(&str, usize); 4] = [
    ("while :; do :; done", 6),
    ("i=0; while :; do i=$((i+1)); echo $i > \"$F\"; done", 4),
    ("while :; do head -c 65536 /dev/urandom > \"$F\"; done", 4),
    ("exec sleep 100000", 6),
];
const STORE_BYTES: u64 = 1 << 30;
/// Between arms, so the writers dirty the subvolume again and every freeze
/// meets a running workload; checkpoints are further apart than this anyway.
const GAP: Duration = Duration::from_millis(30);

/// One table row: what, (p50, p95) v1, (p50, p95) v2, and the paired ratio.
type Row = (&'static str, (f64, f64), (f64, f64), f64);

#[derive(Default)]
struct Samples {
    freeze: Vec<f64>,
    snapshot: Vec<f64>,
    thaw: Vec<f64>,
    thaw_on_cpu: Vec<f64>,
    artifact: Vec<f64>,
    tasks: Vec<f64>,
    written: Vec<f64>,
}

/// What the bench made, torn down in Drop so an error or panic halfway leaves
/// nothing behind: processes (killed through the cgroup), cgroups,
/// subvolumes, the store's mount and loop device, the temp directory.
struct Scene {
    parent: String,
    cgroup: Option<Cgroup>,
    children: Vec<Child>,
    store: Option<Store>,
    subvolumes: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Drop for Scene {
    fn drop(&mut self) {
        if let Some(cg) = self.cgroup.take() {
            if let Err(e) = cg.remove() {
                eprintln!("drums: removing the bench cgroup: {e}");
            }
        }
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Err(e) = drums_cgroup::remove_parent(&self.parent) {
            eprintln!("drums: removing the bench cgroup parent: {e}");
        }
        for sub in self.subvolumes.drain(..).rev() {
            if let Err(e) = drums_store::delete_subvolume(&sub) {
                eprintln!("drums: deleting {}: {e}", sub.display());
            }
        }
        if let Some(store) = self.store.take() {
            if let Err(e) = store.close() {
                eprintln!("drums: closing the bench store: {e}");
            }
        }
    }
}

fn fail(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::new(exit::INTERNAL, format!("{what}: {e}"))
}

pub fn freeze(n: usize, as_json: bool) -> Result<i32, Failure> {
    if n == 0 {
        return Err(Failure::usage("-n must be at least 1"));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::usage(
            "drums bench freeze needs root (it makes cgroups and a loop-mounted store)",
        ));
    }
    let dir = tempfile::Builder::new()
        .prefix("drums-bench-freeze-")
        .tempdir()
        .map_err(|e| fail("create a temp directory", e))?;
    let mut scene = Scene {
        parent: format!("drums-bench-freeze-{}", std::process::id()),
        cgroup: None,
        children: Vec::new(),
        store: None,
        subvolumes: Vec::new(),
        _dir: dir,
    };
    let state = scene._dir.path().to_path_buf();
    let store = Store::open(&state, STORE_BYTES).map_err(|e| fail("open a btrfs store", e))?;
    let root = store.root().to_path_buf();
    scene.store = Some(store);
    let upper = root.join("upper");
    drums_store::create_subvolume(&upper).map_err(|e| fail("create a subvolume", e))?;
    scene.subvolumes.push(upper.clone());

    let limits = Limits {
        pids_max: Some(512),
        ..Limits::default()
    };
    let cg = Cgroup::create(&scene.parent, "s", &limits, Devices::AllowList)
        .map_err(|e| fail("create the bench cgroup", e))?;
    let procs: Vec<String> = cg
        .procs_files()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    scene.cgroup = Some(cg.clone());
    let mut k = 0;
    for (script, count) in WORKLOAD {
        for _ in 0..count {
            k += 1;
            scene
                .children
                .push(spawn_in(&procs, script, &upper.join(format!("w{k}")))?);
        }
    }
    wait_for_tasks(&cg, k)?;

    // Warm-up: one unmeasured round of each arm.
    let mut previous = 0;
    for how in ARMS {
        artifact(
            &cg,
            how,
            &upper,
            &root,
            "warm",
            &mut scene.subvolumes,
            &mut previous,
        )?;
        std::thread::sleep(GAP);
    }
    let mut samples = [Samples::default(), Samples::default()];
    for round in 0..n {
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let name = format!("r{round}-{}", ARMS[i].name());
            let s = artifact(
                &cg,
                ARMS[i],
                &upper,
                &root,
                &name,
                &mut scene.subvolumes,
                &mut previous,
            )?;
            let arm = &mut samples[i];
            arm.freeze.push(s.freeze);
            arm.snapshot.push(s.snapshot);
            arm.thaw.push(s.thaw);
            arm.thaw_on_cpu.push((s.thaw - s.thaw_waited).max(0.0));
            arm.artifact.push(s.freeze + s.snapshot + s.thaw);
            arm.tasks.push(s.tasks as f64);
            arm.written.push(s.written.bytes as f64);
            std::thread::sleep(GAP);
        }
        if !as_json {
            eprint!(
                "\r\x1b[Kround {}/{n}: freeze v1 {:.2} ms, v2 {:.2} ms",
                round + 1,
                samples[0].freeze[round] * 1e3,
                samples[1].freeze[round] * 1e3
            );
        }
    }
    if !as_json {
        eprintln!();
    }
    drop(scene);
    report(&samples, n, as_json);
    Ok(exit::OK)
}

/// A shell that joins the cgroup in every hierarchy before it runs `script`,
/// so nothing it forks starts outside.
fn spawn_in(procs: &[String], script: &str, file: &Path) -> Result<Child, Failure> {
    let join = procs
        .iter()
        .map(|p| format!("echo $$ > '{p}'"))
        .collect::<Vec<_>>()
        .join(" && ");
    Command::new("sh")
        .arg("-c")
        .arg(format!("{join} && exec sh -c \"$W\""))
        .env("W", script)
        .env("F", file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| fail("start the workload", e))
}

fn wait_for_tasks(cg: &Cgroup, want: usize) -> Result<(), Failure> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let have = cg.pids().map_err(|e| fail("list the bench cgroup", e))?;
        if have.len() >= want {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(fail(
                "start the workload",
                format!("{} of {want} processes joined the cgroup", have.len()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

struct Timed {
    freeze: f64,
    snapshot: f64,
    thaw: f64,
    /// Of `thaw`, the time this thread sat on the run queue: the woken
    /// session's busy tasks preempt the thawing thread, under either freezer.
    thaw_waited: f64,
    tasks: usize,
    written: Written,
}

/// One files artifact with `how`: freeze, read-only snapshot, thaw, timed;
/// then (untimed) the bytes it added and its deletion.
fn artifact(
    cg: &Cgroup,
    how: FreezeMethod,
    upper: &Path,
    root: &Path,
    name: &str,
    subvolumes: &mut Vec<PathBuf>,
    previous: &mut u64,
) -> Result<Timed, Failure> {
    let snap = root.join(name);
    let t0 = Instant::now();
    let frozen = cg
        .freeze(how)
        .map_err(|e| fail(&format!("freeze ({})", how.name()), e))?;
    let t1 = Instant::now();
    drums_store::snapshot(upper, &snap, true).map_err(|e| fail("snapshot", e))?;
    let t2 = Instant::now();
    // Counted while frozen, outside the timed spans.
    let tasks = cg.pids().map_or(0, |p| p.len());
    let waited_before = run_delay();
    let t2b = Instant::now();
    frozen
        .thaw()
        .map_err(|e| fail(&format!("thaw ({})", how.name()), e))?;
    let t3 = Instant::now();
    let waited = run_delay() - waited_before;
    subvolumes.push(snap.clone());
    let info = drums_store::subvolume_info(&snap).map_err(|e| fail("subvolume info", e))?;
    let written =
        drums_store::written_since(&snap, *previous).map_err(|e| fail("written since", e))?;
    *previous = info.created;
    drums_store::delete_subvolume(&snap).map_err(|e| fail("delete snapshot", e))?;
    subvolumes.pop();
    Ok(Timed {
        freeze: (t1 - t0).as_secs_f64(),
        snapshot: (t2 - t1).as_secs_f64(),
        thaw: (t3 - t2b).as_secs_f64(),
        thaw_waited: waited,
        tasks,
        written,
    })
}

fn report(samples: &[Samples; 2], n: usize, as_json: bool) {
    let stats = |v: &[f64]| p50_p95(v.iter().copied());
    // Per-round ratio v2/v1: the noise of one moment hits both arms alike.
    let paired = crate::stats::paired;
    let [v1, v2] = samples;
    let rows: Vec<Row> = vec![
        (
            "freeze (call to frozen)",
            stats(&v1.freeze),
            stats(&v2.freeze),
            paired(&v2.freeze, &v1.freeze),
        ),
        (
            "snapshot (read-only)",
            stats(&v1.snapshot),
            stats(&v2.snapshot),
            paired(&v2.snapshot, &v1.snapshot),
        ),
        (
            "thaw",
            stats(&v1.thaw),
            stats(&v2.thaw),
            paired(&v2.thaw, &v1.thaw),
        ),
        (
            "thaw, minus run-queue wait",
            stats(&v1.thaw_on_cpu),
            stats(&v2.thaw_on_cpu),
            paired(&v2.thaw_on_cpu, &v1.thaw_on_cpu),
        ),
        (
            "files artifact (all three)",
            stats(&v1.artifact),
            stats(&v2.artifact),
            paired(&v2.artifact, &v1.artifact),
        ),
    ];
    let tasks = stats(&[v1.tasks.clone(), v2.tasks.clone()].concat()).0;
    let written = stats(&[v1.written.clone(), v2.written.clone()].concat()).0;
    let freeze_ratio = rows[0].3;
    let artifact_ratio = rows[4].3;
    let faster = |r: f64| if r < 1.0 { "v2" } else { "v1" };
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|(what, a, b, pr)| {
                json!({
                    "what": what,
                    "v1.p50": a.0, "v1.p95": a.1,
                    "v2.p50": b.0, "v2.p95": b.1,
                    "ratio_of_p50_v2_v1": b.0 / a.0,
                    "paired_ratio_p50_v2_v1": pr,
                })
            })
            .collect();
        let out = json!({
            "n": n,
            "tasks_frozen_p50": tasks,
            "bytes_written_per_artifact_p50": written,
            "rows": out,
            "faster_freeze": faster(freeze_ratio),
            "faster_artifact": faster(artifact_ratio),
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("serialize"));
        return;
    }
    let ms = |s: f64| format!("{:.2} ms", s * 1e3);
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(what, a, b, pr)| {
            vec![
                what.to_string(),
                ms(a.0),
                ms(a.1),
                ms(b.0),
                ms(b.1),
                format!("{:.3}", b.0 / a.0),
                format!("{pr:.3}"),
            ]
        })
        .collect();
    println!(
        "drums bench freeze -n {n} (arms interleaved; {tasks:.0} tasks frozen, p50; \
         {written:.0} bytes of file data written per artifact, p50)"
    );
    print!(
        "{}",
        table::render(
            &[
                "",
                "v1 p50",
                "v1 p95",
                "v2 p50",
                "v2 p95",
                "p50 ratio v2/v1",
                "paired ratio v2/v1",
            ],
            &body
        )
    );
    println!(
        "faster by the paired ratio: {} to freeze ({freeze_ratio:.3}), {} for the whole artifact ({artifact_ratio:.3})",
        faster(freeze_ratio),
        faster(artifact_ratio)
    );
}

/// Seconds this thread has waited on a run queue so far (the second field of
/// /proc/thread-self/schedstat), or 0 where schedstats are unavailable.
fn run_delay() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}
