//! The inspector: what each agent turn did to its session's files and
//! processes, from eBPF, so that only turns that changed something are
//! checkpointed. See docs/inspector.md for the hooks and the rules.
//!
//! The kernel half (`src/bpf/inspect.bpf.c`) reports, per watched cgroup, every
//! successful file mutation with its path, process fork/exec/exit, and on demand
//! a snapshot of the cgroup's tasks with their exact run times. This half folds
//! the events of a window (one turn end to the next) into net effects:
//! - a file is an effect unless it was created in the window and is gone at its
//!   end;
//! - a process is an effect if it is alive at the end and was not at the start,
//!   or the reverse, or it executed a new program;
//! - a process alive at both ends that ran in between may have dirtied memory.
//!
//! What syscalls cannot show (writes through a shared mapping, io_uring, a path
//! that could not be read, events the ring buffer dropped, upper-layer changes
//! no event explains) is reported as a change. Missing a change breaks
//! recovery; a false alarm costs one checkpoint.
//!
//! Modules: `bpf` (the loaded programs and their maps), `event` (decoding
//! their records), `window` (a window's file events and the net-effect
//! rules), `procs` (process snapshots), `watch` (one watched session, and how
//! its window closes into a turn's effects); this file holds the public API.

mod bpf;
mod event;
mod procs;
mod watch;
mod window;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use drums_api::TurnEffects;

use crate::bpf::{Programs, Queue};
use crate::event::{Event, Op};
use crate::procs::Snapshot;
use crate::watch::{infrastructure, Watch};
use crate::window::{Holders, Window};

/// The most run time a process may use while CRIU resumes it and still count
/// as only restarting its interrupted syscall (measured: 10-30 us).
const RESUME_RUNTIME_NS: u64 = 200_000;

/// How long [`Inspector::thawed`] waits at most for thawed processes to be
/// asleep again.
/// On a loaded host a woken thread may wait that long for a CPU; a wait
/// cut short costs a full version (a false alarm), the wait only time.
const THAW_SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

/// How often the ring buffer is drained between turn ends.
const DRAIN_INTERVAL_MS: i32 = 100;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{op}")]
    Bpf {
        op: &'static str,
        #[source]
        source: libbpf_rs::Error,
    },
    #[error("{op}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("turn_end on session {0}: no turn is open (call turn_begin first)")]
    NoTurn(String),
    #[error("turn_begin on session {session}: turn {turn} is still open (call turn_end first)")]
    TurnOpen { session: String, turn: u64 },
    #[error("session {session} died during turn {turn}: none of its processes is left")]
    Died { session: String, turn: u64 },
    #[error("session {0} is not being inspected")]
    NotWatched(String),
    #[error("session {session} has no process {pid}")]
    NoProcess { session: String, pid: i32 },
}

/// A session as the inspector needs to know it.
#[derive(Debug, Clone)]
pub struct Target {
    pub session: String,
    /// The inode of its unified-hierarchy cgroup: what bpf_get_current_cgroup_id
    /// returns for its processes.
    pub cgroup_id: u64,
    /// That cgroup's directory, which its task iterator is attached to.
    pub cgroup_dir: PathBuf,
    /// A process whose root is the session's root, to look paths up from.
    pub root_pid: i32,
    /// The btrfs subvolume holding its upper layer, for the generation check.
    pub subvolume: Option<PathBuf>,
    /// drums' own files in the session (its log, Python reseed registrations),
    /// which are not the session's state: changes to these paths, or below
    /// those ending in '/', are not effects.
    pub ignore: Vec<String>,
}

/// What [`Inspector::freezing`] saw before drums froze a session.
#[derive(Debug)]
pub struct Pause {
    epoch: u64,
    /// The session's tracked processes then, but those with a thread running
    /// or runnable: such a one may have run its own code before the freezer
    /// stopped it, so its cost is never taken back.
    before: Snapshot,
}

/// Loads the BPF programs when the first session is watched and unloads them
/// when the last one stops, so an idle daemon costs the host nothing. Clones
/// share one state.
#[derive(Clone)]
pub struct Inspector {
    shared: Arc<Mutex<State>>,
    session_level: u32,
}

#[derive(Default)]
struct State {
    loaded: Option<Loaded>,
    watches: HashMap<String, Watch>,
    by_cgroup: HashMap<u64, String>,
}

struct Loaded {
    progs: Programs,
    queue: Arc<Queue>,
    undecodable_seen: u64,
    wake: OwnedFd,
    drain: Option<JoinHandle<()>>,
}

impl Inspector {
    /// `session_level`: the depth of session cgroups in the unified hierarchy
    /// (1 for /sys/fs/cgroup/unified/<session>).
    pub fn new(session_level: u32) -> Inspector {
        Inspector {
            shared: Arc::new(Mutex::new(State::default())),
            session_level,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn is_watching(&self, session: &str) -> bool {
        self.state().watches.contains_key(session)
    }

    /// Begin a turn. The first turn of a session starts watching it: the
    /// programs load if needed and its processes now are the baseline.
    pub fn turn_begin(&self, target: &Target) -> Result<u64, InspectError> {
        let mut st = self.state();
        if !st.watches.contains_key(&target.session) {
            st = self.watch_or_unload(st, target)?;
        }
        let w = st.watches.get_mut(&target.session).expect("watched above");
        w.begin(&target.session)
    }

    /// Begin a turn of a session watched already, without its [`Target`]:
    /// `None` unless `session` is watched with its cgroup at `cgroup_dir`,
    /// and the caller then begins with [`Inspector::turn_begin`]. The name
    /// alone does not say the watch is the caller's: it passes to a new
    /// session once the old one is gone. This costs the inspector's lock
    /// and nothing else, no catalog read and no syscall: the coordinator
    /// begins a turn at every model call's answer.
    pub fn turn_begin_watched(
        &self,
        session: &str,
        cgroup_dir: &Path,
    ) -> Option<Result<u64, InspectError>> {
        let mut st = self.state();
        let w = st
            .watches
            .get_mut(session)
            .filter(|w| w.target.cgroup_dir == cgroup_dir)?;
        Some(w.begin(session))
    }

    /// Watch a session; if that fails with nothing else watched, unload the
    /// programs again rather than leave them attached for nobody.
    fn watch_or_unload<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        target: &Target,
    ) -> Result<MutexGuard<'a, State>, InspectError> {
        let Err(e) = self.watch(&mut st, target) else {
            return Ok(st);
        };
        let unloaded = if st.watches.is_empty() {
            st.loaded.take()
        } else {
            None
        };
        drop(st);
        finish_unload(unloaded);
        Err(e)
    }

    fn watch(&self, st: &mut State, target: &Target) -> Result<(), InspectError> {
        if st.loaded.is_none() {
            st.loaded = Some(self.load()?);
        }
        let loaded = st.loaded.as_ref().expect("loaded above");
        loaded.progs.watch(target.cgroup_id, &target.cgroup_dir)?;
        let baseline = match loaded.progs.tasks(target.cgroup_id) {
            Ok(t) => Snapshot::from_tasks(&t, target.cgroup_id),
            Err(e) => {
                loaded.progs.unwatch(target.cgroup_id);
                return Err(e);
            }
        };
        let excluded = infrastructure(&baseline);
        let generation = target
            .subvolume
            .as_deref()
            .and_then(|p| drums_store::subvolume_changed(p).ok());
        st.by_cgroup
            .insert(target.cgroup_id, target.session.clone());
        st.watches.insert(
            target.session.clone(),
            Watch {
                target: target.clone(),
                turn: 0,
                open: false,
                epoch: 0,
                window: Window::default(),
                next: Window::default(),
                holders: Holders::default(),
                baseline,
                excluded,
                lost: 0,
                discard_epoch: None,
                generation,
                events_since_generation: 0,
            },
        );
        Ok(())
    }

    fn load(&self) -> Result<Loaded, InspectError> {
        let queue = Arc::new(Queue::default());
        let progs = Programs::load(self.session_level, queue.clone())?;
        // SAFETY: eventfd returns a new fd we own, or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(InspectError::Io {
                op: "create the inspector's wake-up eventfd",
                source: std::io::Error::last_os_error(),
            });
        }
        // SAFETY: fd is a fresh, valid descriptor owned by nobody else.
        let wake = unsafe { OwnedFd::from_raw_fd(fd) };
        let (events_fd, wake_fd) = (progs.events_fd(), wake.as_raw_fd());
        let shared = Arc::downgrade(&self.shared);
        // Drain the ring buffer on a timer, and early when the programs say
        // it is filling, so a busy turn cannot overflow it; turn_end drains
        // what is left.
        let drain = std::thread::Builder::new()
            .name("inspect-drain".into())
            .spawn(move || loop {
                bpf::wait(events_fd, wake_fd, DRAIN_INTERVAL_MS);
                let Some(shared) = shared.upgrade() else {
                    return;
                };
                let mut st = shared.lock().unwrap_or_else(|p| p.into_inner());
                match &st.loaded {
                    Some(l) if l.wake.as_raw_fd() == wake_fd => {}
                    _ => return, // unloaded: this thread's fds are gone
                }
                if let Err(e) = st.drain() {
                    tracing::warn!("inspector: {e}");
                }
            })
            .map_err(|source| InspectError::Io {
                op: "start the inspector's drain thread",
                source,
            })?;
        Ok(Loaded {
            progs,
            queue,
            undecodable_seen: 0,
            wake,
            drain: Some(drain),
        })
    }

    /// End the open turn and say what its window changed.
    pub fn turn_end(&self, session: &str) -> Result<TurnEffects, InspectError> {
        let started = Instant::now();
        let st = self.state();
        Self::end_locked(st, session, started)
    }

    /// End the open turn of a session watched with its cgroup at
    /// `cgroup_dir`: `None` if it is not (not watched, or its name is
    /// another session's now), and the caller looks the session up again.
    /// [`Inspector::turn_begin_watched`]'s twin, for the same reason.
    pub fn turn_end_watched(
        &self,
        session: &str,
        cgroup_dir: &Path,
    ) -> Option<Result<TurnEffects, InspectError>> {
        let started = Instant::now();
        let st = self.state();
        let ours = st
            .watches
            .get(session)
            .is_some_and(|w| w.target.cgroup_dir == cgroup_dir);
        ours.then(|| Self::end_locked(st, session, started))
    }

    fn end_locked(
        mut st: MutexGuard<'_, State>,
        session: &str,
        started: Instant,
    ) -> Result<TurnEffects, InspectError> {
        let w = st
            .watches
            .get(session)
            .ok_or_else(|| InspectError::NoTurn(session.into()))?;
        if !w.open {
            return Err(InspectError::NoTurn(session.into()));
        }
        let (cgroup, epoch) = (w.target.cgroup_id, w.epoch);
        let loaded = st.loaded.as_ref().expect("a watch implies loaded programs");
        // Later events carry the new epoch and go to the next window; then
        // everything already committed is read.
        loaded.progs.set_epoch(cgroup, epoch + 1, false)?;
        let tasks = loaded.progs.tasks(cgroup)?;
        let lost = loaded.progs.lost(cgroup);
        st.drain()?;
        let w = st.watches.get_mut(session).expect("checked above");
        w.epoch = epoch + 1;
        let now = Snapshot::from_tasks(&tasks, cgroup);
        if now.procs.is_empty() {
            let turn = w.turn;
            let unloaded = st.unwatch(session);
            drop(st);
            finish_unload(unloaded);
            return Err(InspectError::Died {
                session: session.into(),
                turn,
            });
        }
        if lost != w.lost {
            let what = if lost == u64::MAX {
                "(events lost: the watch was removed)".to_owned()
            } else {
                format!("({} events lost: the ring buffer was full)", lost - w.lost)
            };
            w.window.unknown(what, Op::Opaque, "inspector");
            w.lost = lost;
        }
        let mut effects = w.close(now);
        effects.latency_us = started.elapsed().as_micros() as u64;
        Ok(effects)
    }

    /// Exclude a process (by its pid inside the session) and its descendants
    /// of now from process tracking. Processes it starts later are tracked:
    /// they are what the agent does.
    pub fn mark_agent(&self, target: &Target, ns_pid: i32) -> Result<Vec<i32>, InspectError> {
        let mut st = self.state();
        if !st.watches.contains_key(&target.session) {
            st = self.watch_or_unload(st, target)?;
        }
        let tasks = st
            .loaded
            .as_ref()
            .expect("watched")
            .progs
            .tasks(target.cgroup_id)?;
        let w = st.watches.get_mut(&target.session).expect("watched");
        let snap = Snapshot::from_tasks(&tasks, target.cgroup_id);
        let root = snap
            .procs
            .iter()
            .find(|(_, p)| p.ns_pid == ns_pid)
            .map(|(k, _)| *k)
            .ok_or_else(|| InspectError::NoProcess {
                session: target.session.clone(),
                pid: ns_pid,
            })?;
        let tree = snap.tree(root);
        w.excluded.extend(tree.iter().copied());
        Ok(tree.iter().map(|k| snap.procs[k].ns_pid).collect())
    }

    /// A checkpoint of the session is about to dump it. What happens from now
    /// until [`Inspector::checkpointed`] or [`Inspector::checkpoint_failed`] is
    /// CRIU's doing, not the session's: set aside. Returns whether the session
    /// is watched at all.
    pub fn set_aside(&self, session: &str) -> Result<bool, InspectError> {
        let mut st = self.state();
        let Some(w) = st.watches.get_mut(session) else {
            return Ok(false);
        };
        // Before the drain, so that none of them slips into the window.
        w.discard_epoch = Some(w.epoch + 1);
        st.next_epoch(session, false)?;
        Ok(true)
    }

    /// The checkpoint holds the session as it is now, while it is still
    /// frozen: this is a new start for its effects. The window restarts, and
    /// the processes as they are now are the new baseline, until
    /// [`Inspector::resumed`] refines it.
    pub fn checkpointed(&self, session: &str) -> Result<(), InspectError> {
        let mut st = self.state();
        if st.next_epoch(session, true)?.is_none() {
            return Ok(());
        }
        let loaded = st.loaded.as_ref().expect("watched");
        let cgroup = st.watches[session].target.cgroup_id;
        let tasks = loaded.progs.tasks(cgroup)?;
        let baseline = Snapshot::from_tasks(&tasks, cgroup);
        // Empty its processes' notes: they count from now.
        loaded.progs.returned(baseline.tgids());
        let w = st.watches.get_mut(session).expect("watched");
        w.baseline = baseline;
        w.window = Window::default();
        Ok(())
    }

    /// CRIU has let the session run again. Being resumed costs every process
    /// a little run time (its interrupted syscall restarts), which must not
    /// count as its own work, or every turn after a checkpoint would look
    /// stateful. A process's baseline moves to now only if it did nothing
    /// else: it did not return to user space from a syscall meanwhile, took
    /// no page fault, and ran less than [`RESUME_RUNTIME_NS`]. Otherwise the
    /// frozen baseline stays, and the next turn reports it dirtied.
    pub fn resumed(&self, session: &str) -> Result<(), InspectError> {
        let mut st = self.state();
        let Some(w) = st.watches.get(session) else {
            return Ok(());
        };
        let (cgroup, epoch) = (w.target.cgroup_id, w.epoch);
        let loaded = st.loaded.as_ref().expect("watched");
        let tasks = loaded.progs.tasks(cgroup)?;
        loaded.progs.set_epoch(cgroup, epoch, false)?;
        let now = Snapshot::from_tasks(&tasks, cgroup);
        let returned = loaded.progs.returned(now.tgids());
        let w = st.watches.get_mut(session).expect("checked above");
        for (k, frozen) in w.baseline.procs.iter_mut() {
            let Some(n) = now.procs.get(k) else { continue };
            let quiet = !returned.contains(&k.0)
                && n.faults == frozen.faults
                && n.runtime_ns.saturating_sub(frozen.runtime_ns) < RESUME_RUNTIME_NS;
            if quiet {
                *frozen = n.clone();
            }
        }
        Ok(())
    }

    /// drums is about to freeze the session for a moment of its own (to
    /// snapshot a version's files), with no dump: unlike CRIU's, such a
    /// pause is no boundary, and what the processes did before it stays in
    /// the window. Being frozen and thawed costs a sleeping process a wake-up
    /// (it enters the freezer and its syscall restarts), which must not count
    /// as its work, or every turn after a files-only version would look
    /// stateful, and its version be full. [`Inspector::thawed`] takes that
    /// cost back out. None if the session is not watched.
    pub fn freezing(&self, session: &str) -> Result<Option<Pause>, InspectError> {
        let st = self.state();
        let Some(w) = st.watches.get(session) else {
            return Ok(None);
        };
        let (cgroup, epoch) = (w.target.cgroup_id, w.epoch);
        let loaded = st.loaded.as_ref().expect("a watch implies loaded programs");
        // Old notes go first; from here on a process's return to its own
        // code is noted, so one before `before` shows in its run time and
        // one after in `returned`.
        let stale = Snapshot::from_tasks(&loaded.progs.tasks(cgroup)?, cgroup);
        loaded.progs.returned(stale.tgids());
        loaded.progs.set_epoch(cgroup, epoch, true)?;
        let mut before = Snapshot::from_tasks(&loaded.progs.tasks(cgroup)?, cgroup);
        // drums' own processes are no effect, and one running now may be
        // in its own code, where nothing shows what it does.
        before.procs.retain(|k, _| !w.excluded.contains(k));
        let busy = procs::running(&before);
        before.procs.retain(|k, _| !busy.contains(k));
        Ok(Some(Pause { epoch, before }))
    }

    /// The session [`Inspector::freezing`] announced was thawed: a process
    /// that did nothing between then and now but be frozen (no return to its
    /// own code, no signal handler, no page fault, less than
    /// [`RESUME_RUNTIME_NS`] of run time, and no thread running or runnable
    /// when it began) has that cost added to its baseline, so what it did
    /// before the pause still shows and the pause does not. If a boundary
    /// came in between (a turn ended), nothing is taken back: a false alarm
    /// costs one full version, a missed change a recovery.
    pub fn thawed(&self, session: &str, pause: Pause) -> Result<(), InspectError> {
        // A thaw wakes the processes; each then has to run to sleep again,
        // after this returns. A thread asleep before the pause switches twice
        // in all (into the freezer, and back to sleep after it): wait for
        // that, [`THAW_SETTLE`] at most, without the lock. One that is not done by
        // then reports the rest as its work next turn: a false alarm.
        // Read from /proc (the same counters), not the task iterator: it
        // walks every task of the host, and the woken ones need the CPU.
        let t0 = Instant::now();
        let asleep =
            || {
                pause.before.procs.iter().all(|(k, b)| {
                    procs::switches(k.0).is_none_or(|n| n >= b.switches + 2 * b.threads)
                })
            };
        while !asleep() && t0.elapsed() < THAW_SETTLE {
            std::thread::sleep(std::time::Duration::from_micros(250));
        }
        let mut st = self.state();
        let Some(w) = st.watches.get(session) else {
            return Ok(());
        };
        let (cgroup, epoch) = (w.target.cgroup_id, w.epoch);
        let loaded = st.loaded.as_ref().expect("a watch implies loaded programs");
        let tasks = loaded.progs.tasks(cgroup)?;
        loaded.progs.set_epoch(cgroup, epoch, false)?;
        let now = Snapshot::from_tasks(&tasks, cgroup);
        let returned = loaded.progs.returned(now.tgids());
        if epoch != pause.epoch {
            return Ok(());
        }
        let w = st.watches.get_mut(session).expect("checked above");
        for (k, base) in w.baseline.procs.iter_mut() {
            let (Some(b), Some(n)) = (pause.before.procs.get(k), now.procs.get(k)) else {
                continue;
            };
            let only_frozen = !returned.contains(&k.0)
                && n.faults == b.faults
                && n.runtime_ns.saturating_sub(b.runtime_ns) < RESUME_RUNTIME_NS;
            if only_frozen {
                base.runtime_ns += n.runtime_ns.saturating_sub(b.runtime_ns);
                base.switches += n.switches.saturating_sub(b.switches);
            }
        }
        Ok(())
    }

    /// While the session is frozen after [`Inspector::freezing`]: whether its
    /// tracked processes did nothing since the last boundary (a turn's end,
    /// or a dump) but be frozen: none started, ended, executed, used IPC or
    /// ran, and none was running when the pause began. `Err(why)` names one
    /// that did. What they did to files does not matter here.
    pub fn still(&self, session: &str, pause: &Pause) -> Result<Result<(), String>, InspectError> {
        let mut st = self.state();
        let Some(w) = st.watches.get(session) else {
            return Ok(Err("the session is not inspected".into()));
        };
        let cgroup = w.target.cgroup_id;
        let loaded = st.loaded.as_ref().expect("a watch implies loaded programs");
        let tasks = loaded.progs.tasks(cgroup)?;
        let lost = loaded.progs.lost(cgroup);
        st.drain()?;
        let frozen = Snapshot::from_tasks(&tasks, cgroup);
        let loaded = st.loaded.as_ref().expect("a watch implies loaded programs");
        let returned = loaded.progs.returned(frozen.tgids());
        let w = st.watches.get(session).expect("checked above");
        if lost != w.lost {
            return Ok(Err("the inspector lost events".into()));
        }
        Ok(w.still(&pause.before, &frozen, &returned))
    }

    /// The session's files were put back as a version had them, while it was
    /// frozen and its processes [`Inspector::still`]: a new start for its
    /// effects, its processes' baseline as it was, and no turn open (as
    /// after a restore, its turns start again). drumsd's own writes are no
    /// event of the session's, but they move its upper layer's contents'
    /// btrfs generation: they count as one, so that move is no unexplained
    /// change.
    pub fn files_put_back(&self, session: &str) {
        let mut st = self.state();
        if let Some(w) = st.watches.get_mut(session) {
            w.window = Window::default();
            w.open = false;
            w.events_since_generation += 1;
        }
    }

    /// The checkpoint failed after events were set aside: the inspector can no
    /// longer say what the window holds, so its turn reports both kinds of
    /// change.
    pub fn checkpoint_failed(&self, session: &str) -> Result<(), InspectError> {
        let mut st = self.state();
        if st.next_epoch(session, false)?.is_none() {
            return Ok(());
        }
        let w = st.watches.get_mut(session).expect("watched");
        w.discard_epoch = None;
        w.window.unknown(
            "(a checkpoint failed while the inspector set its events aside)".into(),
            Op::Opaque,
            "inspector",
        );
        w.window.poisoned = true;
        Ok(())
    }

    /// The session's open turn, if it is watched and one is open.
    pub fn open_turn(&self, session: &str) -> Option<u64> {
        let st = self.state();
        let w = st.watches.get(session)?;
        w.open.then_some(w.turn)
    }

    /// Stop watching a session; the programs unload with the last one.
    pub fn unwatch(&self, session: &str) {
        let unloaded = self.state().unwatch(session);
        finish_unload(unloaded);
    }

    /// Whether the BPF programs are loaded (for tests and `drums bench`).
    pub fn loaded(&self) -> bool {
        self.state().loaded.is_some()
    }
}

/// Stop an unloaded program set's drain thread, then free it. Called without
/// the state lock: the thread needs it to see that it must stop.
fn finish_unload(unloaded: Option<Loaded>) {
    if let Some(mut l) = unloaded {
        let _ = nix::unistd::write(&l.wake, &1u64.to_ne_bytes());
        if let Some(t) = l.drain.take() {
            let _ = t.join();
        }
    }
}

impl State {
    /// Start a new epoch for a watched session and read everything of the old
    /// one; the new epoch, or None when the session is not watched.
    fn next_epoch(&mut self, session: &str, resuming: bool) -> Result<Option<u64>, InspectError> {
        let Some(w) = self.watches.get(session) else {
            return Ok(None);
        };
        let (cgroup, epoch) = (w.target.cgroup_id, w.epoch + 1);
        let loaded = self
            .loaded
            .as_ref()
            .expect("a watch implies loaded programs");
        loaded.progs.set_epoch(cgroup, epoch, resuming)?;
        self.drain()?;
        let w = self.watches.get_mut(session).expect("checked above");
        // Events stamped with the new epoch that the drain already read went
        // to `next`; they belong to the window from now on.
        let next = std::mem::take(&mut w.next);
        w.window.absorb(next);
        w.epoch = epoch;
        Ok(Some(epoch))
    }

    /// Forget a session; when it was the last, hand back the programs to unload.
    fn unwatch(&mut self, session: &str) -> Option<Loaded> {
        let w = self.watches.remove(session)?;
        self.by_cgroup.remove(&w.target.cgroup_id);
        if let Some(l) = &self.loaded {
            l.progs.unwatch(w.target.cgroup_id);
        }
        if self.watches.is_empty() {
            self.loaded.take()
        } else {
            None
        }
    }

    /// Read the ring buffer and apply every event to its session's window.
    fn drain(&mut self) -> Result<(), InspectError> {
        let Some(l) = &mut self.loaded else {
            return Ok(());
        };
        l.progs.consume()?;
        let events: Vec<Event> = std::mem::take(&mut *l.queue.events.lock().unwrap());
        let undecodable = l
            .queue
            .undecodable
            .load(std::sync::atomic::Ordering::Relaxed);
        let bad = undecodable != l.undecodable_seen;
        l.undecodable_seen = undecodable;
        for ev in &events {
            let Some(session) = self.by_cgroup.get(&ev.cgroup) else {
                continue; // a session unwatched since
            };
            if let Some(w) = self.watches.get_mut(session) {
                w.holders.apply(ev);
                let win = if ev.epoch > w.epoch {
                    &mut w.next
                } else {
                    &mut w.window
                };
                win.apply(ev);
            }
        }
        if bad {
            for w in self.watches.values_mut() {
                w.window.unknown(
                    "(an event could not be decoded)".into(),
                    Op::Opaque,
                    "inspector",
                );
            }
        }
        Ok(())
    }
}
