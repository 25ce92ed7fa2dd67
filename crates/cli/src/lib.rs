//! The `drums` command: a thin client of drumsd's API. If no daemon answers, it
//! starts one for the local user (the embedded default).

pub mod args;
pub mod build;
pub mod commands;
pub mod demo;
pub mod images;
pub mod inspect;
pub mod pools;
pub mod program;
pub mod sibling;
pub mod versions;

pub use args::Cli;
// Finding drumsd and the exit codes are the client crate's, shared with
// vmrun and the benches.
pub use drums_client::{connect, exit, table};
