//! Running netlink work inside another process's network namespace.
//!
//! A netlink socket talks to the network namespace of the thread that created
//! it, so configuring a session's namespace needs a thread that has joined it.
//! setns(2) changes the namespace of the calling thread for good, and a tokio
//! worker thread is shared by unrelated tasks: joining a session namespace there
//! would silently move every later socket of the daemon into that session. So
//! each piece of in-namespace work gets a dedicated, short-lived OS thread with
//! its own current-thread runtime, and the result comes back over a oneshot
//! channel that the caller awaits without blocking its runtime.

use std::fs::File;
use std::future::Future;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

use drums_sys::{CloneFlags, LinuxSyscall, Syscall};
use tokio::sync::oneshot;

use crate::error::NetError;

/// An open handle on the network namespace of a process.
///
/// Holding the file keeps that namespace alive and pins it: every later step
/// (creating the veth peer in it, joining it) uses this same namespace, even if
/// the pid is reused in the meantime.
pub(crate) struct NetnsFile {
    pub(crate) pid: i32,
    pub(crate) file: File,
}

impl NetnsFile {
    /// Opens `/proc/<pid>/ns/net`, refusing the namespace drums itself runs in:
    /// configuring that as a session would rename links, add addresses and a
    /// default route on the host.
    pub(crate) fn open_session(pid: i32) -> Result<NetnsFile, NetError> {
        let open_err = |source| NetError::OpenNetns { pid, source };
        if pid <= 0 {
            // /proc/0 does not exist and negative pids are not processes;
            // fail with the same error kind as a vanished process.
            return Err(open_err(std::io::Error::from_raw_os_error(libc::ESRCH)));
        }
        let file = File::open(format!("/proc/{pid}/ns/net")).map_err(open_err)?;
        let theirs = file.metadata().map_err(open_err)?;
        // thread-self, not self: it is this thread's namespace that the host
        // side netlink socket shares (no drums thread outside a worker ever
        // changes namespace, but be exact).
        let ours = std::fs::metadata("/proc/thread-self/ns/net").map_err(open_err)?;
        if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
            return Err(NetError::HostNetns { pid });
        }
        Ok(NetnsFile { pid, file })
    }
}

/// Runs `f` with an rtnetlink handle whose socket lives in the network
/// namespace of `ns`, on a dedicated thread (see the module docs for why).
pub(crate) async fn run_in<F, Fut, T>(ns: NetnsFile, f: F) -> Result<T, NetError>
where
    F: FnOnce(rtnetlink::Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, NetError>> + 'static,
    T: Send + 'static,
{
    let pid = ns.pid;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name(format!("drums-netns-{pid}"))
        .spawn(move || {
            // If the caller stopped waiting, nobody wants the result.
            let _ = tx.send(worker(&LinuxSyscall, ns, f));
        })
        .map_err(|source| NetError::Worker { pid, source })?;
    // A dropped sender means the worker panicked before sending.
    rx.await.map_err(|_| NetError::WorkerDied { pid })?
}

fn worker<F, Fut, T>(sys: &dyn Syscall, ns: NetnsFile, f: F) -> Result<T, NetError>
where
    F: FnOnce(rtnetlink::Handle) -> Fut,
    Fut: Future<Output = Result<T, NetError>>,
{
    let pid = ns.pid;
    sys.setns(
        ns.file.as_fd(),
        CloneFlags::CLONE_NEWNET,
        &format!("/proc/{pid}/ns/net"),
    )
    .map_err(|e| NetError::Setns {
        pid,
        source: e.source,
    })?;
    // The thread itself now holds the namespace; the file is not needed.
    drop(ns);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| NetError::Worker { pid, source })?;
    rt.block_on(async move {
        // Created here, after setns, so the socket belongs to the session's
        // namespace.
        let (conn, handle, _) = rtnetlink::new_connection().map_err(NetError::Connect)?;
        let conn = tokio::spawn(conn);
        let result = f(handle).await;
        conn.abort();
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use drums_sys::{Call, RecordingSyscall};
    use std::os::fd::AsRawFd;

    fn ns() -> NetnsFile {
        NetnsFile {
            pid: 4242,
            file: File::open("/dev/null").unwrap(),
        }
    }

    #[test]
    fn the_worker_joins_the_network_namespace_of_its_file() {
        let sys = RecordingSyscall::new();
        let ns = ns();
        let fd = ns.file.as_raw_fd();
        // The recording joins nothing: the handle is this thread's own.
        worker(&sys, ns, |_| async { Ok(()) }).unwrap();
        assert_eq!(
            sys.calls(),
            [Call::Setns {
                ns: fd,
                nstype: CloneFlags::CLONE_NEWNET,
            }]
        );
    }

    #[test]
    fn a_failed_setns_names_the_pid_and_runs_nothing() {
        let sys = RecordingSyscall::new();
        sys.fail("setns", nix::Error::EPERM);
        let e = worker::<_, _, ()>(&sys, ns(), |_| async {
            panic!("ran outside the session's namespace")
        })
        .unwrap_err();
        assert!(
            matches!(
                e,
                NetError::Setns {
                    pid: 4242,
                    source: nix::Error::EPERM
                }
            ),
            "{e:?}"
        );
    }
}
