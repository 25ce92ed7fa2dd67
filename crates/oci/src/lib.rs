//! OCI images as drums images (docs/oci.md): where an image comes from (a
//! registry, an archive), what it is (its manifest and config, checked), and
//! its layers applied the way the image spec defines a changeset, refusing
//! what a stranger's layer must not do to the host and never making a
//! device node it holds.

pub mod archive;
pub mod auth;
pub mod error;
pub mod layer;
pub mod manifest;
pub mod registry;
pub mod store;

pub use archive::{unpack, Archive, ArchiveLimits};
pub use auth::{credentials_for, registry_of};
pub use error::SourceError;
pub use layer::{apply, Applied, LayerError, LayerLimits, Skip, Skipped, ENTRY_BYTES};
pub use manifest::{ImageConfig, ImageManifest, LayerDesc};
pub use registry::{Credentials, PullOptions, Remote};
pub use store::{chain_ids, normalize_reference, ImageSummary, OciStore, StoreOpError, Swept};
