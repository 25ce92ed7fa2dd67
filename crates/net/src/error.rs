//! The one error type of drums-net.

/// A failed networking operation: every variant names what was being done and
/// keeps the underlying error as its source.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("opening rtnetlink connection failed")]
    Connect(#[source] std::io::Error),

    #[error("netlink {op} failed for {link}")]
    Netlink {
        op: &'static str,
        link: String,
        #[source]
        source: rtnetlink::Error,
    },

    #[error("link {0} not found")]
    LinkNotFound(String),

    #[error("link {0} exists but is not a bridge")]
    NotABridge(String),

    #[error("invalid interface name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },

    #[error("invalid veth spec for {host_name}: {reason}")]
    InvalidSpec {
        host_name: String,
        reason: &'static str,
    },

    #[error("opening network namespace of pid {pid} failed")]
    OpenNetns {
        pid: i32,
        #[source]
        source: std::io::Error,
    },

    #[error("pid {pid} is in the host network namespace, refusing to configure it as a session")]
    HostNetns { pid: i32 },

    #[error("entering network namespace of pid {pid} failed")]
    Setns {
        pid: i32,
        #[source]
        source: nix::Error,
    },

    #[error("starting network namespace worker for pid {pid} failed")]
    Worker {
        pid: i32,
        #[source]
        source: std::io::Error,
    },

    #[error("network namespace worker for pid {pid} died without a result")]
    WorkerDied { pid: i32 },

    #[error(transparent)]
    Firewall(#[from] crate::firewall::FirewallError),
}

/// Builds the `map_err` closure for a failed rtnetlink request.
pub(crate) fn netlink(
    op: &'static str,
    link: impl Into<String>,
) -> impl FnOnce(rtnetlink::Error) -> NetError {
    let link = link.into();
    move |source| NetError::Netlink { op, link, source }
}

/// The positive errno carried by a netlink NACK, if `err` is one.
pub(crate) fn errno(err: &rtnetlink::Error) -> Option<i32> {
    match err {
        rtnetlink::Error::NetlinkError(msg) => Some(msg.raw_code().abs()),
        _ => None,
    }
}
