//! Root filesystem images for drums sessions.
//!
//! A drums *image* is a Debian root filesystem built with `debootstrap`.
//! Sessions mount it read-only as the lower layer of an overlayfs, so one
//! image is shared by every session started from it and is never written to
//! after it has been built.
//!
//! Layout under an images directory (default [`DEFAULT_IMAGES_DIR`]):
//!
//! ```text
//! <images_dir>/<name>/rootfs/        the tree
//! <images_dir>/<name>/image.json     metadata, written last
//! <images_dir>/.build-<name>-<pid>/  an image being built (or a leftover of a crashed build)
//! <images_dir>/.build-<name>.log     output of the last debootstrap run for <name>
//! <images_dir>/.lock                 serializes builds and removals
//! ```
//!
//! An image directory counts as an image only once `image.json` exists in it:
//! builds happen in a `.build-*` directory that is renamed into place after
//! `image.json` has been written and synced, so a crash never leaves a
//! half-built tree under an image name.
//!
//! The Debian mirror is never configured in drums: [`mirror_from_apt_sources`]
//! reads it from the host's apt sources at run time, so images come from the
//! same place as the host's own packages.

mod customize;
pub mod desktop;
mod error;
mod fsutil;
mod recipe;
mod sources;
mod store;

pub use customize::{customize, PYTHON_HOOK_DIR, RESEED_MODULE, RESEED_PTH};
pub use error::ImageError;
pub use recipe::{Recipe, RECIPE_REVISION};
pub use sources::mirror_from_apt_sources;
pub use store::{
    host_arch, validate_name, ImageInfo, ImageStore, DEFAULT_CACHE_DIR, DEFAULT_IMAGES_DIR,
    FORMAT_VERSION,
};
