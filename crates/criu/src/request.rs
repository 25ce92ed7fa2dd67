//! Every CRIU option drums sets, in one place (STYLE habit 9).
//!
//! Each option carries the reason it is set; most reasons are errors that
//! CRIU 4.2.1 gave on this kernel for real sessions (see
//! shared/notes/criu-on-this-kernel.md). Options not set here keep CRIU's
//! defaults on purpose. Change an option here, never at a call site.

use std::os::fd::RawFd;

use rust_criu::rust_criu_protobuf::rpc::{
    Criu_network_lock_method, Criu_opts, Criu_req, Criu_req_type, Criu_veth_pair, Ext_mount_map,
};

use crate::{DumpOpts, NetworkLock, RestoreOpts};

/// Written into the images directory: the log belongs with the image it explains.
pub const DUMP_LOG: &str = "dump.log";
/// Written into the per-restore work dir: the images directory is shared by
/// concurrent restores and is used read-only.
pub const RESTORE_LOG: &str = "restore.log";
/// Largest unlinked-but-open ("ghost") file CRIU copies into the image: as
/// large as RPC's uint32 can say. A session's disk quota already bounds what
/// it can write; a lower limit only failed checkpoints of ordinary
/// workloads (a download held in a temporary file, a database's temp store).
pub const GHOST_LIMIT: u32 = u32::MAX;
/// CRIU log level 4 (debug): a failed dump or restore is explained only by the
/// lines before the error, and the cost (a few MiB per desktop dump) is small.
pub const LOG_LEVEL: i32 = 4;

fn lock_method(l: NetworkLock) -> Criu_network_lock_method {
    match l {
        NetworkLock::Skip => Criu_network_lock_method::SKIP,
        NetworkLock::Nftables => Criu_network_lock_method::NFTABLES,
    }
}

/// The DUMP request for `o`, with the images directory passed as an fd that
/// stays open in this process until the dump ends (CRIU opens it through
/// `/proc/<our pid>/fd/<fd>`).
pub(crate) fn dump_request(o: &DumpOpts, images_dir_fd: RawFd) -> Criu_req {
    let mut c = Criu_opts::new();
    c.set_images_dir_fd(images_dir_fd);
    c.set_pid(o.pid);
    // The caller decides: drums keeps a session running after a checkpoint,
    // a migration would not.
    c.set_leave_running(o.leave_running);
    // Debug log next to the image; CRIU's errno alone rarely explains a failure.
    c.set_log_level(LOG_LEVEL);
    c.set_log_file(DUMP_LOG.to_string());
    // Without this CRIU sends no notifications, and post-dump is where drums
    // snapshots the session's files while the tree is still frozen.
    c.set_notify_scripts(true);
    // Sessions are their own session leader inside their pid namespace and
    // have no controlling terminal of ours; shell_job would let a tree whose
    // sid/pgid points outside it be dumped, and then restore it onto our tty.
    c.set_shell_job(false);
    // CRIU copies a ghost's data into the image, so it costs a version its
    // size in bytes and the copy in the frozen window (docs/checkpoints.md).
    // "Can't dump ghost file /tmp/.org.chromium.Chromium.* of 2097152 size,
    // increase limit": the default 1 MiB is too small for Chromium's
    // unlinked temp files.
    c.set_ghost_limit(GHOST_LIMIT);
    // "Some file locks are hold by dumping tasks!": Chromium and dbus hold
    // flock/posix locks; without this CRIU refuses to dump them.
    c.set_file_locks(true);
    // "fsnotify: Handle ... cannot be opened": file handles on overlayfs
    // cannot be opened, so without this CRIU dumps a watch on the session's
    // root without a path, and its restore fails. With it CRIU looks the
    // inode up in its irmap: the cache the caller wrote (crate::fsnotify)
    // holds every watch's path, so no scan path is given, and CRIU scans
    // its own few hints only for a watch the cache does not have.
    c.set_force_irmap(true);
    // NFTABLES costs ~12 ms inside the frozen window (CRIU creates and deletes
    // its own table even without a netns of the tree); only worth it when TCP
    // connections must not see packets while frozen. SKIP otherwise.
    c.set_network_lock(lock_method(o.network_lock));
    // Established TCP connections make CRIU refuse to dump unless allowed;
    // the caller knows whether the session's connections are worth keeping.
    // Those not kept are not refused either: CRIU skips their state and
    // restores them closed (`tcp_close`), so a process that had one sees
    // its peer gone, as after a network failure. An agent in a session is
    // dumped mid-request to the coordinator's proxy, whose end of the
    // connection is not in the version; its HTTP client retries.
    if o.tcp_established {
        c.set_tcp_established(true);
    } else {
        c.set_tcp_close(true);
    }
    // The v1 freezer stops the whole cgroup at once: faster than seizing every
    // task with ptrace, and no task can fork out of the tree meanwhile.
    if let Some(cg) = &o.freeze_cgroup {
        c.set_freeze_cgroup(cg.to_string_lossy().into_owned());
    }
    // Bind mounts from the host (e.g. drums' own binaries) are not part of
    // the session: record them as external under a key, and bind whatever
    // the key names on restore. Dump side: key = mountpoint, val = name.
    c.ext_mnt = o
        .external_mounts
        .iter()
        .map(|(mountpoint, key)| ext_mount(mountpoint, key))
        .collect();

    let mut r = Criu_req::new();
    r.set_type(Criu_req_type::DUMP);
    r.opts = Some(c).into();
    r
}

/// The RESTORE request for `o`. Both directories are passed as fds that stay
/// open until the restore ends.
pub(crate) fn restore_request(
    o: &RestoreOpts,
    images_dir_fd: RawFd,
    work_dir_fd: RawFd,
) -> Criu_req {
    let mut c = Criu_opts::new();
    c.set_images_dir_fd(images_dir_fd);
    // restore.log and stats-restore go to the work dir, so concurrent restores
    // from one image never write into the shared images directory.
    c.set_work_dir_fd(work_dir_fd);
    c.set_log_level(LOG_LEVEL);
    c.set_log_file(RESTORE_LOG.to_string());
    // setup-namespaces/post-restore carry the restored root's pid; the caller
    // configures the network there, before the tree resumes.
    c.set_notify_scripts(true);
    // Mandatory for a tree with its own mount namespace: without it CRIU 4.2.1
    // hits "BUG at criu/mount.c:48" and segfaults. Each restore gets its own
    // merged overlay as root, so siblings never share a writable layer.
    c.set_root(o.root.to_string_lossy().into_owned());
    // RPC restores are always detached. With rst_sibling the restored root is
    // created with CLONE_PARENT, i.e. as a child of *this* process rather than
    // of `criu swrk`: it does not get reparented to a host init that may never
    // reap it, the caller can waitpid() it, and its pdeath_sig is kept.
    c.set_rst_sibling(true);
    // Off: CRIU would move the tree back into the dumped cgroup paths, which
    // belong to the original session. The tree instead inherits the cgroups
    // the swrk process joined (RestoreOpts::join_cgroups).
    c.set_manage_cgroups(false);
    // Same reason as on dump: sessions are not shell jobs of ours.
    c.set_shell_job(false);
    // Locks dumped with file_locks are only restored when this is set too.
    c.set_file_locks(true);
    // Must match the dump: restore removes the lock the dump took with the
    // same method.
    c.set_network_lock(lock_method(o.network_lock));
    // Restoring established TCP connections must be allowed explicitly too;
    // and an image dumped with `tcp_close` is only restored with it (an
    // older one without it restores the same with it).
    if o.tcp_established {
        c.set_tcp_established(true);
    } else {
        c.set_tcp_close(true);
    }
    // Restore side: key = name given at dump, val = host path to bind.
    c.ext_mnt = o
        .external_mounts
        .iter()
        .map(|(key, host)| ext_mount(key, &host.to_string_lossy()))
        .collect();
    // "net: Unknown peer net namespace", then "Can't restore link: -16":
    // the host end of the session's veth is outside the image and each
    // sibling needs its own unique host-side name.
    if o.empty_net {
        // No `ip ... restore` or iptables probes forked by CRIU (~10-25 ms
        // here): the caller configures the namespace itself, as for a cold
        // session.
        c.set_empty_ns(libc::CLONE_NEWNET as u32);
    }
    c.veths = o
        .veth_pairs
        .iter()
        .map(|(inside, host)| {
            let mut v = Criu_veth_pair::new();
            v.set_if_in(inside.clone());
            v.set_if_out(host.clone());
            v
        })
        .collect();

    let mut r = Criu_req::new();
    r.set_type(Criu_req_type::RESTORE);
    r.opts = Some(c).into();
    r
}

pub(crate) fn version_request() -> Criu_req {
    let mut r = Criu_req::new();
    r.set_type(Criu_req_type::VERSION);
    r
}

/// The answer to a NOTIFY: CRIU waits for it (the tree stays frozen during
/// post-dump until it arrives) and aborts the operation when `ok` is false.
pub(crate) fn notify_ack(ok: bool) -> Criu_req {
    let mut r = Criu_req::new();
    r.set_type(Criu_req_type::NOTIFY);
    r.set_notify_success(ok);
    r
}

fn ext_mount(key: &str, val: &str) -> Ext_mount_map {
    let mut m = Ext_mount_map::new();
    m.set_key(key.to_string());
    m.set_val(val.to_string());
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use protobuf::Message;

    fn dump_opts() -> DumpOpts {
        DumpOpts {
            pid: 42,
            images_dir: "/img".into(),
            leave_running: true,
            freeze_cgroup: Some("/sys/fs/cgroup/freezer/s1".into()),
            external_mounts: vec![("/run/drums/bin".into(), "drums-bin".into())],
            network_lock: NetworkLock::Skip,
            tcp_established: false,
        }
    }

    #[test]
    fn dump_request_sets_the_documented_options() {
        let r = dump_request(&dump_opts(), 7);
        assert_eq!(r.type_(), Criu_req_type::DUMP);
        let c = r.opts.as_ref().unwrap();
        assert_eq!(c.images_dir_fd(), 7);
        assert_eq!(c.pid(), 42);
        assert!(c.leave_running());
        assert!(c.notify_scripts());
        assert!(!c.shell_job());
        assert_eq!(c.ghost_limit(), u32::MAX);
        assert!(c.file_locks());
        assert!(c.force_irmap());
        assert!(c.irmap_scan_paths.is_empty());
        assert_eq!(c.network_lock(), Criu_network_lock_method::SKIP);
        assert!(!c.has_tcp_established());
        assert!(c.tcp_close());
        assert_eq!(c.freeze_cgroup(), "/sys/fs/cgroup/freezer/s1");
        assert_eq!(c.ext_mnt.len(), 1);
        assert_eq!(c.ext_mnt[0].key(), "/run/drums/bin");
        assert_eq!(c.ext_mnt[0].val(), "drums-bin");
        assert_eq!(c.log_file(), DUMP_LOG);
        assert_eq!(c.log_level(), 4);
        // images_dir_fd is a proto2 `required` field: the request must encode.
        assert!(r.write_to_bytes().is_ok());
    }

    #[test]
    fn restore_request_sets_the_documented_options() {
        let o = RestoreOpts {
            images_dir: "/img".into(),
            work_dir: "/w".into(),
            root: "/r/merged".into(),
            external_mounts: vec![("drums-bin".into(), "/run/drums/bin".into())],
            veth_pairs: vec![("eth0".into(), "drums0abc".into())],
            join_cgroups: vec![],
            network_lock: NetworkLock::Nftables,
            tcp_established: true,
            empty_net: true,
        };
        let r = restore_request(&o, 7, 8);
        assert_eq!(r.type_(), Criu_req_type::RESTORE);
        let c = r.opts.as_ref().unwrap();
        assert_eq!((c.images_dir_fd(), c.work_dir_fd()), (7, 8));
        assert_eq!(c.root(), "/r/merged");
        assert!(c.rst_sibling());
        assert!(c.has_manage_cgroups() && !c.manage_cgroups());
        assert!(c.file_locks());
        assert!(c.tcp_established() && !c.has_tcp_close());
        assert_eq!(c.empty_ns(), libc::CLONE_NEWNET as u32);
        assert_eq!(c.network_lock(), Criu_network_lock_method::NFTABLES);
        assert_eq!(c.ext_mnt[0].key(), "drums-bin");
        assert_eq!(c.ext_mnt[0].val(), "/run/drums/bin");
        assert_eq!(
            (c.veths[0].if_in(), c.veths[0].if_out()),
            ("eth0", "drums0abc")
        );
        assert_eq!(c.log_file(), RESTORE_LOG);
        assert!(r.write_to_bytes().is_ok());
    }

    #[test]
    fn notify_ack_carries_the_verdict() {
        assert!(notify_ack(true).notify_success());
        assert!(!notify_ack(false).notify_success());
        assert_eq!(notify_ack(false).type_(), Criu_req_type::NOTIFY);
    }
}
