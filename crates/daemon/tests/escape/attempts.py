"""Escape attempts, run as root inside a drums session by tests/escape.rs.

Each attempt is a real system call with real arguments (through ctypes, so
nothing in between can soften it) and prints one JSON line:
{"name": ..., "ok": true|false, "errno": N|null, "detail": ...}. "ok" means
the attempt SUCCEEDED, which in a confined session is a hole. The test knows
which control must stop each one and with which errno.

argv[1] is JSON from the test: {"host_pid": a pid outside the session,
"block": [major, minor] of a block device on the host, "bridge": the host
bridge's name}.
"""

import ctypes
import ctypes.util
import errno as E
import json
import os
import socket
import sys

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.syscall.restype = ctypes.c_long
ARGS = json.loads(sys.argv[1])
# Who uid 0 is on the host ("0 BASE COUNT"), read before any attempt: in a
# privileged session unshare(CLONE_NEWUSER) succeeds and moves us.
UID_MAP = open("/proc/self/uid_map").read().split()


# x86-64 system call numbers.
SYS_bpf = 321
SYS_init_module = 175
SYS_finit_module = 313
SYS_kexec_load = 246
SYS_kexec_file_load = 320
SYS_open_by_handle_at = 304
SYS_unshare = 272
SYS_ptrace = 101
SYS_keyctl = 250
SYS_userfaultfd = 323
SYS_perf_event_open = 298
SYS_io_uring_setup = 425
SYS_setns = 308
SYS_pivot_root = 155

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
PTRACE_ATTACH = 16
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000


def report(name, ok, err=None, detail=""):
    print(json.dumps({"name": name, "ok": ok, "errno": err, "detail": detail}), flush=True)


def call(name, fn):
    """Run a raw call returning -1/errno on failure."""
    ctypes.set_errno(0)
    r = fn()
    if r == -1:
        report(name, False, ctypes.get_errno())
    else:
        report(name, True, None, "returned %r" % (r,))


def py(name, fn):
    """Run a Python-level attempt; OSError means it failed."""
    try:
        detail = fn()
        report(name, True, None, str(detail or ""))
    except OSError as e:
        report(name, False, e.errno, str(e))


def mount(src, target, fstype, flags, data):
    b = lambda s: s.encode() if s is not None else None
    return libc.mount(b(src), b(target), b(fstype), ctypes.c_ulong(flags), b(data))


# --- mounts -------------------------------------------------------------
for target in ["/run/drums/bin", "/proc/sys", "/"]:
    call("remount %s read-write" % target,
         lambda t=target: mount(None, t, None, MS_REMOUNT | MS_BIND, None))
os.makedirs("/tmp/escape-mnt", exist_ok=True)
call("mount cgroupfs", lambda: mount("cgroup", "/tmp/escape-mnt", "cgroup", 0, "memory"))
call("mount cgroup2", lambda: mount("cgroup2", "/tmp/escape-mnt", "cgroup2", 0, None))
call("mount proc", lambda: mount("proc", "/tmp/escape-mnt", "proc", 0, None))
call("mount sysfs", lambda: mount("sysfs", "/tmp/escape-mnt", "sysfs", 0, None))
call("pivot_root", lambda: libc.syscall(SYS_pivot_root, b"/tmp", b"/tmp/escape-mnt"))

# --- host-global knobs and drums' own files --------------------------------
for path in ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches",
             "/proc/sysrq-trigger", "/sys/kernel/mm/ksm/run"]:
    # Opened for writing but never written: enough to prove the hole.
    py("open %s for writing" % path, lambda p=path: os.close(os.open(p, os.O_WRONLY)))
# drums' own binaries, which drumsd runs on the host as root.
py("create a file in /run/drums/bin",
   lambda: os.close(os.open("/run/drums/bin/escape", os.O_WRONLY | os.O_CREAT, 0o755)))
for path in ["/proc/kcore", "/proc/keys", "/proc/timer_list"]:
    # Masked files read as empty (a bind of /dev/null), which counts as failed.
    try:
        with open(path, "rb") as f:
            data = f.read(64)
        report("read %s" % path, bool(data), None if data else E.ENODATA,
               "%d bytes" % len(data))
    except OSError as e:
        report("read %s" % path, False, e.errno, str(e))

# --- devices ----------------------------------------------------------------
major, minor = ARGS["block"]
for where in ["/dev", "/tmp"]:
    node = "%s/escape-blk" % where
    try:
        os.unlink(node)
    except FileNotFoundError:
        pass
    try:
        os.mknod(node, 0o600 | 0o060000, os.makedev(major, minor))
        report("mknod block device in %s" % where, True, None, "mknod is allowed (privileged)")
    except OSError as e:
        report("mknod block device in %s" % where, False, e.errno, str(e))
        continue
    py("open block device made in %s" % where, lambda n=node: os.close(os.open(n, os.O_RDONLY)))
    os.unlink(node)

# --- the kernel -----------------------------------------------------------------
call("bpf(BPF_PROG_LOAD)", lambda: libc.syscall(SYS_bpf, 5, None, 0))
call("bpf(BPF_MAP_CREATE)", lambda: libc.syscall(SYS_bpf, 0, None, 0))
call("init_module", lambda: libc.syscall(SYS_init_module, None, 0, b""))
call("finit_module", lambda: libc.syscall(SYS_finit_module, 0, b"", 0))
call("kexec_load", lambda: libc.syscall(SYS_kexec_load, 0, 0, None, 0))
call("kexec_file_load", lambda: libc.syscall(SYS_kexec_file_load, 0, 0, 0, None, 0))
call("open_by_handle_at", lambda: libc.syscall(SYS_open_by_handle_at, -100, None, 0))
call("unshare(CLONE_NEWUSER)", lambda: libc.syscall(SYS_unshare, CLONE_NEWUSER))
call("unshare(CLONE_NEWNS)", lambda: libc.syscall(SYS_unshare, CLONE_NEWNS))
call("setns", lambda: libc.syscall(SYS_setns, 0, 0))
call("keyctl", lambda: libc.syscall(SYS_keyctl, 0, 0, 0, 0, 0))
call("userfaultfd", lambda: libc.syscall(SYS_userfaultfd, 0))
call("perf_event_open", lambda: libc.syscall(SYS_perf_event_open, None, 0, -1, -1, 0))
call("io_uring_setup", lambda: libc.syscall(SYS_io_uring_setup, 1, None))

# --- processes outside ----------------------------------------------------------
call("ptrace a process outside", lambda: libc.syscall(SYS_ptrace, PTRACE_ATTACH, ARGS["host_pid"], 0, 0))
py("kill a process outside", lambda: os.kill(ARGS["host_pid"], 0))

# --- the host's network ---------------------------------------------------------
def raw_on_bridge():
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
    try:
        s.bind((ARGS["bridge"], 0))
    finally:
        s.close()
py("raw socket on the host bridge", raw_on_bridge)

def connect(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect((addr[0], addr[1]))
    except socket.timeout:
        # Dropped, not refused: a session learns nothing of what is there.
        raise OSError(E.ETIMEDOUT, "timed out")
    finally:
        s.close()

if ARGS.get("host_service"):
    py("reach a host service on the bridge address", lambda: connect(ARGS["host_service"]))
if ARGS.get("neighbour"):
    py("reach another session", lambda: connect(ARGS["neighbour"]))

# --- what the session holds -----------------------------------------------------
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
report("capabilities", False, None,
       json.dumps({"CapEff": status["CapEff"].strip(), "CapBnd": status["CapBnd"].strip(),
                   "Seccomp": status["Seccomp"].strip()}))
report("uid_map", False, None, json.dumps(UID_MAP))
