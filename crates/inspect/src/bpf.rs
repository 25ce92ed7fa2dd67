//! The loaded BPF programs and their maps: what the rest of the crate needs from
//! libbpf, and nothing else.

use std::io::Read;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use libbpf_rs::skel::{OpenSkel, Skel, SkelBuilder};
use libbpf_rs::{Iter, Link, MapCore, MapFlags, OpenObject, RingBuffer, RingBufferBuilder};

use crate::event::{decode, Event};
use crate::InspectError;

mod skel {
    #![allow(clippy::all, unused, non_camel_case_types, non_snake_case)]
    include!(concat!(env!("OUT_DIR"), "/inspect.skel.rs"));
}
pub use skel::types;

/// Where drumsd mounts tracefs and bpffs when the host has not.
const TRACEFS: &str = "/sys/kernel/tracing";
const BPFFS: &str = "/sys/fs/bpf";
const TRACEFS_MAGIC: i64 = 0x7472_6163;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Events decoded by the ring buffer's callback, waiting to be applied.
#[derive(Default)]
pub struct Queue {
    pub events: Mutex<Vec<Event>>,
    /// Records that did not decode: their session is unknown, so every
    /// watched session must assume it missed something.
    pub undecodable: AtomicU64,
}

pub struct Programs {
    // Field order is drop order: the ring buffer and links before the skeleton,
    // the skeleton before the object storage it borrows.
    rb: ManuallyDrop<RingBuffer<'static>>,
    iter: ManuallyDrop<Link>,
    skel: ManuallyDrop<skel::InspectSkel<'static>>,
    storage: *mut MaybeUninit<OpenObject>,
    mounted: Vec<PathBuf>,
}

// SAFETY: libbpf objects are not tied to the thread that created them; the
// inspector only touches Programs under its state mutex.
unsafe impl Send for Programs {}

impl Programs {
    /// Mount tracefs and bpffs if absent, then load and attach everything.
    /// `session_level` is the depth of session cgroups in the unified hierarchy.
    pub fn load(session_level: u32, queue: Arc<Queue>) -> Result<Programs, InspectError> {
        let mut mounted = Vec::new();
        for (fs, at, magic) in [
            ("tracefs", TRACEFS, TRACEFS_MAGIC),
            ("bpf", BPFFS, BPF_FS_MAGIC),
        ] {
            if mount_if_absent(fs, Path::new(at), magic)? {
                mounted.push(PathBuf::from(at));
            }
        }
        let storage = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
        match Self::open(storage, session_level, queue) {
            Ok((rb, iter, skel)) => Ok(Programs {
                rb: ManuallyDrop::new(rb),
                iter: ManuallyDrop::new(iter),
                skel: ManuallyDrop::new(skel),
                storage,
                mounted,
            }),
            Err(e) => {
                // SAFETY: nothing borrows the storage any more: open() failed
                // and dropped whatever it had built on it.
                drop(unsafe { Box::from_raw(storage) });
                unmount_all(&mounted);
                Err(e)
            }
        }
    }

    #[allow(clippy::type_complexity)]
    fn open(
        storage: *mut MaybeUninit<OpenObject>,
        session_level: u32,
        queue: Arc<Queue>,
    ) -> Result<(RingBuffer<'static>, Link, skel::InspectSkel<'static>), InspectError> {
        let op = |op: &'static str| move |source| InspectError::Bpf { op, source };
        // SAFETY: the storage is a live heap allocation that outlives the
        // skeleton: Programs drops the skeleton before freeing it.
        let storage: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *storage };
        let mut open = skel::InspectSkelBuilder::default()
            .open(storage)
            .map_err(op("open the BPF object"))?;
        if let Some(ro) = open.maps.rodata_data.as_deref_mut() {
            ro.session_level = session_level;
        }
        let mut skel = open.load().map_err(op("load the BPF programs"))?;
        skel.attach().map_err(op("attach the BPF programs"))?;
        // attach() makes the iterator's link too; it is kept apart because
        // every snapshot is a new read of it.
        let iter = match skel.links.dump_task.take() {
            Some(link) => link,
            None => skel
                .progs
                .dump_task
                .attach()
                .map_err(op("attach the task iterator"))?,
        };
        let mut builder = RingBufferBuilder::new();
        builder
            .add(&skel.maps.events, move |data: &[u8]| {
                match decode(data) {
                    Ok(ev) => queue.events.lock().unwrap().push(ev),
                    Err(_) => {
                        queue.undecodable.fetch_add(1, Ordering::Relaxed);
                    }
                }
                0
            })
            .map_err(op("add the ring buffer"))?;
        let rb = builder.build().map_err(op("build the ring buffer"))?;
        Ok((rb, iter, skel))
    }

    /// The fd to poll for new events.
    pub fn events_fd(&self) -> RawFd {
        self.rb.epoll_fd()
    }

    /// Move every committed event into the queue.
    pub fn consume(&self) -> Result<(), InspectError> {
        self.rb.consume().map_err(|source| InspectError::Bpf {
            op: "read the ring buffer",
            source,
        })
    }

    /// Start reporting a cgroup's events, in epoch 0.
    pub fn watch(&self, cgroup: u64) -> Result<(), InspectError> {
        let key = cgroup.to_ne_bytes();
        self.skel
            .maps
            .lost
            .update(&key, &0u64.to_ne_bytes(), MapFlags::ANY)
            .and_then(|()| {
                self.skel
                    .maps
                    .sessions
                    .update(&key, &0u64.to_ne_bytes(), MapFlags::ANY)
            })
            .map_err(|source| InspectError::Bpf {
                op: "add the cgroup to the watched map",
                source,
            })
    }

    pub fn unwatch(&self, cgroup: u64) {
        let key = cgroup.to_ne_bytes();
        let _ = self.skel.maps.sessions.delete(&key);
        let _ = self.skel.maps.lost.delete(&key);
    }

    /// Start a new epoch for a cgroup: events after this carry it.
    pub fn set_epoch(&self, cgroup: u64, epoch: u64) -> Result<(), InspectError> {
        self.skel
            .maps
            .sessions
            .update(&cgroup.to_ne_bytes(), &epoch.to_ne_bytes(), MapFlags::EXIST)
            .map_err(|source| InspectError::Bpf {
                op: "start a new epoch",
                source,
            })
    }

    /// How many of a cgroup's events the ring buffer had no room for.
    pub fn lost(&self, cgroup: u64) -> u64 {
        match self.skel.maps.lost.lookup(&cgroup.to_ne_bytes(), MapFlags::ANY) {
            Ok(Some(v)) if v.len() == 8 => u64::from_ne_bytes(v.try_into().unwrap()),
            // Gone from the map: we cannot know, so assume the worst.
            _ => u64::MAX,
        }
    }

    /// One record per task of every watched cgroup, read through the task
    /// iterator: a consistent snapshot in one read, with exact run times.
    pub fn tasks(&self) -> Result<Vec<types::task_rec>, InspectError> {
        let mut it = Iter::new(&self.iter).map_err(|source| InspectError::Bpf {
            op: "create a task iterator",
            source,
        })?;
        let mut buf = Vec::with_capacity(64 * std::mem::size_of::<types::task_rec>());
        it.read_to_end(&mut buf)
            .map_err(|source| InspectError::Io {
                op: "read the task iterator",
                source,
            })?;
        let n = std::mem::size_of::<types::task_rec>();
        Ok(buf
            .chunks_exact(n)
            // SAFETY: each chunk is one task_rec's bytes, written by dump_task;
            // the type is plain integers.
            .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<types::task_rec>()) })
            .collect())
    }
}

impl Drop for Programs {
    fn drop(&mut self) {
        // SAFETY: each field is dropped once, here, in borrow order; the
        // storage was made by Box::into_raw in load() and nothing uses it after
        // the skeleton is gone.
        unsafe {
            ManuallyDrop::drop(&mut self.rb);
            ManuallyDrop::drop(&mut self.iter);
            ManuallyDrop::drop(&mut self.skel);
            drop(Box::from_raw(self.storage));
        }
        unmount_all(&self.mounted);
    }
}

fn mount_if_absent(fs: &str, at: &Path, magic: i64) -> Result<bool, InspectError> {
    let is = nix::sys::statfs::statfs(at)
        .map(|s| s.filesystem_type().0 as i64 == magic)
        .unwrap_or(false);
    if is {
        return Ok(false);
    }
    nix::mount::mount(
        Some(fs),
        at,
        Some(fs),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| InspectError::Io {
        op: if fs == "bpf" { "mount bpffs" } else { "mount tracefs" },
        source: e.into(),
    })?;
    Ok(true)
}

/// Unmount what load() mounted, so a daemon leaves the host as it found it.
fn unmount_all(mounted: &[PathBuf]) {
    for m in mounted.iter().rev() {
        if let Err(e) = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH) {
            tracing::warn!("unmount {}: {e}", m.display());
        }
    }
}

/// Is `fd` readable within `timeout_ms`, or was `wake` signalled?
pub fn wait(fd: RawFd, wake: RawFd, timeout_ms: i32) -> bool {
    let mut fds = [
        libc::pollfd { fd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: wake, events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: fds is a valid array of two pollfd for the call's duration.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
    n > 0 && fds[0].revents != 0
}
