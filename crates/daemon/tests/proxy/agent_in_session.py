"""A scripted agent that lives in a session, for the coordinator's recovery
tests: TURNS model calls through the proxy at BASE (OpenAI chat
completions), each followed by the turn's tool work in the session.

Like the official SDKs, it tries a request again when the connection
breaks or the answer is a 5xx (after a recovery, its connection to the
proxy is restored closed). Its tool work is deliberately not idempotent:
each turn appends to a log, so a turn done twice on the same files shows.
Some turns start a long-lived worker process and one stops one, so the
session's processes change too.

Usage: agent_in_session.py BASE TURNS   (python3 standard library only)
"""

import http.client
import json
import os
import signal
import subprocess
import sys
import time

BASE, TURNS = sys.argv[1], int(sys.argv[2])
WORK = "/root/work"
# A long stretch of turns that only write files (more than retention's 8
# versions) between the processes started on turns 1 and 14.
SPAWN = {1, 14, 16}
STOP = {17: 1}


def ask(messages):
    body = json.dumps({"model": "agent-delay-150", "messages": messages}).encode()
    deadline = time.time() + 300
    while True:
        try:
            c = http.client.HTTPConnection(BASE, timeout=120)
            c.request("POST", "/v1/chat/completions", body,
                      {"content-type": "application/json", "authorization": "Bearer sk-test"})
            r = c.getresponse()
            data = r.read()
            c.close()
            if r.status < 500:
                assert r.status == 200, (r.status, data)
                return json.loads(data)
        except (OSError, http.client.HTTPException):
            pass
        if time.time() > deadline:
            sys.exit("no answer")
        time.sleep(0.2)


def worker_pids(turn):
    want = ("sleep\0%d\0" % (100000 + turn)).encode()
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/cmdline" % p, "rb") as f:
                    if f.read() == want:
                        yield int(p)
            except OSError:
                pass


def tool(turn, answer):
    with open(os.path.join(WORK, "f%02d" % turn), "w") as f:
        f.write(answer + "\n")
    with open(os.path.join(WORK, "log"), "a") as f:
        f.write("turn %d\n" % turn)
    if turn in SPAWN:
        subprocess.Popen(["sleep", str(100000 + turn)], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    if turn in STOP:
        for pid in worker_pids(STOP[turn]):
            os.kill(pid, signal.SIGKILL)


def main():
    os.makedirs(WORK, exist_ok=True)
    # Reap the workers it stops (it is their parent).
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    messages = [{"role": "user", "content": "start"}]
    for turn in range(TURNS):
        answer = ask(messages)["choices"][0]["message"]["content"]
        tool(turn, answer)
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": "did turn %d" % turn})
    # The last call: the run is over once it is answered.
    ask(messages)
    with open(os.path.join(WORK, "done"), "w") as f:
        f.write("%d turns\n" % TURNS)


main()
