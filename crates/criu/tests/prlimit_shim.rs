//! The prlimit shim (shim/prlimit.c), preloaded into a real process: reading
//! the limits of another user's process gives exactly what
//! /proc/PID/limits says, where the kernel alone may say EPERM (it does on
//! hosts where root lacks CAP_SYS_RESOURCE, such as this project's CI).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

const SHIM: &str = concat!(env!("OUT_DIR"), "/drums-criu-prlimit.so");

/// Reads RLIMIT_NOFILE (7) of `pid` with syscall(SYS_prlimit64 = 302) from
/// Python's ctypes, so the call goes through libc's `syscall`, as CRIU's does.
const READ: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
buf = (ctypes.c_uint64 * 2)()
r = libc.syscall(302, int(sys.argv[1]), 7, None, buf)
print(r, ctypes.get_errno(), buf[0], buf[1])
"#;

fn read(pid: u32, preload: bool) -> Vec<String> {
    let mut c = Command::new("/usr/bin/python3");
    c.args(["-c", READ, &pid.to_string()]);
    if preload {
        c.env("LD_PRELOAD", SHIM);
    }
    let out = c.output().expect("run /usr/bin/python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

#[test]
fn shim_reads_another_users_limits_as_proc_shows_them() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (a process of another user). NOT SKIPPED: failing on purpose"
    );
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn sleep as nobody");
    let pid = sleeper.id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_owned();
    let want: Vec<&str> = line[26..].split_whitespace().take(2).collect();

    let plain = read(pid, false);
    let shimmed = read(pid, true);
    let _ = sleeper.kill();
    let _ = sleeper.wait();

    assert_eq!(
        shimmed[0], "0",
        "with the shim the read succeeds: {shimmed:?}"
    );
    assert_eq!(&shimmed[2..4], &want[..], "{shimmed:?} vs /proc: {line}");
    // Without it the kernel answers EPERM here, or the same numbers on a
    // host that grants CAP_SYS_RESOURCE; never something else.
    if plain[0] == "0" {
        assert_eq!(&plain[2..4], &want[..]);
    } else {
        assert_eq!(plain[1], "1", "EPERM expected: {plain:?}");
    }
    // Nothing of the test is left.
    assert!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_err());
}
