//! Freezing a session's cgroup, so that a files artifact (a read-only btrfs
//! snapshot of the session's upper layer) sees no torn write.
//!
//! Two kernel mechanisms can do it, and both are correct for that purpose:
//!
//! - **V2**, `cgroup.freeze` in the session's unified (v2) directory. The kernel
//!   sets a freeze trap on every task of the cgroup and kicks it; each task
//!   stops itself the next time it would return to user space. When the last one
//!   has stopped, `cgroup.events` says `frozen 1` and the kernel notifies pollers
//!   of that file (POLLPRI, and inotify IN_MODIFY: both fire on 6.18; poll is
//!   used because its wake-up is direct, while inotify goes through a work item).
//!   Notifications of one file are rate-limited to one per 10 ms; a later one is
//!   delayed, never dropped, so waiting on them is correct but can cost up to
//!   10 ms when the previous change of `cgroup.events` was that recent.
//! - **V1**, the freezer controller's `freezer.state`. The kernel marks every
//!   task freezing and wakes it; a task freezes in the refrigerator on its way
//!   back to user space, or right where it sleeps if that sleep is marked
//!   freezable. The state is FROZEN only once every task is, and the kernel
//!   computes that when `freezer.state` is read: there is no notification, so
//!   the file is polled, with a backoff from 100 µs (CRIU polls every 100 ms,
//!   which is where most of its freeze time goes).
//!
//! Why either makes the snapshot consistent:
//! - A frozen task runs no user code, so it issues no write and no fork. Both
//!   freezers are hierarchical and also freeze every descendant cgroup.
//! - A child forked while the freeze is in progress cannot escape. v2: the fork
//!   path checks the cgroup's freeze flag after linking the child into the
//!   cgroup (cgroup_post_fork), so the child starts with the trap set and is
//!   counted before `frozen` can become 1. v1: freezer_fork freezes a child born
//!   into a FREEZING cgroup. In both, "frozen" is only reported for the set of
//!   tasks that exists at that moment, and that set can no longer grow. The
//!   tests freeze a fork loop and check that nothing runs.
//! - A task in uninterruptible sleep (D) holds the freeze up. v2 never stops a
//!   task inside the kernel: `frozen` stays 0 until the sleep ends and the task
//!   reaches user space, so a write that is in progress completes before the
//!   task freezes; a task blocked for good (a frozen file system, a dead NFS
//!   server) makes the freeze time out, which is then an error naming the
//!   cgroup. v1 also freezes tasks in sleeps marked freezable, and is held up by
//!   the others. On 6.18 that includes writers blocked on a frozen file system
//!   (in mnt_want_write on open, in page_mkwrite on an mmap store; checked by
//!   hand): v1 froze them, v2 stayed at `frozen 0`. Those waits come before the
//!   call changes the file, so a snapshot still sees whole calls.
//!   A fatal signal still kills a frozen task under both.
//! - A btrfs snapshot flushes the source's delalloc (dirty page cache) before
//!   it is taken, so buffered writes that completed before the freeze are in it.
//!
//! Not correct, and so not offered:
//! - SIGSTOP to every process: the set of processes can change between listing
//!   and signalling (a fork in between escapes), a stopped task's parent is told
//!   (SIGCHLD, waitpid WUNTRACED) and the session sees its own state change, and
//!   a SIGCONT from inside the session resumes it.
//! - ptrace seize/interrupt of every task (what CRIU does without a freezer
//!   cgroup): it needs repeated rescans to catch forks, one syscall pair per
//!   task, and fails if a debugger in the session already traces a task.
//!
//! Using a freeze next to CRIU: do not hold a [`Frozen`] across a CRIU dump.
//! CRIU freezes the cgroup itself, seizes every task with ptrace, and then
//! thaws the cgroup (a task must run to execute CRIU's parasite code; a task in
//! the v2 freeze trap cannot reach a ptrace stop until thawed), restoring an
//! earlier FROZEN only at the end. The tree stays stopped under ptrace during
//! the post-dump notification, which is where a snapshot consistent with the
//! process image belongs. The two freezers also do not stack: tasks frozen by
//! v1 cannot enter the v2 trap, so a V2 freeze of a V1-frozen cgroup times out.
//! [`Cgroup::kill_all`] on v1 freezes and thaws, and so ends a V1 freeze.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::{write_file, Cgroup, CgroupError, Kind};

/// How long [`Cgroup::freeze`] waits for the cgroup to report frozen.
pub const FREEZE_TIMEOUT: Duration = Duration::from_secs(5);
/// The first pause between reads of `freezer.state`; it doubles up to
/// [`V1_POLL_MAX`]. Most cgroups freeze within a few ms, so a coarse step
/// would be most of the latency.
const V1_POLL_START: Duration = Duration::from_micros(100);
const V1_POLL_MAX: Duration = Duration::from_millis(2);
/// How often a v1 freeze that has not completed is requested again. A task can
/// miss its wake-up and leave the cgroup FREEZING; writing FROZEN again kicks
/// the tasks still running (CRIU does the same, for the same reason). The write
/// is idempotent for tasks already frozen.
const V1_REKICK: Duration = Duration::from_millis(10);

/// Which kernel freezer to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreezeMethod {
    /// `cgroup.freeze` in the v2 (or unified) hierarchy, waiting on
    /// `cgroup.events` notifications.
    V2,
    /// The v1 freezer controller's `freezer.state`, polled.
    V1,
}

impl FreezeMethod {
    pub fn name(self) -> &'static str {
        match self {
            FreezeMethod::V2 => "v2",
            FreezeMethod::V1 => "v1",
        }
    }
}

/// A frozen cgroup. Dropping it thaws the cgroup (logging a failure);
/// [`Frozen::thaw`] does the same and returns the error.
#[must_use = "the cgroup is thawed as soon as the guard is dropped"]
#[derive(Debug)]
pub struct Frozen<'a> {
    cgroup: &'a Cgroup,
    method: FreezeMethod,
    control: PathBuf,
    thawed: bool,
}

impl Frozen<'_> {
    pub fn method(&self) -> FreezeMethod {
        self.method
    }

    /// The cgroup that is frozen.
    pub fn cgroup(&self) -> &Cgroup {
        self.cgroup
    }

    /// Thaw the cgroup. Tasks are runnable again when this returns: both
    /// freezers wake every task in the write itself.
    pub fn thaw(mut self) -> Result<(), CgroupError> {
        self.thawed = true;
        thaw(self.method, &self.control)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if self.thawed {
            return;
        }
        if let Err(e) = thaw(self.method, &self.control) {
            tracing::warn!(error = %e, "thawing cgroup");
        }
    }
}

impl Cgroup {
    /// Thaw the cgroup if either freezer holds it: a drumsd killed while a
    /// checkpoint had its session frozen leaves it so, and the next one
    /// adopts the session. Returns whether it was frozen.
    pub fn thaw_if_frozen(&self) -> Result<bool, CgroupError> {
        let mut was = false;
        for (kind, dir) in &self.dirs {
            let (control, how, thawed) = match kind {
                k if k.is_v2() => (dir.join("cgroup.freeze"), FreezeMethod::V2, "0"),
                Kind::Freezer => (dir.join("freezer.state"), FreezeMethod::V1, "THAWED"),
                _ => continue,
            };
            let state = std::fs::read_to_string(&control).map_err(|source| CgroupError::Read {
                path: control.clone(),
                source,
            })?;
            if state.trim() != thawed {
                was = true;
                thaw(how, &control)?;
            }
        }
        Ok(was)
    }

    /// Freeze every process of the cgroup (and of its descendants) with `how`,
    /// waiting at most [`FREEZE_TIMEOUT`] until the kernel reports it frozen.
    /// On a timeout the cgroup is thawed again and the error names it.
    pub fn freeze(&self, how: FreezeMethod) -> Result<Frozen<'_>, CgroupError> {
        self.freeze_within(how, FREEZE_TIMEOUT)
    }

    /// [`Cgroup::freeze`] with another deadline.
    pub fn freeze_within(
        &self,
        how: FreezeMethod,
        timeout: Duration,
    ) -> Result<Frozen<'_>, CgroupError> {
        let dir = self
            .dirs
            .iter()
            .find(|(kind, _)| match how {
                FreezeMethod::V2 => kind.is_v2(),
                FreezeMethod::V1 => *kind == Kind::Freezer,
            })
            .map(|(_, dir)| dir)
            .ok_or(CgroupError::NoFreezer { method: how.name() })?;
        let deadline = Instant::now() + timeout;
        let (control, waited) = match how {
            FreezeMethod::V2 => {
                let control = dir.join("cgroup.freeze");
                let waited = freeze_v2(dir, &control, deadline);
                (control, waited)
            }
            FreezeMethod::V1 => {
                let control = dir.join("freezer.state");
                let waited = write_file(&control, "FROZEN")
                    .map_err(Waited::from)
                    .and_then(|()| wait_v1_frozen(&control, deadline, true));
                (control, waited)
            }
        };
        // A freeze that did not complete must not leave the session stuck
        // halfway: thaw before reporting.
        if let Err(e) = waited {
            if let Err(thaw_error) = thaw(how, &control) {
                tracing::warn!(error = %thaw_error, "thawing after a failed freeze");
            }
            return Err(match e {
                Waited::Timeout { state } => CgroupError::FreezeTimeout {
                    path: dir.clone(),
                    method: how.name(),
                    timeout,
                    state,
                },
                Waited::Failed(e) => e,
            });
        }
        tracing::debug!(path = %dir.display(), method = how.name(), "froze cgroup");
        Ok(Frozen {
            cgroup: self,
            method: how,
            control,
            thawed: false,
        })
    }
}

/// Why a wait for frozen ended without it.
#[derive(Debug)]
pub(crate) enum Waited {
    /// The deadline passed; the last state read, for the error.
    Timeout {
        state: String,
    },
    Failed(CgroupError),
}

impl From<CgroupError> for Waited {
    fn from(e: CgroupError) -> Waited {
        Waited::Failed(e)
    }
}

fn thaw(how: FreezeMethod, control: &Path) -> Result<(), CgroupError> {
    match how {
        FreezeMethod::V2 => write_file(control, "0"),
        FreezeMethod::V1 => write_file(control, "THAWED"),
    }
}

/// Write `1` to `cgroup.freeze` and wait for `frozen 1` in `cgroup.events`.
fn freeze_v2(dir: &Path, control: &Path, deadline: Instant) -> Result<(), Waited> {
    let events_path = dir.join("cgroup.events");
    // Opened (and read, below) before the write: kernfs reports POLLPRI for
    // every notification after the last read through this file, so one that
    // fires between the write and the poll is not lost.
    let events = File::open(&events_path).map_err(|source| CgroupError::Read {
        path: events_path.clone(),
        source,
    })?;
    read_events(&events, &events_path)?;
    write_file(control, "1")?;
    loop {
        let text = read_events(&events, &events_path)?;
        match frozen_field(&text) {
            Some(true) => return Ok(()),
            Some(false) => {}
            None => {
                return Err(CgroupError::Parse {
                    path: events_path,
                    content: text,
                }
                .into())
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Waited::Timeout {
                state: text.trim().replace('\n', ", "),
            });
        }
        // Round up, so a sub-millisecond rest does not become a busy loop.
        let ms = (deadline - now).as_micros().div_ceil(1000);
        let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(events.as_fd(), PollFlags::POLLPRI)];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(errno) => {
                return Err(CgroupError::Poll {
                    path: events_path,
                    source: errno.into(),
                }
                .into())
            }
        }
    }
}

/// The whole of `cgroup.events`, read from the start (kernfs files are small
/// and produced in one go).
fn read_events(file: &File, path: &Path) -> Result<String, CgroupError> {
    let mut buf = [0u8; 256];
    let n = file
        .read_at(&mut buf, 0)
        .map_err(|source| CgroupError::Read {
            path: path.into(),
            source,
        })?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// The `frozen` line of `cgroup.events`, if there is one.
fn frozen_field(events: &str) -> Option<bool> {
    events.lines().find_map(|line| match line.split_once(' ')? {
        ("frozen", "1") => Some(true),
        ("frozen", "0") => Some(false),
        _ => None,
    })
}

/// Poll a v1 `freezer.state` until it reads FROZEN, with a backoff from 100 µs
/// and, when `rekick`, a fresh FROZEN request every [`V1_REKICK`].
pub(crate) fn wait_v1_frozen(state: &Path, deadline: Instant, rekick: bool) -> Result<(), Waited> {
    let mut pause = V1_POLL_START;
    let mut last_kick = Instant::now();
    loop {
        let text = std::fs::read_to_string(state).map_err(|source| CgroupError::Read {
            path: state.into(),
            source,
        })?;
        let text = text.trim();
        if text == "FROZEN" {
            return Ok(());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Waited::Timeout {
                state: text.to_owned(),
            });
        }
        if rekick && now - last_kick >= V1_REKICK {
            write_file(state, "FROZEN")?;
            last_kick = now;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(V1_POLL_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_field_parses_cgroup_events() {
        assert_eq!(frozen_field("populated 1\nfrozen 1\n"), Some(true));
        assert_eq!(frozen_field("populated 0\nfrozen 0\n"), Some(false));
        assert_eq!(frozen_field("populated 1\n"), None);
    }

    /// The v1 wait gives up at its deadline with the last state it read (a
    /// plain file stands in for a freezer.state stuck at FREEZING; a real one
    /// needs a task in a non-freezable uninterruptible sleep).
    #[test]
    fn v1_wait_times_out_with_the_state() {
        let dir = std::env::temp_dir().join(format!("drums-freeze-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = dir.join("freezer.state");
        std::fs::write(&state, "FREEZING\n").unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(30);
        match wait_v1_frozen(&state, deadline, false) {
            Err(Waited::Timeout { state }) => assert_eq!(state, "FREEZING"),
            other => panic!("unexpected {other:?}"),
        }
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(30), "{took:?}");
        assert!(took < Duration::from_millis(500), "{took:?}");
        std::fs::write(&state, "FROZEN\n").unwrap();
        wait_v1_frozen(&state, Instant::now(), false).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
