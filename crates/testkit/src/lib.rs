//! The fixtures that drumsd's integration tests and the benches share, so
//! that each exists once:
//!
//! - [`registry`]: a real distribution v2 registry (Debian's
//!   `docker-registry`) on loopback, in a temporary directory, with optional
//!   basic auth, images pushed into it by skopeo, and a blob corrupted in
//!   its storage on demand;
//! - [`oci`]: the media types an image layout names, and a layer's tar of a
//!   directory tree, deterministic.
//!
//! Everything here returns a `Result` with a typed error that names the
//! failing operation and keeps its source; the tests `.expect` them, the
//! benches pass them on. A missing program is an error, never a skip.

pub mod oci;
pub mod registry;

pub use oci::OciError;
pub use registry::{Registry, RegistryError};

fn write_chain(f: &mut std::fmt::Formatter<'_>, e: &dyn std::error::Error) -> std::fmt::Result {
    // The one chain formatter's text, for a test's `.expect`.
    f.write_str(&drums_api::error_chain(e))
}
