//! Server-sent events, as far as the gate needs them: where each event ends,
//! and which event ends a model's answer.
//!
//! A stream passes through event by event: each complete event is forwarded
//! as soon as its blank line arrives, and only the *final* event is held
//! until the turn's version is durable. The final event is the one after
//! which a client SDK considers the answer complete:
//! - OpenAI chat completions: `data: [DONE]`;
//! - OpenAI responses: `response.completed`, `response.failed`,
//!   `response.incomplete`, or `error`;
//! - Anthropic messages: `message_stop`, or `error`.
//!
//! Named by an `event:` line or by the `type` of a `data:` JSON object (some
//! servers send no `event:` lines).

use bytes::{Bytes, BytesMut};

/// Event types after which an answer is complete.
const FINAL_TYPES: &[&str] = &[
    "message_stop",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
];

/// Splits a byte stream into events; holds everything from the final event
/// on.
#[derive(Default)]
pub struct Splitter {
    /// Bytes of an event not complete yet.
    partial: BytesMut,
    /// The final event and everything after it, once seen.
    held: Option<BytesMut>,
}

impl Splitter {
    /// Take a chunk; returns what may go to the client now (complete events
    /// before the final one).
    pub fn push(&mut self, chunk: &[u8]) -> Bytes {
        if let Some(h) = &mut self.held {
            h.extend_from_slice(chunk);
            return Bytes::new();
        }
        self.partial.extend_from_slice(chunk);
        let mut out = BytesMut::new();
        while let Some(end) = event_end(&self.partial) {
            let event = self.partial.split_to(end);
            if is_final(&event) {
                let mut held = event;
                held.extend_from_slice(&self.partial);
                self.partial.clear();
                self.held = Some(held);
                break;
            }
            out.extend_from_slice(&event);
        }
        out.freeze()
    }

    /// What is left at the end: the held final event (and anything after
    /// it), or an incomplete last event.
    pub fn finish(&mut self) -> Bytes {
        let mut rest = self.held.take().unwrap_or_default();
        rest.extend_from_slice(&self.partial);
        self.partial.clear();
        rest.freeze()
    }
}

/// The end (exclusive) of the first complete event in `b`: after its blank
/// line, in any of the three line endings SSE allows.
fn event_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i < b.len() {
        let first = match b[i] {
            b'\n' => i + 1,
            b'\r' if b.get(i + 1) == Some(&b'\n') => i + 2,
            b'\r' if i + 1 < b.len() => i + 1,
            // A lone \r at the end may be the start of \r\n: wait.
            _ => {
                i += 1;
                continue;
            }
        };
        // A line ended at `first`; an empty line right after ends the event.
        match (b.get(first), b.get(first + 1)) {
            (Some(b'\n'), _) => return Some(first + 1),
            (Some(b'\r'), Some(b'\n')) => return Some(first + 2),
            (Some(b'\r'), Some(_)) => return Some(first + 1),
            _ => i = first,
        }
    }
    None
}

/// An event that completes the answer (see the module's comment).
fn is_final(event: &[u8]) -> bool {
    let text = String::from_utf8_lossy(event);
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        let field = |name: &str| {
            line.strip_prefix(name)
                .map(|v| v.strip_prefix(' ').unwrap_or(v))
        };
        if let Some(v) = field("event:") {
            if FINAL_TYPES.contains(&v) {
                return true;
            }
        } else if let Some(v) = field("data:") {
            if v == "[DONE]" {
                return true;
            }
            if v.starts_with('{') {
                if let Ok(serde_json::Value::Object(o)) = serde_json::from_str(v) {
                    if o.get("type")
                        .and_then(|t| t.as_str())
                        .is_some_and(|t| FINAL_TYPES.contains(&t))
                    {
                        return true;
                    }
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&str]) -> (Vec<String>, String) {
        let mut s = Splitter::default();
        let out = chunks
            .iter()
            .map(|c| String::from_utf8(s.push(c.as_bytes()).to_vec()).unwrap())
            .collect();
        (out, String::from_utf8(s.finish().to_vec()).unwrap())
    }

    #[test]
    fn openai_chat_passes_each_event_and_holds_done() {
        let (out, held) = run(&[
            "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\ndata: [DONE]\n\n",
        ]);
        assert_eq!(
            out,
            [
                "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
                "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
            ]
        );
        assert_eq!(held, "data: [DONE]\n\n");
    }

    #[test]
    fn anthropic_holds_message_stop_even_split_across_chunks() {
        let (out, held) = run(&[
            "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\"}\r\n\r\neve",
            "nt: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n",
            "\r\n",
        ]);
        assert_eq!(
            out,
            [
                "event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\"}\r\n\r\n",
                "",
                ""
            ]
        );
        assert_eq!(
            held,
            "event: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n"
        );
    }

    #[test]
    fn a_final_type_in_data_alone_counts_and_others_do_not() {
        let delta = "data: {\"type\":\"response.output_text.delta\",\"delta\":\"error\"}\n\n";
        let (out, held) = run(&[delta, "data: {\"type\":\"response.completed\"}\n\n"]);
        assert_eq!(out[0], delta);
        assert_eq!(out[1], "");
        assert_eq!(held, "data: {\"type\":\"response.completed\"}\n\n");
    }

    #[test]
    fn an_incomplete_event_waits_and_a_stream_without_final_ends_with_it() {
        let (out, held) = run(&["data: a\n", "\ndata: b"]);
        assert_eq!(out, ["", "data: a\n\n"]);
        assert_eq!(held, "data: b");
    }
}
