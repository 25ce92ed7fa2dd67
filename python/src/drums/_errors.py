"""Exceptions: one class per error kind drumsd (or a session's guest) answers with.

Every error the daemon sends is `{"error": {"kind", "message"}}` with a status
(api/openapi.yaml, docs/guest-api.md). The SDK keeps the server's `message`
verbatim and picks the class from `kind` first, the status second, so that a
new kind still lands in a fitting class.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drums._types import CommandResult

__all__ = [
    "CommandExitError",
    "CommandNotFound",
    "CommandTimeout",
    "Conflict",
    "DaemonUnavailable",
    "DrumsError",
    "InternalError",
    "InvalidArgument",
    "NotFound",
    "PathEscapesRoot",
    "PermissionDenied",
    "Unavailable",
    "Untrusted",
]


class DrumsError(Exception):
    """Base of every error the SDK raises.

    Attributes:
        message: the server's words, verbatim (or the SDK's, for errors that
            never reached a server).
        kind: the error's kind as the API names it (`not_found`, `conflict`,
            ...), or the SDK's own for errors without an answer
            (`daemon_unavailable`, `command_exit`).
        status: the HTTP status, when there was an answer.
        request_id: the answer's `x-request-id`; drumsd's log lines for the
            request carry it.
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str = "",
        status: int | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status
        self.request_id = request_id

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuilt with its attributes (kind, status, a command's result), not
        # by calling the class with `args` alone: a DrumsError that crosses a
        # process (a Ray actor's answer, drums.ray) arrives whole.
        return (_rebuild, (type(self), self.args, self.__dict__))

    def __str__(self) -> str:
        extra = []
        if self.status is not None:
            extra.append(f"{self.status} {self.kind}".strip())
        if self.request_id:
            extra.append(f"request {self.request_id}")
        return f"{self.message} ({', '.join(extra)})" if extra else self.message


class InvalidArgument(DrumsError):
    """The request was refused as malformed (400, 413, 414, 415; kind `bad_request`
    and the guest's `not_a_file`, `not_a_directory`, `is_a_directory`)."""


class PathEscapesRoot(InvalidArgument):
    """A path's `..` would climb above the session's root (400 `path_escapes_root`)."""


class NotFound(DrumsError):
    """No such session, checkpoint, image, job, pool, file, user or cwd (404)."""


class CommandNotFound(NotFound):
    """A command's `argv[0]` was not found in the session (404 `command_not_found`)."""


class Conflict(DrumsError):
    """The target's state refuses the request (409): a name taken, a session not
    running, a turn already open, an image in use."""


class Untrusted(DrumsError):
    """An archive is unsigned or signed by a key this host does not trust
    (403 `untrusted`); see `checkpoints.import_(trust_unsigned=True)`."""


class PermissionDenied(DrumsError):
    """The session's own permissions refuse it (403 from the guest): a command
    that is not executable, a file its user may not read or write."""


class Unavailable(DrumsError):
    """Busy for now, retry later (503, kind `busy`; 502 when a session's guest
    does not answer): the checkpoint engine's queues are full, or a pool had no
    member ready in time."""


class InternalError(DrumsError):
    """drumsd or the guest failed on its side (5xx)."""


class DaemonUnavailable(DrumsError):
    """Nothing answers on the socket, drumsd could not be started, or it died
    while streaming an answer (a stream that ends without its final frame)."""


class CommandExitError(DrumsError):
    """Raised by `commands.run(..., check=True)` when the command did not exit 0.

    Attributes:
        result: the `CommandResult`, with all the output.
    """

    def __init__(self, message: str, result: CommandResult) -> None:
        super().__init__(message, kind="command_exit")
        self.result = result

    @property
    def exit_code(self) -> int | None:
        """The command's exit status (None when a signal killed it)."""
        return self.result.exit_code

    @property
    def stdout(self) -> str:
        """Everything the command wrote to stdout."""
        return self.result.stdout

    @property
    def stderr(self) -> str:
        """Everything the command wrote to stderr."""
        return self.result.stderr


class CommandTimeout(CommandExitError, TimeoutError):
    """Raised by `commands.run(..., check=True)` when the command's timeout passed
    and the session killed it (the exit frame's `timed_out`)."""


_BY_KIND: dict[str, type[DrumsError]] = {
    "bad_request": InvalidArgument,
    "not_a_file": InvalidArgument,
    "not_a_directory": InvalidArgument,
    "is_a_directory": InvalidArgument,
    "path_escapes_root": PathEscapesRoot,
    "not_found": NotFound,
    "user_not_found": NotFound,
    "cwd_not_found": NotFound,
    "command_not_found": CommandNotFound,
    "conflict": Conflict,
    "untrusted": Untrusted,
    "permission_denied": PermissionDenied,
    "busy": Unavailable,
    "guest_unavailable": Unavailable,
    "internal": InternalError,
}

_BY_STATUS: dict[int, type[DrumsError]] = {
    400: InvalidArgument,
    413: InvalidArgument,
    414: InvalidArgument,
    415: InvalidArgument,
    403: PermissionDenied,
    404: NotFound,
    405: InvalidArgument,
    409: Conflict,
    502: Unavailable,
    503: Unavailable,
}


def error_from_response(status: int, body: bytes, request_id: str | None) -> DrumsError:
    """The exception for an error answer; its message is the server's, verbatim.

    A body that is not an ErrorBody (drumsd's HTTP library answers a 414 over
    64 KiB with none) keeps its text as the message.
    """
    kind = ""
    message = ""
    try:
        doc = json.loads(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            k, m = err.get("kind"), err.get("message")
            kind = k if isinstance(k, str) else ""
            message = m if isinstance(m, str) else ""
    except ValueError:
        pass
    if not message:
        message = body.decode("utf-8", "replace").strip() or f"HTTP {status} with no message"
    cls = _BY_KIND.get(kind) or _BY_STATUS.get(status)
    if cls is None:
        cls = InternalError if status >= 500 else DrumsError
    return cls(message, kind=kind, status=status, request_id=request_id)


def _rebuild(
    cls: type[DrumsError], args: tuple[object, ...], state: dict[str, object]
) -> DrumsError:
    e = cls.__new__(cls)
    e.args = args
    e.__dict__.update(state)
    return e
