"""A mock LLM upstream for the coordinator's tests and bench: OpenAI chat
completions and responses, Anthropic messages, streaming or not, in the
wire formats the official SDKs parse. The model name steers it:

- the answer is "echo: " + the last user message's text;
- "delay-MS" in the model name waits MS milliseconds before answering, and
  as long again spread over a stream's events;
- "status-CODE" answers CODE with an error body;
- "cut" breaks a stream off after its first event.

Usage: mock_llm.py PORT_FILE  (binds 127.0.0.1:0 and writes the port there).
Every request is logged as one JSON line to stdout.
"""

import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNKS = 4


def last_text(body):
    if "messages" in body:
        m = body["messages"][-1]["content"]
        if isinstance(m, list):
            m = " ".join(p.get("text", "") for p in m if isinstance(p, dict))
        return m
    i = body.get("input", "")
    if isinstance(i, list):
        i = i[-1].get("content", "")
        if isinstance(i, list):
            i = " ".join(p.get("text", "") for p in i if isinstance(p, dict))
    return i


def pieces(text):
    n = max(1, len(text) // CHUNKS)
    return [text[i:i + n] for i in range(0, len(text), n)]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send_json(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)

    def do_GET(self):
        print(json.dumps({"method": "GET", "path": self.path}), flush=True)
        if self.path == "/v1/models":
            self.send_json(200, {"object": "list", "data": [{"id": "mock", "object": "model", "created": 0, "owned_by": "drums"}]})
        else:
            self.send_json(404, {"error": {"message": "no such path", "type": "not_found"}})

    def do_POST(self):
        n = int(self.headers.get("content-length", "0"))
        raw = self.rfile.read(n)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self.send_json(400, {"error": {"message": "bad json", "type": "invalid_request_error"}})
            return
        model = body.get("model", "")
        print(json.dumps({"method": "POST", "path": self.path, "model": model,
                          "auth": bool(self.headers.get("authorization") or self.headers.get("x-api-key")),
                          "stream": bool(body.get("stream"))}), flush=True)
        m = re.search(r"status-(\d+)", model)
        if m:
            self.send_json(int(m.group(1)), {"type": "error", "error": {"message": "mock error", "type": "api_error"}})
            return
        m = re.search(r"delay-(\d+)", model)
        delay = int(m.group(1)) / 1000 if m else 0
        time.sleep(delay)
        text = "echo: " + str(last_text(body))
        if self.path == "/v1/chat/completions":
            self.chat(body, text, delay, model)
        elif self.path == "/v1/responses":
            self.openai_responses(body, text, delay, model)
        elif self.path == "/v1/messages":
            self.messages(body, text, delay, model)
        else:
            self.send_json(404, {"error": {"message": "no such path", "type": "not_found"}})

    def stream(self, events, delay, model):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        gap = delay / max(1, len(events))
        for i, e in enumerate(events):
            if "cut" in model and i == 1:
                self.wfile.write(b"5\r\nevent")  # a chunk never finished
                self.wfile.flush()
                self.close_connection = True
                return
            data = e.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(gap)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def chat(self, body, text, delay, model):
        base = {"id": "chatcmpl-mock", "created": 0, "model": model}
        if not body.get("stream"):
            self.send_json(200, dict(base, object="chat.completion", choices=[{
                "index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": text}}],
                usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}))
            return
        events = []
        for i, p in enumerate(pieces(text)):
            delta = {"content": p} if i else {"role": "assistant", "content": p}
            events.append("data: " + json.dumps(dict(base, object="chat.completion.chunk", choices=[
                {"index": 0, "delta": delta, "finish_reason": None}])) + "\n\n")
        events.append("data: " + json.dumps(dict(base, object="chat.completion.chunk", choices=[
            {"index": 0, "delta": {}, "finish_reason": "stop"}])) + "\n\n")
        events.append("data: [DONE]\n\n")
        self.stream(events, delay, model)

    def openai_responses(self, body, text, delay, model):
        msg = {"id": "msg_mock", "type": "message", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": []}]}
        resp = {"id": "resp_mock", "object": "response", "created_at": 0, "model": model,
                "status": "completed", "output": [msg], "parallel_tool_calls": False,
                "tool_choice": "auto", "tools": []}
        if not body.get("stream"):
            self.send_json(200, resp)
            return
        def ev(kind, obj):
            obj = dict(obj, type=kind)
            return "event: %s\ndata: %s\n\n" % (kind, json.dumps(obj))
        events = [ev("response.created", {"response": dict(resp, status="in_progress", output=[]), "sequence_number": 0})]
        seq = 1
        for p in pieces(text):
            events.append(ev("response.output_text.delta", {"item_id": "msg_mock", "output_index": 0,
                                                             "content_index": 0, "delta": p, "sequence_number": seq}))
            seq += 1
        events.append(ev("response.completed", {"response": resp, "sequence_number": seq}))
        self.stream(events, delay, model)

    def messages(self, body, text, delay, model):
        msg = {"id": "msg_mock", "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
               "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}
        if not body.get("stream"):
            self.send_json(200, msg)
            return
        def ev(kind, obj):
            obj = dict(obj, type=kind)
            return "event: %s\ndata: %s\n\n" % (kind, json.dumps(obj))
        events = [ev("message_start", {"message": dict(msg, content=[], stop_reason=None)}),
                  ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})]
        for p in pieces(text):
            events.append(ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": p}}))
        events += [ev("content_block_stop", {"index": 0}),
                   ev("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                        "usage": {"output_tokens": 1}}),
                   ev("message_stop", {})]
        self.stream(events, delay, model)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(sys.argv[1], "w") as f:
        f.write(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
