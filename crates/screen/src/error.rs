use x11rb::errors::{ConnectError, ConnectionError, ReplyError, ReplyOrIdError};

/// Every variant names the X operation that failed and keeps its source.
#[derive(Debug, thiserror::Error)]
pub enum ScreenError {
    #[error("connect to X display {display}")]
    Connect {
        display: String,
        #[source]
        source: ConnectError,
    },
    #[error("{op}")]
    Request {
        op: &'static str,
        #[source]
        source: ReplyError,
    },
    #[error("{op}")]
    AllocateId {
        op: &'static str,
        #[source]
        source: ReplyOrIdError,
    },
    #[error("X server lacks the {0} extension")]
    MissingExtension(&'static str),
    #[error("GetImage of root window: unsupported pixel format (depth {depth}, {bits_per_pixel} bits per pixel)")]
    UnsupportedFormat { depth: u8, bits_per_pixel: u8 },
    #[error("GetImage of root window: reply holds {got} bytes, expected {expected}")]
    ShortImage { got: usize, expected: usize },
    #[error("poll the X connection")]
    Poll(#[source] nix::Error),
}

impl ScreenError {
    pub(crate) fn request(op: &'static str) -> impl FnOnce(ReplyError) -> ScreenError {
        move |source| ScreenError::Request { op, source }
    }

    pub(crate) fn send(op: &'static str) -> impl FnOnce(ConnectionError) -> ScreenError {
        move |source| ScreenError::Request {
            op,
            source: source.into(),
        }
    }
}
