"""drums eval's agent that lives in its session (docs/eval.md, "Agents").

It is what a coding agent in a sandbox is: a Python program using the
official `openai` SDK, unchanged but for its base URL, which is drumsd's
LLM proxy on the session's gateway; it runs each tool call with
`subprocess`. Its commands inherit its environment: the eval starts it
with the one every command of a trace runs with (docs/eval.md). The session is known to the proxy by its address, so the
agent names none. After a recovery its connection to the proxy comes back
closed, and the SDK tries the request again, as it does for any broken
connection.

Usage: agent.py PROXY MODEL TASK   (PROXY: ADDR:PORT; MODEL: trace/NAME@RUN)
"""

import json
import subprocess
import sys

from openai import OpenAI

PROXY, MODEL, TASK = sys.argv[1], sys.argv[2], sys.argv[3]
DONE = "/opt/drums-eval/done"
TOOLS = [{
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command in /root/task",
        "parameters": {"type": "object",
                       "properties": {"command": {"type": "string"}},
                       "required": ["command"]},
    },
}]

client = OpenAI(base_url=f"http://{PROXY}/v1", api_key="drums-eval",
                max_retries=60, timeout=300.0)
messages = [
    {"role": "system",
     "content": "You are a shell agent. Use the shell tool; the task is in /root/task."},
    {"role": "user", "content": TASK},
]
while True:
    answer = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    message = answer.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        break
    for call in message.tool_calls:
        command = json.loads(call.function.arguments)["command"]
        done = subprocess.run(["sh", "-c", command], cwd="/root/task",
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=120)
        out = done.stdout.decode(errors="replace")[:4096]
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": f"exit {done.returncode}\n{out}"})
open(DONE, "w").close()
