//! The mock model is the bench library's ([`drums_bench::mock`]), shared
//! with the benches; what it answers is made of a trace.

pub use drums_bench::mock::{
    fnv_str, serve, Event, Latency, Mock, Script, Step, MODEL_PREFIX, TOOL,
};

use crate::trace::Trace;

/// What the mock answers for `t`: its turns' latencies and commands.
pub fn script(t: &Trace) -> Script {
    Script {
        name: t.name.clone(),
        turns: t
            .turns
            .iter()
            .map(|u| Step {
                latency_ms: u.latency_ms,
                commands: u.commands.clone(),
            })
            .collect(),
    }
}
