"""Clone hygiene for Python processes in drums sessions.

drums checkpoints a running session and restores it as several siblings.
Without help, every sibling continues with the same `random` state and
draws the same "random" numbers. This module is imported at start-up by
every Python process in a drums image (through drums_reseed.pth). When a
sibling is restored, the drums guest agent sends each registered process
SIGUSR2. The handler installed here then reseeds the generators from the
kernel and acknowledges.

The protocol is described in docs/hygiene.md in the drums repository. In
short:
  register:   /run/drums/reseed/<pid> holds the signal number ("12"), and
              the process keeps that file open. Holding it open proves to the
              agent that the pid is still this process: CRIU restores open
              files, but not process start times.
  signal:     after a restore, the agent writes /run/drums/generation and
              sends the signal.
  ack:        /run/drums/reseed/<pid>.ack holds the generation handled.

Nothing outside a drums session is touched: without /run/drums/reseed, the
import costs one stat(). Two other rules apply. The hook must never raise
into the program that imports it. And it imports nothing beyond builtin
modules: it runs in every Python process, so its import cost must stay tiny.

Environment:
  DRUMS_RESEED=0  turn the hook off, e.g. for a program that installs its
                  own SIGUSR2 handler later (gunicorn's master re-executes
                  itself on SIGUSR2).
  DRUMS_RUN_DIR   use another directory instead of /run/drums (tests).
"""

import os
import sys

# Linux's number on x86-64 and arm64; _install() takes the platform's own.
SIGUSR2 = 12

_run_dir = os.environ.get("DRUMS_RUN_DIR") or "/run/drums"
_reseed_dir = _run_dir + "/reseed"

# The open registration file, and the pid it registers. After os.fork() the
# child inherits both; it must not keep the parent's registration.
_fd = -1
_pid = 0


def _publish(name, data, keep_open=False):
    """Writes data to _reseed_dir/name through a temporary file and a rename.

    The agent never sees a half-written file. The directory is writable by
    everyone, so never follow a planted symlink, and never reuse a file
    someone else created. Returns the open fd if keep_open is true.
    """
    pid = os.getpid()
    tmp = "%s/.%d.%s.tmp" % (_reseed_dir, pid, name)
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        os.write(fd, data)
        os.rename(tmp, "%s/%s" % (_reseed_dir, name))
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if keep_open:
        return fd
    os.close(fd)
    return -1


def _reseed():
    # os.read rather than open(): the handler may run while the program is
    # inside buffered I/O of its own, and must not re-enter that machinery.
    try:
        fd = os.open(_run_dir + "/generation", os.O_RDONLY | os.O_CLOEXEC)
        try:
            generation = os.read(fd, 32).strip() or b"0"
        finally:
            os.close(fd)
    except OSError:
        generation = b"0"
    # Only modules that are already loaded carry state from before the
    # checkpoint. A module imported later seeds itself from the kernel at
    # import, which is already different in every sibling.
    random = sys.modules.get("random")
    if random is not None:
        random.seed(os.urandom(32))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            # The legacy global RandomState (numpy.random.rand() & co.);
            # Generator objects made with default_rng() belong to the
            # program and are not reachable from here.
            numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:
            pass
    # The ack carries the next draw of `random` too, so `drums audit` can show
    # that siblings no longer draw alike (computed on a copy of the state, so
    # the program's own sequence is untouched).
    nxt = b""
    if random is not None:
        try:
            peek = random.Random()
            peek.setstate(random.getstate())
            nxt = b" " + repr(peek.random()).encode()
        except Exception:
            pass
    _publish("%d.ack" % os.getpid(), generation + nxt + b"\n")


def _handler(signum, frame):
    try:
        _reseed()
    except Exception:
        pass


def _register():
    global _fd, _pid
    inherited, _fd, _pid = _fd, -1, 0
    if inherited >= 0:
        try:
            os.close(inherited)
        except OSError:
            pass
    # "12": the signal to send us. The fd stays open for the life of the
    # process. It is close-on-exec, so a program this process execs into
    # (same pid, no handler) is never signalled.
    _fd = _publish(str(os.getpid()), b"%d\n" % SIGUSR2, keep_open=True)
    _pid = os.getpid()


def _after_fork_in_child():
    try:
        import _signal

        if _signal.getsignal(SIGUSR2) is _handler:
            _register()
        else:
            # The program has replaced our handler since start-up. The
            # child must not ask for a signal it would not handle as a
            # reseed.
            _register_nothing()
    except Exception:
        pass


def _register_nothing():
    global _fd, _pid
    if _fd >= 0:
        try:
            os.close(_fd)
        except OSError:
            pass
    _fd, _pid = -1, 0


def _unregister():
    # At a normal exit. A killed process leaves its file behind, and the
    # agent removes it as stale. The ack stays: a process that exits right
    # after acking must not take the ack away before the agent has read it.
    # The agent clears all acks at the start of its next hygiene call.
    if _pid and _pid == os.getpid():
        try:
            os.unlink("%s/%d" % (_reseed_dir, _pid))
        except OSError:
            pass


def _install():
    if os.environ.get("DRUMS_RESEED") == "0":
        return
    if not os.path.isdir(_reseed_dir):
        return  # not in a drums session
    import _signal  # builtin; the signal module would import enum

    global SIGUSR2
    SIGUSR2 = _signal.SIGUSR2
    # Only take SIGUSR2 if nobody else has it. A handler set by the program
    # (or by C code embedding Python; getsignal then returns None) or
    # SIG_IGN means SIGUSR2 already means something here. Registering
    # anyway would make the agent trigger that something after every
    # restore.
    if _signal.getsignal(SIGUSR2) != _signal.SIG_DFL:
        return
    _signal.signal(SIGUSR2, _handler)
    try:
        _register()
    except BaseException:
        # Without a registration, nobody will send the signal: give it back.
        _signal.signal(SIGUSR2, _signal.SIG_DFL)
        raise
    import atexit

    atexit.register(_unregister)
    # A forked child is a new pid with the same RNG state. It registers
    # itself, so the agent reseeds it too.
    os.register_at_fork(after_in_child=_after_fork_in_child)


try:
    _install()
except Exception:
    pass
