//! The drumsd REST API: the types on the wire and a client over a unix socket.
//!
//! `api/openapi.yaml` at the repository root is the source of truth for routes and
//! shapes; these types follow it, and the daemon's tests check both against each
//! other. The same client also speaks to the guest agent inside a session, which
//! listens on a unix socket too.

pub mod client;
pub mod cpus;
mod error_chain;
pub mod exec;
pub mod guest;
pub mod size;
pub mod states;
pub mod types;

pub use client::{Client, ClientError};
pub use cpus::{check_cpus, parse_cpus, CpusError, MIN_CPUS};
pub use error_chain::{error_chain, error_chain_map};
pub use exec::{exec, ExecError, Stream};
pub use size::{parse_size, SizeError};
pub use states::*;
pub use types::*;

/// The port of drumsd's session API on the bridge address (see
/// docs/agent-tool.md), unless drumsd is told another.
pub const SESSION_API_PORT: u16 = 7071;

/// The port of drumsd's LLM proxy (the coordinator, docs/coordinator.md), on
/// the bridge address for agents inside sessions and on 127.0.0.1 for agents
/// outside, unless drumsd is told another.
pub const LLM_PROXY_PORT: u16 = 7080;

/// The OpenAPI document, embedded so the daemon can serve it at `/openapi.yaml`.
pub const OPENAPI_YAML: &str = include_str!("../../../api/openapi.yaml");
