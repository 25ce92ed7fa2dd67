"""Values and checks that the sync and async twins share, with no I/O."""

from __future__ import annotations

import codecs
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CommandResult", "ReadFormat"]

ReadFormat = Literal["text", "bytes", "stream"]

_SUFFIX = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@dataclass(frozen=True)
class CommandResult:
    """How a command ended, with all its output.

    Attributes:
        stdout: its standard output, decoded as UTF-8 (invalid bytes become
            U+FFFD: the session's bytes are never trusted to be text).
        stderr: its standard error, decoded the same way.
        exit_code: its exit status; None when a signal killed it.
        signal: the signal that killed it, else None (9 after a timeout or a
            `CommandHandle.kill()`).
        timed_out: the command's `timeout` passed and the session killed it.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        """The command exited 0."""
        return self.exit_code == 0


def parse_size(value: int | str, what: str) -> int:
    """Bytes from an int or a size as drums writes them ("512M", "1.5G", "4096";
    binary K, M, G, T), refusing what drums refuses (crates/api/src/size.rs)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{what} must be an int of bytes or a size string like '512M'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{what} must be positive, not {value}")
        return value
    s = value.strip()
    mult = _SUFFIX.get(s[-1:].lower(), 1)
    num = s[:-1] if mult != 1 else s
    try:
        n = float(num) if not num.isdigit() else int(num)
    except ValueError:
        raise ValueError(
            f"invalid size {value!r} for {what}: use bytes or a number with K, M, G or T"
        ) from None
    if isinstance(n, float) and not math.isfinite(n):
        raise ValueError(f"invalid size {value!r} for {what}: must be finite")
    b = int(n * mult)
    if b < 1:
        raise ValueError(f"invalid size {value!r} for {what}: must be positive")
    if b >= 1 << 64:
        raise ValueError(f"invalid size {value!r} for {what}: over 2^64 - 1 bytes")
    return b


def argv_of(cmd: str | Sequence[str]) -> list[str]:
    """A str runs under `/bin/sh -c` (as in E2B); a sequence is the argv itself."""
    if isinstance(cmd, str):
        return ["/bin/sh", "-c", cmd]
    if isinstance(cmd, bytes | bytearray) or not isinstance(cmd, Sequence):
        raise TypeError(f"cmd must be a str or a sequence of str, not {type(cmd).__name__}")
    argv = list(cmd)
    if not argv:
        raise ValueError("cmd must not be an empty sequence")
    for a in argv:
        if not isinstance(a, str):
            raise TypeError(f"every argument must be a str, not {type(a).__name__}: {a!r}")
    return argv


def exec_body(
    argv: list[str],
    *,
    cwd: str | None,
    envs: Mapping[str, str] | None,
    user: str | int | None,
    timeout: float | None,
    detach: bool = False,
    log: str | None = None,
) -> dict[str, Any]:
    """An ExecRequest (every field of the schema is reachable from here)."""
    body: dict[str, Any] = {"argv": argv}
    if envs:
        for k, v in envs.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise TypeError(f"envs must map str to str, not {k!r}: {v!r}")
        body["env"] = dict(envs)
    if cwd is not None:
        body["cwd"] = cwd
    if user is not None:
        body["user"] = str(user)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
            raise TypeError(f"timeout must be a non-negative number of seconds, not {timeout!r}")
        body["timeout_ms"] = math.ceil(timeout * 1000)
    if detach:
        body["detach"] = True
        if log is not None:
            body["log"] = log
    return body


def octal_mode(mode: int | str | None) -> str | None:
    """A file mode as the API's query wants it ("0644")."""
    if mode is None:
        return None
    if isinstance(mode, bool) or not isinstance(mode, int | str):
        raise TypeError(f"mode must be an int (0o644) or an octal string ('0644'), not {mode!r}")
    if isinstance(mode, int):
        if not 0 <= mode <= 0o7777:
            raise ValueError(f"mode must be within 0o7777, not {oct(mode)}")
        return f"{mode:04o}"
    return mode


class Utf8Stream:
    """Decodes a byte stream as UTF-8 piece by piece: a character split across
    two frames is held until its end arrives."""

    def __init__(self) -> None:
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.parts: list[str] = []

    def feed(self, data: bytes) -> str:
        s = self._dec.decode(data)
        if s:
            self.parts.append(s)
        return s

    def finish(self) -> str:
        s = self._dec.decode(b"", final=True)
        if s:
            self.parts.append(s)
        return s

    def text(self) -> str:
        return "".join(self.parts)
