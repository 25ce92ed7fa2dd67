"""The checkpointability corpus's workloads (crates/daemon/tests/workloads.rs).

`python3 wl.py serve NAME` sets workload NAME up in this session, then
answers on /root/wl.sock: each connection runs NAME's check, which proves
the object is still there *with its state* (a watch still reports, a lock
still excludes, data still reads back) and answers "ok DETAIL" or
"fail WHY". `python3 wl.py probe` asks once and prints the answer.

Each workload is the kind of thing agents and their tools leave running:
file watchers, ptys, unlinked scratch files, locks, SQLite, threads, kernel
objects. Only the standard library is used (ctypes for the syscalls Python
3.11 has no wrapper for), since the image has nothing else.
"""

import ctypes
import fcntl
import hashlib
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

SOCK = "/root/wl.sock"
libc = ctypes.CDLL(None, use_errno=True)


def errno_check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))
    return r


def wait_readable(fd, timeout=3.0):
    r, _, _ = select.select([fd], [], [], timeout)
    return bool(r)


# ---- inotify -----------------------------------------------------------------
IN_OPEN = 0x20
IN_CREATE = 0x100


class Inotify:
    def __init__(self, path, mask):
        self.fd = errno_check(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC), "inotify_init1")
        errno_check(libc.inotify_add_watch(self.fd, path.encode(), mask), "inotify_add_watch " + path)
        self.path = path

    def drain(self):
        while True:
            try:
                os.read(self.fd, 65536)
            except BlockingIOError:
                return

    def events(self, timeout=3.0):
        """(mask, name) of the events that arrive within timeout."""
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not wait_readable(self.fd, deadline - time.monotonic()):
                break
            buf = os.read(self.fd, 65536)
            i = 0
            while i < len(buf):
                _wd, mask, _cookie, n = struct.unpack_from("iIII", buf, i)
                name = buf[i + 16 : i + 16 + n].rstrip(b"\0").decode()
                out.append((mask, name))
                i += 16 + n
            if out:
                break
        return out


def inotify_own():
    os.makedirs("/root/proj", exist_ok=True)
    w = Inotify("/root/proj", IN_CREATE)
    n = [0]

    def check():
        w.drain()
        n[0] += 1
        name = "f%d-%d" % (os.getpid(), n[0])
        open("/root/proj/" + name, "w").close()
        got = w.events()
        if any(m & IN_CREATE and nm == name for m, nm in got):
            return "ok watch on /root/proj saw %s" % name
        return "fail the watch on /root/proj saw %r, not %s" % (got, name)

    return check


def inotify_image():
    # A file of the image nobody changes: read it and the watch reports it.
    path = "/etc/debian_version"
    w = Inotify(path, IN_OPEN)

    def check():
        w.drain()
        with open(path) as f:
            f.read()
        got = w.events()
        if any(m & IN_OPEN for m, _ in got):
            return "ok watch on %s saw the open" % path
        return "fail the watch on %s saw %r" % (path, got)

    return check


# ---- ptys ----------------------------------------------------------------------
def shell_on_pty(shell="bash"):
    import pty

    pid, master = pty.fork()
    if pid == 0:
        os.execvp(shell, [shell])
    os.write(master, b"stty -echo; PS1=; X=kept\n")
    time.sleep(0.3)
    return pid, master


def ask_shell(master, cmd, want):
    # Drain, then ask; the shell's variable proves it is the same shell.
    while wait_readable(master, 0.05):
        os.read(master, 65536)
    os.write(master, cmd)
    out = b""
    deadline = time.monotonic() + 5
    while want not in out and time.monotonic() < deadline:
        if wait_readable(master, deadline - time.monotonic()):
            out += os.read(master, 65536)
    return want in out, out


def pty_shell(shell="bash"):
    _pid, master = shell_on_pty(shell)

    def check():
        ok, out = ask_shell(master, b'echo "$X $((6*7))"\n', b"kept 42")
        return "ok the shell on the pty answers" if ok else "fail pty said %r" % out

    return check


def pty_server():
    # What tmux is to an agent: one server holding several ptys, each with
    # its own shell and state.
    shells = []
    for i in range(3):
        _pid, master = shell_on_pty()
        os.write(master, b"W=%d\n" % (i * 10))
        shells.append(master)
    time.sleep(0.2)

    def check():
        for i, master in enumerate(shells):
            want = b"w%d" % (i * 10 + 1)
            ok, out = ask_shell(master, b'echo "w$((W+1))"\n', want)
            if not ok:
                return "fail pty %d said %r" % (i, out)
        return "ok %d ptys answer, each with its own shell" % len(shells)

    return check


# ---- unlinked open files ---------------------------------------------------------
def ghost(mib):
    def setup():
        path = "/root/scratch-%d" % mib
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        h = hashlib.sha256()
        block = os.urandom(1 << 20)
        for i in range(mib):
            chunk = block[:-8] + struct.pack("<Q", i)
            os.write(fd, chunk)
            h.update(chunk)
        os.unlink(path)
        digest = h.hexdigest()

        def check():
            h = hashlib.sha256()
            off = 0
            while True:
                b = os.pread(fd, 8 << 20, off)
                if not b:
                    break
                h.update(b)
                off += len(b)
            if off != mib << 20 or h.hexdigest() != digest:
                return "fail the unlinked file reads %d bytes, sha256 %s" % (off, h.hexdigest())
            link = os.readlink("/proc/self/fd/%d" % fd)
            return "ok %d MiB unlinked file reads back (%s)" % (mib, link)

        return check

    return setup


# ---- locks -------------------------------------------------------------------------
F_OFD_SETLK = 37


def locks():
    path = "/root/locked"
    with open(path, "w") as f:
        f.write("x" * 20)
    posix = os.open(path, os.O_RDWR)
    fcntl.lockf(posix, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, 0)  # bytes 0..9, POSIX
    ofd = os.open(path, os.O_RDWR)
    lk = struct.pack("hhqqi", fcntl.F_WRLCK, 0, 10, 10, 0)  # bytes 10..19, OFD
    fcntl.fcntl(ofd, F_OFD_SETLK, lk)
    probe = (
        "import fcntl, os, struct, sys\n"
        "fd = os.open(%r, os.O_RDWR)\n"
        "r = []\n"
        "for start, cmd in ((0, fcntl.F_SETLK), (10, 37)):\n"
        "    try:\n"
        "        fcntl.fcntl(fd, cmd, struct.pack('hhqqi', fcntl.F_WRLCK, 0, start, 10, 0))\n"
        "        r.append('taken')\n"
        "    except OSError:\n"
        "        r.append('excluded')\n"
        "print(' '.join(r))\n" % path
    )

    def check():
        out = os_popen([sys.executable, "-c", probe])
        if out.strip() == "excluded excluded":
            return "ok the POSIX and the OFD lock still exclude another process"
        return "fail another process got: %s" % out.strip()

    return check


def os_popen(argv):
    import subprocess

    return subprocess.run(argv, capture_output=True, text=True, timeout=20).stdout


# ---- SQLite ----------------------------------------------------------------------------
def sqlite_wal():
    import sqlite3

    db = "/root/wal.db"
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
    con.execute("INSERT INTO t VALUES (1)")
    # An open writer: a write transaction in progress, its row not yet
    # committed, the WAL and its shared memory mapped.
    con.execute("BEGIN IMMEDIATE")
    con.execute("INSERT INTO t VALUES (2)")
    committed = [1]
    count = "import sqlite3; print(sqlite3.connect(%r).execute('SELECT COUNT(*) FROM t').fetchone()[0])" % db

    def check():
        seen = os_popen([sys.executable, "-c", count]).strip()
        if seen != str(committed[0]):
            return "fail a reader sees %s rows before the commit, not %d" % (seen, committed[0])
        con.execute("COMMIT")
        committed[0] += 1
        seen = os_popen([sys.executable, "-c", count]).strip()
        con.execute("BEGIN IMMEDIATE")
        con.execute("INSERT INTO t VALUES (?)", (committed[0] + 1,))
        if seen != str(committed[0]):
            return "fail a reader sees %s rows after the commit, not %d" % (seen, committed[0])
        return "ok the writer committed row %d and a reader sees it" % committed[0]

    return check


# ---- processes ---------------------------------------------------------------------------
def threads64():
    counters = [0] * 64

    def work(i):
        while True:
            counters[i] += 1
            time.sleep(0.01)

    for i in range(64):
        threading.Thread(target=work, args=(i,), daemon=True).start()

    def check():
        before = list(counters)
        time.sleep(0.3)
        stuck = [i for i in range(64) if counters[i] == before[i]]
        n = len(os.listdir("/proc/self/task"))
        if stuck or n < 65:
            return "fail %d threads, these did not run: %s" % (n, stuck)
        return "ok %d threads, all running" % n

    return check


def state_of(pid):
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def stopped():
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(1)
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.1)

    def check():
        s = state_of(pid)
        return "ok pid %d is still stopped" % pid if s == "T" else "fail pid %d is %s" % (pid, s)

    return check


def zombie():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    time.sleep(0.2)

    def check():
        s = state_of(pid)
        if s != "Z":
            return "fail pid %d is %s, not a zombie" % (pid, s)
        return "ok pid %d is still an unreaped zombie" % pid

    return check


def deleted_cwd():
    os.makedirs("/root/gone", exist_ok=True)
    os.chdir("/root/gone")
    os.rmdir("/root/gone")

    def check():
        link = os.readlink("/proc/self/cwd")
        if link.endswith("(deleted)"):
            return "ok the cwd is still the deleted directory: %s" % link
        return "fail the cwd is %s" % link

    return check


# ---- sockets and kernel objects --------------------------------------------------------------------
def tcp():
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 7001))
    srv.listen()
    cli = socket.create_connection(("127.0.0.1", 7001))
    conn, _ = srv.accept()
    sent = [0]

    def check():
        sent[0] += 1
        msg = b"ping%d" % sent[0]
        cli.sendall(msg)
        conn.settimeout(3)
        got = conn.recv(64)
        if got != msg:
            return "fail the established connection carried %r" % got
        # The listener still accepts.
        c2 = socket.create_connection(("127.0.0.1", 7001), timeout=3)
        a, _ = srv.accept()
        c2.close()
        a.close()
        return "ok the established connection carries data; the listener accepts"

    return check


def socketpair():
    a, b = socket.socketpair()
    a.sendall(b"queued")  # in flight at the checkpoint

    def check():
        b.settimeout(3)
        got = b.recv(64)
        a.sendall(b"queued")
        if got != b"queued":
            return "fail the socketpair carried %r" % got
        return "ok the socketpair carries its queued data"

    return check


def memfd():
    fd = os.memfd_create("wl")
    os.write(fd, b"memfd-data")

    def check():
        got = os.pread(fd, 64, 0)
        return "ok memfd holds its data" if got == b"memfd-data" else "fail memfd holds %r" % got

    return check


def shm():
    import mmap

    fd = os.open("/dev/shm/wl", os.O_RDWR | os.O_CREAT, 0o600)
    os.ftruncate(fd, 4096)
    m = mmap.mmap(fd, 4096)
    m[:8] = b"shm-data"

    def check():
        got = bytes(m[:8])
        with open("/dev/shm/wl", "rb") as f:
            disk = f.read(8)
        if got == disk == b"shm-data":
            return "ok /dev/shm/wl, mapped shared, holds its data"
        return "fail the mapping holds %r, the file %r" % (got, disk)

    return check


def eventfd():
    fd = os.eventfd(7)

    def check():
        v = os.eventfd_read(fd)
        os.eventfd_write(fd, v)
        return "ok the eventfd's counter is 7" if v == 7 else "fail the eventfd's counter is %d" % v

    return check


class ITimerSpec(ctypes.Structure):
    _fields_ = [("i_s", ctypes.c_long), ("i_ns", ctypes.c_long), ("v_s", ctypes.c_long), ("v_ns", ctypes.c_long)]


def timerfd():
    CLOCK_MONOTONIC = 1
    fd = errno_check(libc.timerfd_create(CLOCK_MONOTONIC, os.O_CLOEXEC), "timerfd_create")
    spec = ITimerSpec(0, 50_000_000, 0, 50_000_000)
    errno_check(libc.timerfd_settime(fd, 0, ctypes.byref(spec), None), "timerfd_settime")

    def check():
        if not wait_readable(fd, 3):
            return "fail the periodic timer did not fire"
        n = struct.unpack("Q", os.read(fd, 8))[0]
        return "ok the periodic timerfd fires (%d expirations)" % n

    return check


def signalfd():
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    mask = ctypes.c_uint64(1 << (signal.SIGUSR1 - 1))
    fd = errno_check(libc.signalfd(-1, ctypes.byref(mask), os.O_CLOEXEC), "signalfd")

    def check():
        os.kill(os.getpid(), signal.SIGUSR1)
        if not wait_readable(fd, 3):
            return "fail the signalfd got no SIGUSR1"
        signo = struct.unpack_from("I", os.read(fd, 128))[0]
        return "ok the signalfd delivers signal %d" % signo if signo == signal.SIGUSR1 else "fail got %d" % signo

    return check


def epoll():
    r, w = os.pipe()
    ep = select.epoll()
    ep.register(r, select.EPOLLIN)

    def check():
        os.write(w, b"x")
        ready = ep.poll(3)
        os.read(r, 1)
        if any(fd == r for fd, _ in ready):
            return "ok the epoll set reports its pipe"
        return "fail the epoll set reported %r" % ready

    return check


def idle():
    # The corpus's Python with no object of its own: the baseline its
    # workloads are measured against (drums bench corpus).
    return lambda: "ok idle"


WORKLOADS = {
    "idle": idle,
    "inotify_own": inotify_own,
    "inotify_image": inotify_image,
    "pty_shell": pty_shell,
    "pty_server": pty_server,
    # dash keeps /dev/tty open for job control, which CRIU 4.2.1 cannot
    # dump under another process's pty: its checkpoint must fail clearly.
    "pty_dash": lambda: pty_shell("sh"),
    "ghost_100m": ghost(100),
    "ghost_1g": ghost(1024),
    "locks": locks,
    "sqlite_wal": sqlite_wal,
    "threads64": threads64,
    "stopped": stopped,
    "zombie": zombie,
    "deleted_cwd": deleted_cwd,
    "tcp": tcp,
    "socketpair": socketpair,
    "memfd": memfd,
    "shm": shm,
    "eventfd": eventfd,
    "timerfd": timerfd,
    "signalfd": signalfd,
    "epoll": epoll,
}


def serve(name):
    check = WORKLOADS[name]()
    try:
        os.unlink(SOCK)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(SOCK)
    srv.listen()
    while True:
        c, _ = srv.accept()
        try:
            answer = check()
        except Exception as e:  # the answer says what broke, for the test's message
            answer = "fail %s: %r" % (type(e).__name__, e)
        try:
            c.sendall(answer.encode() + b"\n")
        finally:
            c.close()


def probe():
    deadline = time.monotonic() + 60
    while True:
        try:
            c = socket.socket(socket.AF_UNIX)
            c.connect(SOCK)
            break
        except OSError:
            # The workload may still be setting up (a 1 GiB file takes a while).
            if time.monotonic() > deadline:
                print("fail nothing listens on %s" % SOCK)
                return
            time.sleep(0.1)
    c.settimeout(60)
    print(c.makefile().readline().strip())


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        probe()
