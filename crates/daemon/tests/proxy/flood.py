"""What a hostile session does to the LLM proxy (issue 23): opens CONNS
connections to it at once, each a model request whose body comes fast up to
MIB MiB and then one byte at a time, never to end. Half declare a 32 MiB
Content-Length, half send chunks. Python's standard library only, as an
agent in any image could.

Usage: flood.py HOST PORT CONNS MIB OUT
Writes OUT.ready once every connection has sent its fast part (or was
refused), and OUT (JSON, one entry per connection: the status it got or
"reset", the bytes it sent, and the seconds until its answer) when every
connection has an answer or has waited 90 s.
"""

import json
import select
import socket
import sys
import threading
import time

host, port, conns, mib, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
results = [None] * conns
sent_fast = threading.Semaphore(0)


def answer(s):
    """The status of an answer waiting on `s`, or None if none is yet."""
    r, _, _ = select.select([s], [], [], 0)
    if not r:
        return None
    data = s.recv(65536)
    if not data:
        return "closed"
    try:
        return int(data.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return "garbled"


def one(i):
    chunked = i % 2 == 1
    started = time.time()
    sent = 0
    status = None
    signalled = False
    try:
        s = socket.create_connection((host, port), timeout=90)
        head = "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else "Content-Length: %d\r\n\r\n" % (32 << 20)
        s.sendall(head.encode())
        # A refusal of the declared length comes before any body is read:
        # look for it before sending one.
        time.sleep(0.3)
        status = answer(s)
        piece = b"x" * (256 << 10)
        while status is None and sent < (mib << 20):
            s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
            sent += len(piece)
            status = answer(s)
        sent_fast.release()
        signalled = True
        # Then slowly, until the proxy answers.
        while status is None and time.time() - started < 90:
            time.sleep(0.5)
            status = answer(s)
            if status is None:
                s.send(b"1\r\nx\r\n" if chunked else b"x")
                sent += 1
    except (ConnectionResetError, BrokenPipeError):
        status = "reset"
    except OSError as e:
        status = "error: %s" % e
    if not signalled:
        sent_fast.release()
    results[i] = {"status": status, "chunked": chunked, "sent": sent,
                  "seconds": round(time.time() - started, 2)}


threads = [threading.Thread(target=one, args=(i,)) for i in range(conns)]
for t in threads:
    t.start()
for _ in range(conns):
    sent_fast.acquire()
open(out + ".ready", "w").close()
for t in threads:
    t.join()
with open(out + ".tmp", "w") as f:
    json.dump(results, f)
import os
os.rename(out + ".tmp", out)
