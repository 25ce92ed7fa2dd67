//! The trace format (docs/eval.md, "Traces") and the corpus compiled into
//! `drums`: one shell agent's run, turn by turn, as the model asked for it.

use serde::Deserialize;

/// The trace format this build reads.
pub const FORMAT: u32 = 1;

/// What a recovery must bring back for a trace's check and state to match
/// its fault-free run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Needs {
    None,
    Files,
    Processes,
}

impl Needs {
    pub fn as_str(self) -> &'static str {
        match self {
            Needs::None => "none",
            Needs::Files => "files",
            Needs::Processes => "processes",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trace {
    pub format: u32,
    pub name: String,
    pub summary: String,
    pub needs: Needs,
    #[serde(default)]
    pub setup: Vec<String>,
    pub check: String,
    #[serde(default)]
    pub observe: Option<String>,
    #[serde(rename = "turn")]
    pub turns: Vec<Turn>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    pub latency_ms: u64,
    pub class: drums_api::TurnClass,
    pub commands: Vec<String>,
    #[serde(default)]
    pub note: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace {file}")]
    Parse {
        file: String,
        #[source]
        source: toml::de::Error,
    },
    #[error("trace {file}: {why}")]
    Invalid { file: String, why: String },
}

/// The corpus, `crates/eval/traces/*.toml`, in file order (build.rs).
const CORPUS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/corpus.rs"));

/// Every trace of the corpus, checked.
pub fn corpus() -> Result<Vec<Trace>, TraceError> {
    let traces = CORPUS
        .iter()
        .map(|(file, text)| parse(file, text))
        .collect::<Result<Vec<_>, _>>()?;
    let mut names: Vec<&str> = traces.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
        return Err(TraceError::Invalid {
            file: w[0].into(),
            why: "two traces have this name".into(),
        });
    }
    Ok(traces)
}

/// Parses and checks one trace; `file` names it in errors.
pub fn parse(file: &str, text: &str) -> Result<Trace, TraceError> {
    let t: Trace = toml::from_str(text).map_err(|source| TraceError::Parse {
        file: file.into(),
        source,
    })?;
    let bad = |why: String| {
        Err(TraceError::Invalid {
            file: file.into(),
            why,
        })
    };
    if t.format != FORMAT {
        return bad(format!(
            "format {} (this drums reads format {FORMAT})",
            t.format
        ));
    }
    let name_ok = !t.name.is_empty()
        && t.name.len() <= 48
        && t.name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !name_ok {
        return bad(format!("name {:?} is not [a-z0-9-]{{1,48}}", t.name));
    }
    if t.turns.is_empty() {
        return bad("no turns".into());
    }
    for (i, turn) in t.turns.iter().enumerate() {
        if turn.commands.is_empty() {
            return bad(format!("turn {} has no commands", i + 1));
        }
        if turn.latency_ms == 0 || turn.latency_ms > 120_000 {
            return bad(format!(
                "turn {}: latency_ms {} is not in 1..=120000",
                i + 1,
                turn.latency_ms
            ));
        }
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = r#"
format = 1
name = "t"
summary = "s"
needs = "files"
check = "echo 1"
[[turn]]
latency_ms = 10
class = "files"
commands = ["touch a"]
"#;

    #[test]
    fn the_corpus_parses_and_names_are_unique() {
        let c = corpus().expect("corpus");
        assert!(c.len() >= 30, "the corpus has {} traces", c.len());
    }

    #[test]
    fn a_trace_parses() {
        let t = parse("t.toml", OK).unwrap();
        assert_eq!(t.turns.len(), 1);
        assert_eq!(t.needs, Needs::Files);
    }

    #[test]
    fn bad_traces_are_refused_with_the_reason() {
        for (text, why) in [
            (OK.replace("format = 1", "format = 2"), "format 2"),
            (OK.replace("name = \"t\"", "name = \"T/..\""), "is not"),
            (
                OK.replace("latency_ms = 10", "latency_ms = 0"),
                "latency_ms 0",
            ),
            (
                OK.replace("class = \"files\"", "class = \"some\""),
                "unknown",
            ),
            (
                OK.replace("needs = \"files\"", "needs = \"x\"\nextra = 1"),
                "unknown",
            ),
            (
                OK.replace("commands = [\"touch a\"]", "commands = []"),
                "no commands",
            ),
        ] {
            let e = parse("t.toml", &text).unwrap_err();
            let msg = format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            );
            assert!(msg.contains(why), "{why:?} not in {msg:?}");
        }
    }
}
