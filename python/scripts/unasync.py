#!/usr/bin/env python3
"""Generate the sync twin from the async source, as httpcore does.

    python scripts/unasync.py           rewrite src/drums/_sync and tests/_sync
    python scripts/unasync.py --check   exit 1 if a generated file differs

The async code under `src/drums/_async/` (and the async tests under
`tests/_async/`) is the only hand-written copy; every file of the sync twin is
this script's output and is committed, so a reader sees real code and CI
proves it matches. The table below is the whole transformation: a word
replacement, applied line by line, outside nothing (strings and comments are
rewritten too, so docstrings read right in both twins).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

# (async source directory, sync output directory), relative to python/.
DIRS = [
    ("src/drums/_async", "src/drums/_sync"),
    ("tests/_async", "tests/_sync"),
    ("src/drums/ray/_async", "src/drums/ray/_sync"),
]

# Exact words, longest first where one contains another.
WORDS = {
    "AsyncIterator": "Iterator",
    "AsyncIterable": "Iterable",
    "AsyncGenerator": "Generator",
    "AsyncExitStack": "ExitStack",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "StopAsyncIteration": "StopIteration",
    "aclose": "close",
    "handle_async_request": "handle_request",
    "aiter_bytes": "iter_bytes",
    "aiter_lines": "iter_lines",
    "aiter_raw": "iter_raw",
    "aread": "read",
    "aiter": "iter",
    "anext": "next",
    "_async": "_sync",
}

SUBS: list[tuple[re.Pattern[str], str]] = [
    # A test marked for anyio runs as a plain function in the sync twin.
    (re.compile(r"^\s*@pytest\.mark\.anyio\n$"), ""),
    (re.compile(r"\basync def\b"), "def"),
    (re.compile(r"\basync with\b"), "with"),
    (re.compile(r"\basync for\b"), "for"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"\b(" + "|".join(sorted(WORDS, key=len, reverse=True)) + r")\b"), ""),
    # AsyncClient -> Client, AsyncSandbox -> Sandbox, httpx.AsyncHTTPTransport
    # -> httpx.HTTPTransport, AsyncTask -> Task (drums/_backends.py).
    (re.compile(r"\bAsync([A-Z]\w*)"), r"\1"),
    # async_sleep -> sleep, async_default_client -> default_client.
    (re.compile(r"\basync_(\w+)"), r"\1"),
    # Prose: "the async twin" stays; "an async iterator" reads "an iterator",
    # "an async context manager" "a context manager".
    (re.compile(r"\ban async iterator\b"), "an iterator"),
    (re.compile(r"\ban async context manager\b"), "a context manager"),
]

HEADER = "# GENERATED from {src} by scripts/unasync.py: do not edit.\n"


def convert_line(line: str) -> str:
    for pat, repl in SUBS:
        if pat.pattern.startswith(r"\b(") and repl == "":
            line = pat.sub(lambda m: WORDS[m.group(1)], line)
        else:
            line = pat.sub(repl, line)
    return line


def convert(text: str, src: str) -> str:
    out = [HEADER.format(src=src)]
    out.extend(convert_line(line) for line in text.splitlines(keepends=True))
    return "".join(out)


def plan() -> dict[Path, str]:
    """Every sync file, and what it must hold."""
    want: dict[Path, str] = {}
    for src_dir, dst_dir in DIRS:
        for src in sorted((HERE / src_dir).glob("*.py")):
            rel = src.relative_to(HERE).as_posix()
            want[HERE / dst_dir / src.name] = convert(src.read_text(), rel)
    return want


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a generated file differs")
    args = ap.parse_args()
    want = plan()
    stale: list[str] = []
    for _src_dir, dst_dir in DIRS:
        for have in sorted((HERE / dst_dir).glob("*.py")):
            if have not in want:
                stale.append(f"{have.relative_to(HERE)}: no async source")
                if not args.check:
                    have.unlink()
    for path, text in want.items():
        if path.exists() and path.read_text() == text:
            continue
        stale.append(f"{path.relative_to(HERE)}: differs from its async source")
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if args.check and stale:
        print("unasync --check: the sync twin is out of date; run python/scripts/unasync.py:")
        for s in stale:
            print(f"  {s}")
        return 1
    if not args.check:
        for s in stale:
            print(f"unasync: wrote {s.split(':')[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
