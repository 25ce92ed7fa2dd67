//! One daemon per state directory, enforced by an flock that the kernel drops
//! when the daemon dies, however it dies.

use std::fs::OpenOptions;
use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::Path;

use anyhow::{bail, Context};
use nix::fcntl::{Flock, FlockArg};

pub struct StateLock(#[allow(dead_code)] Flock<std::fs::File>);

pub fn acquire(state_dir: &Path) -> anyhow::Result<StateLock> {
    let path = state_dir.join("drumsd.lock");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut f, _)) => {
            let mut pid = String::new();
            let _ = f.read_to_string(&mut pid);
            bail!(
                "another drumsd (pid {}) already uses state directory {}",
                pid.trim(),
                state_dir.display()
            );
        }
    };
    let _ = lock.as_fd();
    lock.set_len(0).context("truncate lock file")?;
    lock.rewind().context("rewind lock file")?;
    write!(lock, "{}", std::process::id()).context("write pid to lock file")?;
    Ok(StateLock(lock))
}
