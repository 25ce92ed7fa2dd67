//! The drums guest agent.
//!
//! `drums-guest` runs inside every drums session, as root, supervised by the
//! session's init: after `pivot_root` its `/` is the session's root, so every
//! path and user it handles is the session's. drumsd on the host talks to it
//! over HTTP/1.1 on a unix socket (`/run/drums/guest.sock`, reached from the
//! host through `/proc/<init pid>/root/run/drums/guest.sock`) to run commands
//! and move files. The API is documented in `docs/guest-api.md`.
//!
//! It is built to be small: a single-threaded tokio runtime, streamed bodies,
//! no buffering of command output or file contents.
//!
//! Modules:
//! - [`server`]: router, listeners, serving until a signal.
//! - [`exec`]: `POST /v1/exec`, running commands with streamed output.
//! - [`files`]: `/v1/files` and `/v1/dir`.
//! - [`hygiene`]: `/v1/hygiene`, what a restored sibling changes inside
//!   itself (hostname, machine-id, generation, the reseed protocol).
//! - [`desktop`]: `/v1/desktop…`, the desktop profile's services, its
//!   agent-readiness, the browser's hygiene, and OSWorld's port 5000.
//! - [`rollback`]: `/v1/versions` and `/v1/rollback`, the agent's rollback
//!   tool, forwarded to drumsd's session API on the gateway.
//! - [`paths`]: lexical resolution of client paths.
//! - [`users`]: `/etc/passwd` and `/etc/group` lookup without NSS.
//! - [`error`]: the JSON error body.

pub mod desktop;
pub mod error;
pub mod exec;
pub mod files;
pub mod hygiene;
pub mod paths;
pub mod rollback;
pub mod server;
pub mod users;

pub use error::ApiError;
pub use hygiene::HygieneConfig;
pub use rollback::SessionApi;
pub use server::{
    router, router_full, router_with, serve, Listener, ServeError, Server, DEFAULT_SOCKET,
};
