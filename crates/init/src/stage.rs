//! The three stages of drums-init; see the crate documentation for the story.

use std::convert::Infallible;
use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use drums_sys::{CloneFlags, LinuxSyscall, Syscall};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{ForkResult, Pid};

use crate::{io, root, InitConfig, InitError, Report, GUEST_SOCKET, INIT_LOG};

use crate::PATH;

fn report(r: &Report) {
    // The control pipe is drumsd's only view of stages 0 and 1; if drumsd is gone
    // there is no one to tell, and the next step fails on its own.
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&line).and_then(|_| out.flush());
}

/// Read one line from stdin without buffering past it: the rest of the pipe
/// belongs to stage 1 (the `go` line).
fn read_line() -> Result<Option<String>, std::io::Error> {
    let mut stdin = std::io::stdin().lock();
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stdin.read(&mut byte)? {
            0 if buf.is_empty() => return Ok(None),
            0 => break,
            _ if byte[0] == b'\n' => break,
            _ => buf.push(byte[0]),
        }
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

/// `prctl` option (Linux 6.4): mark the whole address space KSM-mergeable.
const PR_SET_MEMORY_MERGE: libc::c_int = 67;

/// Stage 0, on the host: join cgroups, unshare, fork PID 1, report its pid.
pub fn stage0() -> ! {
    let cfg = match read_line().map_err(InitError::ReadConfig).and_then(|l| {
        serde_json::from_str::<InitConfig>(&l.unwrap_or_default()).map_err(InitError::ParseConfig)
    }) {
        Ok(c) => c,
        Err(e) => fail(e),
    };
    match run_stage0(&cfg) {
        Ok((ForkResult::Parent { child }, _)) => {
            report(&Report::Pid(child.as_raw()));
            std::process::exit(0)
        }
        Ok((ForkResult::Child, dirs)) => stage1(&cfg, dirs),
        Err(e) => fail(e),
    }
}

fn fail(e: InitError) -> ! {
    // The whole chain, so drumsd's message names the root cause.
    report(&Report::Error(drums_api::error_chain(&e)));
    std::process::exit(1)
}

fn run_stage0(cfg: &InitConfig) -> Result<(ForkResult, root::HostDirs), InitError> {
    cfg.check_fault("init.cgroup")?;
    let me = std::process::id().to_string();
    for procs in &cfg.cgroup_procs {
        std::fs::write(procs, &me).map_err(io("join cgroup", procs))?;
    }
    // Inherited by every process of the session, across fork and exec: its
    // anonymous memory may be merged by KSM with identical pages of other
    // sessions, when the host runs KSM (`drumsd --ksm`). CRIU keeps each
    // mapping's mergeable flag, so restored siblings' memory stays mergeable.
    // A kernel without it (EINVAL) only loses the sharing, so the result is
    // not checked.
    // SAFETY: prctl with integer arguments only; it changes this process's
    // memory-management flags and nothing else.
    unsafe { libc::prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) };
    cfg.check_fault("init.unshare")?;
    let dirs = if cfg.user_namespace {
        // One call: every other new namespace is owned by the new user
        // namespace, so the session's root has power over them only.
        LinuxSyscall.unshare(namespaces() | CloneFlags::CLONE_NEWUSER)?;
        // Still host uid 0, owner of drumsd's state directory.
        let dirs = root::HostDirs::open(cfg)?;
        become_root_of_user_namespace()?;
        dirs
    } else {
        LinuxSyscall.unshare(namespaces())?;
        root::HostDirs::open(cfg)?
    };
    // SAFETY: drums-init is single-threaded here (no runtime, no threads
    // spawned), so the child may run arbitrary code after fork.
    let forked =
        unsafe { nix::unistd::fork() }.map_err(|source| InitError::Nix { op: "fork", source })?;
    Ok((forked, dirs))
}

/// Wait until drumsd has written our id maps, then take uid and gid 0 of the
/// new namespace (the session's host range). The capabilities the kernel
/// gave us in the new namespace are kept: uid 0 there is its root.
fn become_root_of_user_namespace() -> Result<(), InitError> {
    report(&Report::MapIds);
    match read_line().map_err(InitError::ReadConfig)? {
        Some(l) if l == "mapped" => {}
        _ => return Err(InitError::Abandoned),
    }
    let root = |op, r: nix::Result<()>| r.map_err(|source| InitError::Nix { op, source });
    let (u, g) = (nix::unistd::Uid::from_raw(0), nix::unistd::Gid::from_raw(0));
    root("setresgid 0", nix::unistd::setresgid(g, g, g))?;
    // Host root's supplementary groups mean nothing in here (they show as
    // nogroup), and must not follow the session.
    root("setgroups", nix::unistd::setgroups(&[]))?;
    root("setresuid 0", nix::unistd::setresuid(u, u, u))
}

/// The namespaces a session gets (a user namespace too, unless privileged).
///
/// No cgroup namespace, although runc makes one on cgroup v2: CRIU 4.2.1
/// restores a tree whose threads live in a cgroup namespace only when it
/// manages cgroups itself (its cgroupd moves every thread through a cgroup
/// "yard" it mounts only then: "cgroupd: Can't move thread ... into
/// blkio//"), and managing them would put siblings back into the original
/// session's cgroups. What a cgroup namespace would guard is guarded by the
/// capability set and the seccomp filter: a session cannot mount cgroupfs,
/// and cannot write the cgroup files of /sys (read-only) or move itself.
/// See docs/security.md.
pub fn namespaces() -> CloneFlags {
    CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWPID
}

/// Stage 1, PID 1 of the new namespaces.
fn stage1(cfg: &InitConfig, dirs: root::HostDirs) -> ! {
    match run_stage1(cfg, dirs) {
        Ok(never) => match never {},
        Err(e) => fail(e),
    }
}

fn run_stage1(cfg: &InitConfig, dirs: root::HostDirs) -> Result<Infallible, InitError> {
    nix::unistd::setsid().map_err(|source| InitError::Nix {
        op: "setsid",
        source,
    })?;
    let sys = LinuxSyscall;
    root::build(&sys, cfg, &dirs)?;
    root::pivot(&sys, cfg)?;
    // Closed before anything in the new root is written: each is a host
    // directory that `/proc/self/fd/N` would lead an image's symlink to.
    drop(dirs);
    root::write_identity(cfg)?;
    sys.sethostname(&cfg.hostname)?;
    // drumsd configures the network namespace while we built the root; the
    // services must not start before their addresses exist.
    match read_line().map_err(InitError::ReadConfig)? {
        Some(l) if l == "go" => {}
        _ => return Err(InitError::Abandoned),
    }
    cfg.check_fault("init.exec")?;
    let devnull: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(io("open", "/dev/null"))?
        .into();
    // The session's copy, on the host's loader and libraries: the image's
    // may not run a host binary (see crate::loader).
    let cstring = |s: String| CString::new(s).expect("drums' own paths and digits have no NUL");
    let exe = cstring(crate::loader::exe("drums-init"));
    // Only drums' own variables, whatever stage 0 was started with: stage
    // 2 is the session's PID 1 and the ancestor of all its work.
    let env: Vec<CString> = crate::environment()
        .iter()
        .map(|(k, v)| cstring(format!("{k}={v}")))
        .collect();
    // Last before the exec, and before `ok` so a failure is still reported:
    // the bounding set becomes every session process's capabilities at the
    // exec below, and the seccomp filter is inherited by all of them (what
    // remains to do here, dup2 and close_range, is allowed by both).
    if !cfg.privileged {
        crate::capabilities::restrict()?;
        crate::seccomp::install()?;
    }
    report(&Report::Ok);
    // Nothing of the host may stay open: CRIU cannot dump an fd that points
    // outside the session (the probe's "Can't lookup mount=24 for fd=10").
    for fd in 0..3 {
        nix::unistd::dup2(devnull.as_raw_fd(), fd).map_err(|source| InitError::Nix {
            op: "dup2 /dev/null",
            source,
        })?;
    }
    // SAFETY: close_range only closes descriptors; fds 0-2 were just replaced and
    // nothing else in this process is used after the exec below.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    // Re-exec from inside the new root, so no mapping refers to the old one.
    // The config is gone after the exec: what stage 2 needs of it goes as
    // arguments, which a checkpoint keeps with the process.
    let mut argv = vec![exe.clone(), c"--stage2".to_owned()];
    if let Some(port) = cfg.session_api_port {
        argv.push(c"--session-api-port".to_owned());
        argv.push(cstring(port.to_string()));
    }
    let err = nix::unistd::execve(&exe, &argv, &env).unwrap_err();
    Err(InitError::Nix {
        op: "exec stage 2",
        source: err,
    })
}

/// Stage 2: the long-lived PID 1. Supervises the guest agent and reaps
/// orphans. `session_api_port`: drumsd's session API on the gateway, for the
/// guest's rollback tool.
pub fn stage2(session_api_port: Option<u16>) -> ! {
    crate::loader::forget_library_path();
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(INIT_LOG)
        .ok();
    let logln = |msg: &str| {
        if let Some(mut f) = log.as_ref() {
            let _ = writeln!(f, "drums-init: {msg}");
        }
    };
    std::env::set_var("PATH", PATH);
    logln("stage 2 running");
    loop {
        let started = Instant::now();
        let guest = spawn_guest(&log, session_api_port);
        let guest_pid = match guest {
            Ok(pid) => pid,
            Err(e) => {
                logln(&format!("start guest agent: {e}"));
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        };
        // Reap everything; return to the outer loop when the guest dies.
        loop {
            match waitpid(None, None) {
                Ok(WaitStatus::Exited(pid, _) | WaitStatus::Signaled(pid, _, _))
                    if pid == guest_pid =>
                {
                    logln("guest agent exited; restarting it");
                    break;
                }
                Ok(_) => {}
                Err(nix::Error::EINTR) => {}
                Err(e) => {
                    logln(&format!("waitpid: {e}"));
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        // A guest that dies at once would otherwise be restarted in a hot loop.
        if started.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

fn spawn_guest(
    log: &Option<std::fs::File>,
    session_api_port: Option<u16>,
) -> Result<Pid, std::io::Error> {
    let out = || match log {
        Some(f) => f.try_clone().map(Stdio::from),
        None => Ok(Stdio::null()),
    };
    // On the host's loader and libraries, as stage 2 itself was started.
    let (var, libs) = crate::loader::LIBRARY_PATH;
    let child = Command::new(crate::loader::exe("drums-guest"))
        .env(var, libs)
        .args(["--listen", &format!("unix:{GUEST_SOCKET}")])
        .args(session_api_port.map(|p| format!("--session-api-port={p}")))
        .stdin(Stdio::null())
        .stdout(out()?)
        .stderr(out()?)
        .spawn()?;
    Ok(Pid::from_raw(child.id() as i32))
}
