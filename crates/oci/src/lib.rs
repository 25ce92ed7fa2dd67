//! OCI images as drums images (docs/oci.md): layers applied the way the
//! image spec defines a changeset, refusing what a stranger's layer must
//! not do to the host.

pub mod layer;

pub use layer::{apply, Applied, LayerError, LayerLimits};
