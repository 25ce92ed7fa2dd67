"""A mock OpenAI-compatible upstream on 127.0.0.1, in the test's process.

`POST /v1/chat/completions` answers with one call of mini-swe-agent's `bash`
tool. What it calls is scripted per model name (`MockLLM.script(model,
commands)`): the step is the number of assistant messages already in the
request, so an answer depends only on the conversation, never on how many
requests came before (a retried request gets the same answer).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Seen:
    """One request the mock answered."""

    path: str
    model: str
    step: int
    session_header: str | None


class MockLLM:
    def __init__(self) -> None:
        self._scripts: dict[str, list[str]] = {}
        self.seen: list[Seen] = []
        self.before_answer: Callable[[str, int], None] | None = None
        """Called with (model, step) before each answer: a test's hook."""
        self._lock = threading.Lock()
        mock = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, {"error": {"message": f"no {self.path}", "type": "mock"}})
                    return
                self._send(200, mock._answer(self.path, body, self.headers.get("x-drums-session")))

            def _send(self, code: int, obj: object) -> None:
                b = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> MockLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def script(self, model: str, commands: list[str]) -> None:
        """What model `model` runs, one command per step."""
        with self._lock:
            self._scripts[model] = list(commands)

    def requests_for(self, model: str) -> list[Seen]:
        with self._lock:
            return [s for s in self.seen if s.model == model]

    def _answer(self, path: str, body: dict[str, Any], header: str | None) -> dict[str, Any]:
        model = str(body.get("model", ""))
        step = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        with self._lock:
            self.seen.append(Seen(path, model, step, header))
            commands = self._scripts.get(model, ["echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"])
        if self.before_answer is not None:
            self.before_answer(model, step)
        command = commands[min(step, len(commands) - 1)]
        return {
            "id": f"chatcmpl-{model}-{step}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": f"step {step}",
                        "tool_calls": [
                            {
                                "id": f"call_{step}",
                                "type": "function",
                                "function": {
                                    "name": "bash",
                                    "arguments": json.dumps({"command": command}),
                                },
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }
