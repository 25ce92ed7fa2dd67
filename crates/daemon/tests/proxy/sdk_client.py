"""Calls a model through the official SDKs, unchanged but for the base URL,
and prints one JSON line per call: what the SDK returned, and when the
answer's last event (or the whole answer) arrived.

Usage: sdk_client.py BASE_URL KIND MODEL TEXT [HEADER=VALUE]
KIND: chat, chat-stream, responses, responses-stream, messages,
messages-stream. BASE_URL is what an agent would set (with /v1 for OpenAI's
SDK, without for Anthropic's; the script adds it).
"""

import json
import sys
import time

base, kind, model, text = sys.argv[1:5]
headers = dict(h.split("=", 1) for h in sys.argv[5:])
t0 = time.time()
out = {}
if kind.startswith("messages"):
    import anthropic
    c = anthropic.Anthropic(base_url=base, api_key="sk-test", default_headers=headers, max_retries=0)
    if kind == "messages":
        m = c.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": text}])
        out["text"] = m.content[0].text
    else:
        parts = []
        with c.messages.stream(model=model, max_tokens=64, messages=[{"role": "user", "content": text}]) as s:
            for t in s.text_stream:
                parts.append(t)
            out["first_event_at"] = None
        out["text"] = "".join(parts)
else:
    import openai
    c = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", default_headers=headers, max_retries=0)
    if kind == "chat":
        r = c.chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
        out["text"] = r.choices[0].message.content
    elif kind == "chat-stream":
        parts = []
        for ch in c.chat.completions.create(model=model, stream=True, messages=[{"role": "user", "content": text}]):
            if ch.choices and ch.choices[0].delta.content:
                parts.append(ch.choices[0].delta.content)
                out.setdefault("first_token_s", time.time() - t0)
        out["text"] = "".join(parts)
    elif kind == "responses":
        r = c.responses.create(model=model, input=text)
        out["text"] = r.output_text
    elif kind == "responses-stream":
        parts = []
        for ev in c.responses.create(model=model, input=text, stream=True):
            if ev.type == "response.output_text.delta":
                parts.append(ev.delta)
                out.setdefault("first_token_s", time.time() - t0)
        out["text"] = "".join(parts)
out["done_at"] = time.time()
out["took_s"] = out["done_at"] - t0
print(json.dumps(out))
