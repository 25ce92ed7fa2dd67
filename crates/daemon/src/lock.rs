//! One daemon per state directory, enforced by an flock that the kernel drops
//! when the daemon dies, however it dies.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

pub struct StateLock(#[allow(dead_code)] Flock<File>);

/// Taking the state directory's lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("open {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another drumsd (pid {pid}) already uses state directory {}", state_dir.display())]
    Held { pid: String, state_dir: PathBuf },
    /// Writing drumsd's pid into the lock file: `op` is "truncate lock file",
    /// "rewind lock file" or "write pid to lock file".
    #[error("{op}")]
    WritePid {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// How long a lock whose daemon is dead may stay held. A child that drumsd
/// forked keeps the lock's open file until it execs or exits: one caught
/// between the two when drumsd was killed holds it a moment longer (seen
/// after `kill -9` in the eval). A live daemon's lock is refused at once.
const DEAD_HOLDER_GRACE: Duration = Duration::from_secs(10);

pub fn acquire(state_dir: &Path) -> Result<StateLock, LockError> {
    let path = state_dir.join("drumsd.lock");
    let until = Instant::now() + DEAD_HOLDER_GRACE;
    let mut lock = loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|source| LockError::Open {
                path: path.clone(),
                source,
            })?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((mut f, _)) => {
                let mut pid = String::new();
                let _ = f.read_to_string(&mut pid);
                let pid = pid.trim().to_owned();
                if holder_is_dead(&pid) && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                return Err(LockError::Held {
                    pid,
                    state_dir: state_dir.to_owned(),
                });
            }
        }
    };
    let failed = |op| move |source| LockError::WritePid { op, source };
    lock.set_len(0).map_err(failed("truncate lock file"))?;
    lock.rewind().map_err(failed("rewind lock file"))?;
    write!(lock, "{}", std::process::id()).map_err(failed("write pid to lock file"))?;
    Ok(StateLock(lock))
}

/// The daemon that wrote its pid into the lock is gone (a pid reused since
/// by another process counts as alive: the wait is only a courtesy).
fn holder_is_dead(pid: &str) -> bool {
    pid.parse::<i32>()
        .is_ok_and(|p| p > 0 && !Path::new(&format!("/proc/{p}")).exists())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Holds the state lock through an open file description of its own, as a
    /// forked child of a dead daemon would, with `pid` written in it.
    fn held_by(dir: &Path, pid: u32) -> Flock<File> {
        let mut f = File::create(dir.join("drumsd.lock")).unwrap();
        write!(f, "{pid}").unwrap();
        Flock::lock(f, FlockArg::LockExclusiveNonblock).unwrap()
    }

    fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        c.id()
    }

    #[test]
    fn a_dead_daemons_lock_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let held = held_by(dir.path(), dead_pid());
        let letgo = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(held);
        });
        let got = acquire(dir.path()).expect("the lock, once let go");
        letgo.join().unwrap();
        let pid = std::fs::read_to_string(dir.path().join("drumsd.lock")).unwrap();
        assert_eq!(pid, std::process::id().to_string());
        drop(got);
    }

    #[test]
    fn a_live_daemons_lock_is_refused_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let _held = held_by(dir.path(), std::process::id());
        let t = Instant::now();
        let e = acquire(dir.path()).err().expect("refused");
        assert!(
            e.to_string().contains("already uses state directory"),
            "{e}"
        );
        assert!(t.elapsed() < DEAD_HOLDER_GRACE, "refused without the wait");
    }
}
