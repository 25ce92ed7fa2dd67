//! One watched session: its open window, its baseline, and how a window
//! closes into a turn's effects.

use std::collections::{BTreeMap, BTreeSet};

use drums_api::{DirtiedProcess, FileEffect, ProcessEffect, TurnClass, TurnEffects};

use crate::event::Op;
use crate::procs::{self, Key, Snapshot};
use crate::window::{Holders, Window};
use crate::{InspectError, Target};

pub(crate) struct Watch {
    pub(crate) target: Target,
    /// The number of the last turn begun; `open` while it runs.
    pub(crate) turn: u64,
    pub(crate) open: bool,
    /// Events stamped with a later epoch belong to the next window.
    pub(crate) epoch: u64,
    pub(crate) window: Window,
    pub(crate) next: Window,
    pub(crate) holders: Holders,
    /// The processes at the last boundary.
    pub(crate) baseline: Snapshot,
    /// drums' own processes and marked agents: not tracked as processes.
    pub(crate) excluded: BTreeSet<Key>,
    pub(crate) lost: u64,
    /// Events of this epoch are a checkpoint's own doing (CRIU's parasite
    /// runs inside every process, mapping memory and writing its log).
    pub(crate) discard_epoch: Option<u64>,
    /// The upper layer's contents' btrfs generation at the last boundary.
    pub(crate) generation: Option<u64>,
    /// File events since the upper layer's generation last moved.
    pub(crate) events_since_generation: u64,
}

impl Watch {
    /// Open the next turn.
    pub(crate) fn begin(&mut self, session: &str) -> Result<u64, InspectError> {
        if self.open {
            return Err(InspectError::TurnOpen {
                session: session.to_owned(),
                turn: self.turn,
            });
        }
        self.turn += 1;
        self.open = true;
        Ok(self.turn)
    }

    /// Close the window at a boundary whose processes are `now`.
    pub(crate) fn close(&mut self, now: Snapshot) -> TurnEffects {
        let mut window = std::mem::take(&mut self.window);
        self.window = std::mem::take(&mut self.next);
        self.open = false;

        // The upper layer's contents' btrfs generation (ctransid) moves when
        // its subvolume is committed, up to 30 s after a write: a move with
        // no file event since the previous move is a change the events
        // missed. Not the subvolume's own generation: each version's
        // snapshot of it moves that one, so every turn after a version would
        // report a change, and take a version for it.
        self.events_since_generation += window.file_events;
        if let Some(sv) = self.target.subvolume.as_deref() {
            if let Ok(g) = drums_store::subvolume_changed(sv) {
                if self.generation.is_some_and(|old| old != g) {
                    if self.events_since_generation == 0 {
                        window.unknown(
                            format!("(the upper layer changed with no traced event: generation {} to {g})",
                                self.generation.unwrap_or(0)),
                            Op::Opaque,
                            "inspector",
                        );
                    }
                    // This window's writes may be in a later commit.
                    self.events_since_generation = window.file_events;
                }
                self.generation = Some(g);
            }
        }

        let (mut processes, dirtied) = self.process_effects(&now, &window);
        if window.poisoned {
            processes.push(Found {
                host_pid: 0,
                effect: ProcessEffect {
                    pid: 0,
                    comm: "(unknown: a checkpoint failed)".into(),
                    change: "unknown".into(),
                    exe: None,
                },
            });
        }
        self.holders.retain(|tgid| now.key_of(tgid).is_some());
        let root = format!("/proc/{}/root", self.target.root_pid);
        let root_fd = std::fs::File::open(&root).ok();
        let mut files = window.effects(|p| exists(root_fd.as_ref(), p));
        files.retain(|f| {
            !self
                .target
                .ignore
                .iter()
                .any(|i| f.path == *i || (i.ends_with('/') && f.path.starts_with(i.as_str())))
        });
        // Whatever a process holding a shared mapping or an io_uring could
        // have written, if it ran.
        let ran: BTreeSet<u32> = dirtied
            .iter()
            .map(|d| d.host_pid)
            .chain(processes.iter().map(|p| p.host_pid))
            .collect();
        for tgid in ran {
            if let Some(held) = self.holders.of(tgid) {
                for h in held {
                    files.push(FileEffect {
                        path: h.clone(),
                        change: "unknown".into(),
                        ops: vec!["ran".into()],
                        by: vec![format!("[{tgid}]")],
                    });
                }
            }
        }
        self.baseline = now;
        let processes: Vec<ProcessEffect> = processes.into_iter().map(|p| p.effect).collect();
        let dirtied: Vec<DirtiedProcess> = dirtied.into_iter().map(|d| d.effect).collect();
        TurnEffects {
            session: self.target.session.clone(),
            turn: self.turn,
            class: TurnClass::of(
                !files.is_empty(),
                !processes.is_empty() || !dirtied.is_empty(),
            ),
            files,
            processes,
            dirtied,
            latency_us: 0,
            checkpoint: None,
        }
    }

    /// Whether the tracked processes did nothing since the baseline: the
    /// window shows none start, end, execute or use IPC between the baseline
    /// and `before` (the processes, but running ones, as a pause began), and
    /// none ran then; and from `before` to `frozen` none returned to its own
    /// code (`returned`), took a fault, or ran longer than being frozen takes.
    pub(crate) fn still(
        &self,
        before: &Snapshot,
        frozen: &Snapshot,
        returned: &BTreeSet<u32>,
    ) -> Result<(), String> {
        if self.window.poisoned {
            return Err("a checkpoint failed since the last boundary".into());
        }
        let tracked = |k: &&Key| !self.excluded.contains(*k);
        for (k, p) in self.baseline.procs.iter().filter(|(k, _)| tracked(k)) {
            if now_running(before, frozen, k) {
                return Err(format!("process {} ({}) was running", p.ns_pid, p.comm));
            }
        }
        let (processes, dirtied) = self.process_effects(before, &self.window);
        if let Some(p) = processes.first() {
            let e = &p.effect;
            return Err(format!("process {} ({}): {}", e.pid, e.comm, e.change));
        }
        if let Some(d) = dirtied.first() {
            let e = &d.effect;
            return Err(format!("process {} ({}): {}", e.pid, e.comm, e.reason));
        }
        for (k, f) in frozen.procs.iter().filter(|(k, _)| tracked(k)) {
            let Some(b) = before.procs.get(k) else {
                return Err(format!("process {} ({}) started", f.ns_pid, f.comm));
            };
            if returned.contains(&k.0)
                || f.faults != b.faults
                || f.runtime_ns.saturating_sub(b.runtime_ns) >= crate::RESUME_RUNTIME_NS
            {
                return Err(format!("process {} ({}) ran", f.ns_pid, f.comm));
            }
        }
        Ok(())
    }

    fn process_effects(
        &self,
        now: &Snapshot,
        window: &Window,
    ) -> (Vec<Found<ProcessEffect>>, Vec<Found<DirtiedProcess>>) {
        let tracked = |k: &Key| !self.excluded.contains(k);
        let mut processes = Vec::new();
        for (k, p) in now.procs.iter().filter(|(k, _)| tracked(k)) {
            let change = if !self.baseline.procs.contains_key(k) {
                "spawned"
            } else if window.execs.contains_key(&k.0) {
                "exec"
            } else {
                continue;
            };
            processes.push(process_effect(k, p, change, window.execs.get(&k.0)));
        }
        for (k, p) in self.baseline.procs.iter().filter(|(k, _)| tracked(k)) {
            if !now.procs.contains_key(k) {
                processes.push(process_effect(k, p, "exited", None));
            }
        }
        for (tgid, comm) in &window.ipc {
            processes.push(Found {
                host_pid: *tgid,
                effect: ProcessEffect {
                    pid: now
                        .key_of(*tgid)
                        .or_else(|| self.baseline.key_of(*tgid))
                        .and_then(|k| now.procs.get(&k).or_else(|| self.baseline.procs.get(&k)))
                        .map_or(0, |p| p.ns_pid),
                    comm: comm.clone(),
                    change: "ipc".into(),
                    exe: None,
                },
            });
        }
        let written: BTreeMap<u32, u32> = window.memwrites.iter().copied().collect();
        let mut dirtied = Vec::new();
        for (k, before) in self.baseline.procs.iter().filter(|(k, _)| tracked(k)) {
            let Some(after) = now.procs.get(k) else {
                continue;
            };
            let reason = if after.ran_since(before) {
                "ran".to_owned()
            } else if let Some(by) = written.get(&k.0) {
                format!("written by [{by}]")
            } else {
                continue;
            };
            dirtied.push(Found {
                host_pid: k.0,
                effect: DirtiedProcess {
                    pid: after.ns_pid,
                    comm: after.comm.clone(),
                    cpu_us: after.runtime_ns.saturating_sub(before.runtime_ns) / 1000,
                    faults: after.faults.saturating_sub(before.faults),
                    reason,
                },
            });
        }
        (processes, dirtied)
    }
}

/// An effect, with the host pid it was found under.
struct Found<T> {
    host_pid: u32,
    effect: T,
}

fn process_effect(
    k: &Key,
    p: &procs::Proc,
    change: &str,
    exe: Option<&String>,
) -> Found<ProcessEffect> {
    Found {
        host_pid: k.0,
        effect: ProcessEffect {
            pid: p.ns_pid,
            comm: p.comm.clone(),
            change: change.into(),
            exe: exe.cloned(),
        },
    }
}

/// drums' own processes in a session: its init stages and its guest agent
/// (the guest's children are the session's work, and are tracked).
pub(crate) fn infrastructure(s: &Snapshot) -> BTreeSet<Key> {
    let init: BTreeSet<u32> = s
        .procs
        .iter()
        .filter(|(_, p)| p.comm == "drums-init")
        .map(|(k, _)| k.0)
        .collect();
    s.procs
        .iter()
        .filter(|(_, p)| {
            p.comm == "drums-init" || (p.comm == "drums-guest" && init.contains(&p.ppid))
        })
        .map(|(k, _)| *k)
        .collect()
}

/// Does `path` exist in the session, looked up from its root the way the
/// session's processes would (symlinks stay inside), without following a final
/// symlink. Any answer but "no such file" counts as existing.
fn exists(root: Option<&std::fs::File>, path: &str) -> bool {
    let Some(root) = root else { return true };
    let rel = path.trim_start_matches('/');
    let rel = if rel.is_empty() { "." } else { rel };
    match drums_sys::open_in_root_fd(
        std::os::fd::AsFd::as_fd(root),
        std::path::Path::new(rel),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_NOFOLLOW,
    ) {
        Ok(_) => true,
        Err(e) => !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::ENOTDIR)),
    }
}

/// A process of the baseline that `before` left out (it was running as the
/// pause began) but that is still there, frozen.
fn now_running(before: &Snapshot, frozen: &Snapshot, k: &Key) -> bool {
    !before.procs.contains_key(k) && frozen.procs.contains_key(k)
}
