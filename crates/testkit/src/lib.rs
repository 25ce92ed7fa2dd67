//! The fixtures that drumsd's integration tests and the benches share, so
//! that each exists once:
//!
//! - [`registry`]: a real distribution v2 registry (Debian's
//!   `docker-registry`) on loopback, in a temporary directory, with optional
//!   basic auth, images pushed into it by skopeo, and a blob corrupted in
//!   its storage on demand.
//!
//! Everything here returns a `Result` with a typed error that names the
//! failing operation and keeps its source; the tests `.expect` them, the
//! benches pass them on. A missing program is an error, never a skip.

pub mod registry;

pub use registry::{Registry, RegistryError};
