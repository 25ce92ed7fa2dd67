//! The transport: one `criu swrk <fd>` process per request, over a
//! SOCK_SEQPACKET socketpair, speaking CRIU's rpc.proto messages.
//!
//! Our own instead of rust-criu's client because that one cannot set the
//! options drums needs, drops the response (and so the restored pid), and
//! loses CRIU's error text.

use std::io::{IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{
    recv, recvmsg, send, socketpair, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag,
    SockType,
};
use protobuf::Message;
use rust_criu::rust_criu_protobuf::rpc::{Criu_req, Criu_req_type, Criu_resp};

use crate::error::{CriuError, Op};
use crate::request::notify_ack;

/// The notification callback: script name and the pid CRIU attached (the
/// restored root's host pid for setup-namespaces and post-restore, 0 otherwise).
///
/// CRIU hears only the ack's bool; the callback's error is kept whole as the
/// source of `CriuError::Notify`, so a caller can still find what failed
/// (a full store's ENOSPC, say) in the chain.
pub type NotifyFn<'a> = dyn FnMut(&str, i32) -> Result<(), NotifyError> + 'a;

/// A notification callback's failure.
pub type NotifyError = Box<dyn std::error::Error + Send + Sync>;

/// How often, while swrk works, `abandon` is asked whether to go on.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Asked while swrk works: `Some(why)` kills it.
pub type AbandonFn<'a> = dyn Fn() -> Option<String> + 'a;

/// At most this much of swrk's stderr is kept. CRIU logs to its log file once
/// the request is parsed; stderr only matters for failures before that.
const STDERR_KEEP: usize = 16 << 10;

/// Everything one request produced.
pub(crate) struct Exchange {
    /// The final (non-NOTIFY) response; `None` if swrk closed the socket first.
    pub resp: Option<Criu_resp>,
    /// The first notification whose callback failed: (script, reason).
    pub notify_failure: Option<(String, NotifyError)>,
    /// The last non-zero pid a notification carried (the restored root).
    pub notified_pid: Option<i32>,
    /// Each notification and when its acknowledgement was sent.
    pub notifications: Vec<(String, Instant)>,
    /// Why swrk was killed before its final response (`abandon` said so).
    pub abandoned: Option<String>,
    pub status: ExitStatus,
    pub stderr: String,
}

/// A running `criu swrk`. Dropping it closes our end of the socket first, so
/// CRIU sees EOF, aborts whatever it was doing (unfreezing a dumped tree) and
/// exits, and only then waits for it: a panic in a callback never leaves a
/// frozen tree or a zombie behind.
struct Swrk {
    sock: Option<OwnedFd>,
    child: Option<Child>,
    stderr: Option<JoinHandle<String>>,
}

impl Swrk {
    fn spawn(op: Op, bin: &Path, run_dir: Option<&Path>) -> Result<Swrk, CriuError> {
        let rpc = |what, source| CriuError::Rpc { op, what, source };
        // CLOEXEC on both ends: only the one end handed to swrk may reach it,
        // and no other child this process spawns concurrently may inherit either.
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| rpc("socketpair", e))?;
        let child_fd: RawFd = theirs.as_raw_fd();

        let mut cmd = Command::new(bin);
        // CRIU forks the restored tasks inside the session, and they run on
        // swrk's environment until their own is back: none of drumsd's
        // (a user's API keys, say) may be there even for that moment.
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .arg("swrk")
            .arg(child_fd.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if run_dir.is_some() {
            // The run dir is swrk's /run once the mount below is made, which
            // is before the exec that loads the preload.
            cmd.env("LD_PRELOAD", format!("/run/{}", crate::PRLIMIT_SHIM));
        }
        // Built before the fork: the child may not allocate.
        let run_dir = run_dir
            .map(|d| std::ffi::CString::new(d.as_os_str().as_encoded_bytes()))
            .transpose()
            .map_err(|_| rpc("run dir path has a NUL byte", Errno::EINVAL))?;
        // These calls stay raw, outside drums_sys's `Syscall` seam: the seam
        // builds its errors' strings, and a child forked from multithreaded
        // drumsd may neither allocate nor take a lock before exec.
        // SAFETY: the closure runs in the forked child before exec and only
        // calls fcntl(2), unshare(2) and mount(2), which are async-signal-safe,
        // on strings built before the fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                // swrk must inherit its end of the socketpair across exec.
                fcntl(child_fd, FcntlArg::F_SETFD(FdFlag::empty()))
                    .map(drop)
                    .map_err(std::io::Error::from)?;
                if let Some(dir) = &run_dir {
                    // CRIU caches its kernel probes (~25 ms a run) in
                    // /run/criu.kdat, but only when /run is a tmpfs, which it is
                    // not on every host. In a private mount namespace, a tmpfs
                    // the caller owns stands in for /run, and the cache lasts
                    // as long as that tmpfs. Nothing propagates to the host.
                    if libc::unshare(libc::CLONE_NEWNS) != 0
                        || libc::mount(
                            c"none".as_ptr(),
                            c"/".as_ptr(),
                            std::ptr::null(),
                            libc::MS_REC | libc::MS_PRIVATE,
                            std::ptr::null(),
                        ) != 0
                        || libc::mount(
                            dir.as_ptr(),
                            c"/run".as_ptr(),
                            std::ptr::null(),
                            libc::MS_BIND,
                            std::ptr::null(),
                        ) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|source| CriuError::Spawn {
            op,
            bin: bin.to_path_buf(),
            source,
        })?;
        // Our copy of swrk's end must go, or we would never see EOF when swrk dies.
        drop(theirs);

        let stderr = child.stderr.take().map(|mut s| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while let Ok(n) = s.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.len() > 2 * STDERR_KEEP {
                        buf.drain(..buf.len() - STDERR_KEEP);
                    }
                }
                let start = buf.len().saturating_sub(STDERR_KEEP);
                String::from_utf8_lossy(&buf[start..]).trim().to_string()
            })
        });
        Ok(Swrk {
            sock: Some(ours),
            child: Some(child),
            stderr,
        })
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    fn fd(&self) -> RawFd {
        self.sock.as_ref().map(|s| s.as_raw_fd()).unwrap_or(-1)
    }

    /// Wait until a message (or EOF) is there to read, asking `abandon`
    /// every [`WATCH_EVERY`]; if it says why, swrk is killed (its end of the
    /// socket closes, so the next read sees EOF) and that is returned.
    fn wait_readable(&self, op: Op, abandon: &AbandonFn<'_>) -> Result<Option<String>, CriuError> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::BorrowedFd;
        let timeout = PollTimeout::try_from(WATCH_EVERY).expect("100 ms fits");
        loop {
            // SAFETY: the socket is ours and open for as long as `self` is.
            let fd = unsafe { BorrowedFd::borrow_raw(self.fd()) };
            let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
            match poll(&mut fds, timeout) {
                Ok(0) => {}
                Ok(_) => return Ok(None),
                Err(Errno::EINTR) => continue,
                Err(source) => {
                    return Err(CriuError::Rpc {
                        op,
                        what: "poll",
                        source,
                    })
                }
            }
            if let Some(why) = abandon() {
                if let Some(c) = &self.child {
                    // Our own unreaped child: its pid is not reused.
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(c.id() as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                return Ok(Some(why));
            }
        }
    }

    fn send(&self, op: Op, req: &Criu_req) -> Result<(), CriuError> {
        let bytes = req
            .write_to_bytes()
            .map_err(|source| CriuError::Encode { op, source })?;
        loop {
            // MSG_NOSIGNAL: a dead swrk must be an error here, not SIGPIPE.
            match send(self.fd(), &bytes, MsgFlags::MSG_NOSIGNAL) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(source) => {
                    return Err(CriuError::Rpc {
                        op,
                        what: "send",
                        source,
                    })
                }
            }
        }
    }

    /// The next message, or `None` when swrk closed its end.
    fn recv(&self, op: Op) -> Result<Option<Criu_resp>, CriuError> {
        let rpc = |what, source| CriuError::Rpc { op, what, source };
        let fd = self.fd();
        // SEQPACKET keeps message boundaries: PEEK|TRUNC on an empty buffer
        // returns the whole next message's size without consuming it.
        let size = loop {
            match recv(fd, &mut [], MsgFlags::MSG_PEEK | MsgFlags::MSG_TRUNC) {
                Ok(n) => break n,
                Err(Errno::EINTR) => continue,
                // swrk died with the message queue empty.
                Err(Errno::ECONNRESET) => return Ok(None),
                Err(e) => return Err(rpc("peek", e)),
            }
        };
        if size == 0 {
            // EOF: CRIU never sends an empty message (type and success are required).
            return Ok(None);
        }
        let mut buf = vec![0u8; size];
        // Some notifications carry an fd (e.g. orphan-pts-master); room for a few.
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let (len, fds) = loop {
            let mut iov = [IoSliceMut::new(&mut buf)];
            match recvmsg::<()>(fd, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
                Ok(msg) => {
                    if msg.flags.contains(MsgFlags::MSG_TRUNC) {
                        return Err(rpc("receive (message truncated)", Errno::EMSGSIZE));
                    }
                    let mut fds = Vec::new();
                    for c in msg.cmsgs().map_err(|e| rpc("receive control data", e))? {
                        if let ControlMessageOwned::ScmRights(rs) = c {
                            fds.extend(rs);
                        }
                    }
                    break (msg.bytes, fds);
                }
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(rpc("receive", e)),
            }
        };
        for f in fds {
            // SAFETY: the kernel just installed this fd for us via SCM_RIGHTS;
            // nothing else owns it. drums uses none of them, so it is closed.
            drop(unsafe { OwnedFd::from_raw_fd(f) });
        }
        Criu_resp::parse_from_bytes(&buf[..len])
            .map(Some)
            .map_err(|source| CriuError::Decode { op, source })
    }

    /// Close the socket (swrk exits on EOF), then reap swrk.
    fn finish(&mut self) -> (ExitStatus, String) {
        drop(self.sock.take());
        let status = match self.child.take() {
            Some(mut c) => loop {
                match c.wait() {
                    Ok(s) => break s,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    // Only possible if someone else reaped it; report it as a failure.
                    Err(_) => break std::os::unix::process::ExitStatusExt::from_raw(-1),
                }
            },
            None => std::os::unix::process::ExitStatusExt::from_raw(0),
        };
        let stderr = self
            .stderr
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        (status, stderr)
    }
}

impl Drop for Swrk {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Run one request through a fresh `criu swrk`: move swrk into
/// `join_cgroups`, send `req`, answer notifications through `on_notify`
/// until the final response, then reap swrk. `abandon` is asked while
/// swrk works; when it says why, swrk is killed and the exchange ends
/// without a response.
pub(crate) fn exchange(
    bin: &Path,
    run_dir: Option<&Path>,
    op: Op,
    req: &Criu_req,
    join_cgroups: &[PathBuf],
    on_notify: &mut NotifyFn<'_>,
    abandon: &AbandonFn<'_>,
) -> Result<Exchange, CriuError> {
    let mut swrk = Swrk::spawn(op, bin, run_dir)?;
    // swrk only acts once it has the request, so joining the cgroups from here,
    // before sending it, is race-free; a restored tree forks from swrk and
    // inherits them. Done from the parent (not pre_exec) so the error can
    // name the file.
    for cg in join_cgroups {
        std::fs::write(cg, swrk.pid().to_string()).map_err(|source| CriuError::JoinCgroup {
            op,
            path: cg.clone(),
            source,
        })?;
    }
    swrk.send(op, req)?;

    let mut notify_failure = None;
    let mut notified_pid = None;
    let mut notifications = Vec::new();
    let mut abandoned = None;
    let resp = loop {
        if abandoned.is_none() {
            abandoned = swrk.wait_readable(op, abandon)?;
        }
        let Some(resp) = swrk.recv(op)? else {
            break None;
        };
        if resp.type_() != Criu_req_type::NOTIFY {
            break Some(resp);
        }
        let script = resp
            .notify
            .as_ref()
            .map(|n| n.script().to_string())
            .unwrap_or_default();
        let pid = resp.notify.as_ref().map(|n| n.pid()).unwrap_or(0);
        if pid != 0 {
            notified_pid = Some(pid);
        }
        // After a failed callback CRIU is already aborting; later
        // notifications of the rollback are acknowledged without asking again.
        let ok = if notify_failure.is_some() {
            true
        } else {
            match on_notify(&script, pid) {
                Ok(()) => true,
                Err(reason) => {
                    tracing::warn!(%op, %script, %reason, "criu notification callback failed; aborting");
                    notify_failure = Some((script.clone(), reason));
                    false
                }
            }
        };
        swrk.send(op, &notify_ack(ok))?;
        tracing::debug!(%op, %script, pid, ok, "criu notification");
        notifications.push((script, Instant::now()));
    };
    let (status, stderr) = swrk.finish();
    Ok(Exchange {
        resp,
        notify_failure,
        notified_pid,
        notifications,
        abandoned,
        status,
        stderr,
    })
}
