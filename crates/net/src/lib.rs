//! Host-side networking for drums sessions, over rtnetlink only (never `ip`).
//!
//! Every session is a process tree whose PID 1 unshared its own network
//! namespace; drums names that namespace by the host pid of such a process
//! (`/proc/<pid>/ns/net`) and never bind-mounts it. A session gets one veth
//! pair: the host end is an *isolated* port of a drums bridge that carries the
//! gateway address, the peer is created directly inside the session namespace
//! as `eth0`. Because nothing but the session's processes holds that namespace,
//! it disappears when the session dies and takes the veth pair with it.
//!
//! Every bridge drums makes carries drumsd's firewall ([`firewall`]): sessions
//! reach neither the host nor each other, send only from their own MAC and IP,
//! and leave the host only with egress `nat`.
//!
//! Host links are handled through [`Net`], a netlink connection in drums' own
//! namespace. Work inside a session namespace runs on a dedicated short-lived
//! thread that joined that namespace (see [`in_netns`]), never on a tokio worker.

mod error;
pub mod firewall;
mod netns;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::pin::pin;

use futures::TryStreamExt;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkInfo, LinkMessage,
};
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth, RouteMessageBuilder};

pub use error::NetError;
use error::{errno, netlink};
pub use firewall::{FirewallError, IpForward, Port, Proto, Service};
use netns::NetnsFile;
/// The rtnetlink version this crate is built on, for callers of [`in_netns`].
pub use rtnetlink;

/// Name of the session end of the veth pair, inside the session namespace.
pub const SESSION_IFNAME: &str = "eth0";

/// Linux IFNAMSIZ minus the terminating NUL.
const MAX_IFNAME_LEN: usize = 15;

/// A netlink connection in the host (drums') network namespace.
#[derive(Clone, Debug)]
pub struct Net {
    handle: Handle,
}

/// Everything needed to wire one session to a bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VethSpec {
    /// Host end name, at most 15 bytes, e.g. `drums1a2b3c4d5e`.
    pub host_name: String,
    /// Bridge to enslave the host end to; it must exist.
    pub bridge: String,
    /// Host pid of a process inside the target network namespace.
    pub netns_pid: i32,
    /// MAC address of `eth0` inside the session.
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    pub prefix: u8,
    /// The bridge's address.
    pub gateway: Ipv4Addr,
    /// Egress `nat`: a default route via `gateway` inside the session, and the
    /// session's address in the firewall's egress set. Without it the session
    /// has no route beyond its subnet and the firewall forwards nothing of it.
    pub egress: bool,
    /// The firewall lists this port already, with this name, MAC, address
    /// and egress: a session rebuilt under its own identity (a rollback)
    /// kept it, so it is not added again (it costs ~10 ms to remove and add).
    pub listed: bool,
}

impl Net {
    /// Opens a rtnetlink connection on the current tokio runtime (its
    /// connection task is spawned there and ends when the last clone of this
    /// `Net` is dropped).
    pub async fn new() -> Result<Net, NetError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(NetError::Connect)?;
        tokio::spawn(conn);
        Ok(Net { handle })
    }

    /// The underlying rtnetlink handle, for operations this crate does not wrap.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Creates bridge `name` if absent, ensures it has address
    /// `gateway/prefix` (already present is fine), sets it up and installs its
    /// firewall with `services` as the only ports sessions may open on the
    /// host ([`firewall::install`]; ports listed by an earlier call are
    /// forgotten). Returns its ifindex. Safe against a concurrent creator.
    /// The firewall stays until [`firewall::remove`].
    pub async fn ensure_bridge(
        &self,
        name: &str,
        gateway: Ipv4Addr,
        prefix: u8,
        services: &[Service],
    ) -> Result<u32, NetError> {
        check_ifname(name)?;
        if prefix > 32 {
            return Err(NetError::InvalidSpec {
                host_name: name.to_string(),
                reason: "prefix length above 32",
            });
        }
        let link = match self.get_link(name).await? {
            Some(link) => link,
            None => {
                // A fixed, locally administered MAC: a bridge without one
                // takes the lowest MAC of its ports, so it would change
                // whenever a session joins or leaves and every other session's
                // ARP entry for the gateway would go stale. An address that
                // was set explicitly is kept by the kernel.
                let msg = LinkBridge::new(name)
                    .address(bridge_mac(name).to_vec())
                    .build();
                match self.handle.link().add(msg).execute().await {
                    Ok(()) => tracing::debug!(bridge = name, "created bridge"),
                    // Someone else created it between our lookup and add.
                    Err(e) if errno(&e) == Some(libc::EEXIST) => {}
                    Err(e) => return Err(netlink("create bridge", name)(e)),
                }
                self.get_link(name)
                    .await?
                    .ok_or_else(|| NetError::LinkNotFound(name.to_string()))?
            }
        };
        if link_kind(&link) != Some(&InfoKind::Bridge) {
            return Err(NetError::NotABridge(name.to_string()));
        }
        let index = link.header.index;

        if !self.has_address(index, name, gateway, prefix).await? {
            match self
                .handle
                .address()
                .add(index, IpAddr::V4(gateway), prefix)
                .execute()
                .await
            {
                Ok(()) => {}
                Err(e) if errno(&e) == Some(libc::EEXIST) => {}
                Err(e) => return Err(netlink("add address", name)(e)),
            }
        }

        self.handle
            .link()
            .change(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(netlink("set up", name))?;
        // After the bridge exists: its per-interface IPv6 sysctls appear with it.
        firewall::install(name, gateway, services)?;
        Ok(index)
    }

    /// Deletes a link by name. `Ok(false)` if it did not exist.
    pub async fn delete_link(&self, name: &str) -> Result<bool, NetError> {
        check_ifname(name)?;
        let Some(link) = self.get_link(name).await? else {
            return Ok(false);
        };
        match self.handle.link().del(link.header.index).execute().await {
            Ok(()) => Ok(true),
            // Vanished on its own in between (e.g. its session namespace died).
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(netlink("delete link", name)(e)),
        }
    }

    pub async fn link_exists(&self, name: &str) -> Result<bool, NetError> {
        check_ifname(name)?;
        Ok(self.get_link(name).await?.is_some())
    }

    /// Names of host links starting with `prefix` (used by leak checks and the
    /// daemon's sweep).
    pub async fn links_with_prefix(&self, prefix: &str) -> Result<Vec<String>, NetError> {
        let mut links = pin!(self.handle.link().get().execute());
        let mut names = Vec::new();
        while let Some(link) = links
            .try_next()
            .await
            .map_err(netlink("dump links", format!("{prefix}*")))?
        {
            if let Some(name) = link_name(&link) {
                if name.starts_with(prefix) {
                    names.push(name.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    /// Creates the session's veth pair and configures both ends.
    ///
    /// Host end: enslaved to `spec.bridge` as an isolated port, then set up.
    /// Peer: created directly in the namespace of `spec.netns_pid` as `eth0`
    /// with `spec.mac`, then given `spec.ip/prefix` and set up there, along
    /// with `lo` and (if asked) a default route via `spec.gateway`.
    ///
    /// On failure, or if this future is dropped half-way, the pair is deleted
    /// again, so nothing leaks.
    pub async fn create_session_veth(&self, spec: &VethSpec) -> Result<(), NetError> {
        check_spec(spec)?;
        // Opened once and used for both creating the peer and joining the
        // namespace, so both refer to the same namespace even if the pid dies
        // and is reused meanwhile.
        let ns = NetnsFile::open_session(spec.netns_pid)?;
        let bridge = self
            .get_link(&spec.bridge)
            .await?
            .ok_or_else(|| NetError::LinkNotFound(spec.bridge.clone()))?;
        let bridge_index = bridge.header.index;

        // Creating the peer straight in the session namespace (rather than
        // creating both ends here and moving one) means `eth0` never exists in
        // the host namespace, where that name is usually taken.
        let peer = LinkUnspec::new_with_name(SESSION_IFNAME)
            .address(spec.mac.to_vec())
            .setns_by_fd(ns.file.as_raw_fd())
            .build();
        let veth = LinkVeth::new(&spec.host_name, SESSION_IFNAME)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        self.handle
            .link()
            .add(veth)
            .execute()
            .await
            .map_err(netlink("create veth", spec.host_name.as_str()))?;
        tracing::debug!(
            link = spec.host_name,
            pid = spec.netns_pid,
            "created veth pair"
        );

        // From here on the pair exists: delete it on every way out but success.
        let mut guard = VethGuard {
            handle: self.handle.clone(),
            bridge: spec.bridge.clone(),
            name: Some(spec.host_name.clone()),
        };
        match self.configure_veth(spec, bridge_index, ns).await {
            Ok(()) => {
                guard.name = None;
                Ok(())
            }
            Err(err) => {
                guard.delete_now().await;
                Err(err)
            }
        }
    }

    async fn configure_veth(
        &self,
        spec: &VethSpec,
        bridge_index: u32,
        ns: NetnsFile,
    ) -> Result<(), NetError> {
        let host = spec.host_name.as_str();
        let index = self
            .get_link(host)
            .await?
            .ok_or_else(|| NetError::LinkNotFound(host.to_string()))?
            .header
            .index;

        // Listed before the port joins the bridge: the bridge table checks
        // only listed ports (see the firewall module), so no frame of this
        // port is ever forwarded unchecked.
        if !spec.listed {
            firewall::add_port(
                &spec.bridge,
                &Port {
                    ifname: spec.host_name.clone(),
                    mac: spec.mac,
                    ip: spec.ip,
                    egress: spec.egress,
                },
            )?;
        }
        self.attach_index(index, host, bridge_index).await?;

        let (ip, prefix, gateway, default_route) =
            (spec.ip, spec.prefix, spec.gateway, spec.egress);
        netns::run_in(ns, move |handle| async move {
            configure_session_side(&handle, ip, prefix, gateway, default_route).await
        })
        .await
    }

    async fn attach_index(
        &self,
        index: u32,
        host: &str,
        bridge_index: u32,
    ) -> Result<(), NetError> {
        self.handle
            .link()
            .change(
                LinkUnspec::new_with_index(index)
                    .controller(bridge_index)
                    .build(),
            )
            .execute()
            .await
            .map_err(netlink("enslave to bridge", host))?;
        // Isolated ports only forward to non-isolated ones, i.e. to the bridge
        // itself (the host): sessions on one bridge cannot see each other,
        // not even by ARP. Done before the port goes up, so no frame ever
        // crosses between sessions.
        self.handle
            .link()
            .set_port(LinkBridgePort::new(index).isolated(true).build())
            .execute()
            .await
            .map_err(netlink("isolate bridge port", host))?;
        self.handle
            .link()
            .change(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(netlink("set up", host))?;
        Ok(())
    }

    async fn get_link(&self, name: &str) -> Result<Option<LinkMessage>, NetError> {
        get_link(&self.handle, name).await
    }

    async fn has_address(
        &self,
        index: u32,
        name: &str,
        ip: Ipv4Addr,
        prefix: u8,
    ) -> Result<bool, NetError> {
        let mut addrs = pin!(self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute());
        while let Some(addr) = addrs
            .try_next()
            .await
            .map_err(netlink("list addresses", name))?
        {
            let matches = addr.header.prefix_len == prefix
                && addr
                    .attributes
                    .iter()
                    .any(|a| matches!(a, AddressAttribute::Local(IpAddr::V4(x)) if *x == ip));
            if matches {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// Brings `lo` up inside the network namespace of `pid` (for sessions with
/// network "none", which get no veth).
pub async fn loopback_up(pid: i32) -> Result<(), NetError> {
    let ns = NetnsFile::open_session(pid)?;
    netns::run_in(ns, |handle| async move { set_up(&handle, "lo").await }).await
}

/// Runs `f` with an rtnetlink handle inside the network namespace of `pid`, on
/// a dedicated thread that joined that namespace (a netlink socket talks to the
/// namespace of the thread that opened it, and a tokio worker must never change
/// namespace). Refuses drums' own namespace. `f`'s future need not be `Send`:
/// it runs on that thread's own current-thread runtime.
pub async fn in_netns<F, Fut, T>(pid: i32, f: F) -> Result<T, NetError>
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, NetError>> + 'static,
    T: Send + 'static,
{
    let ns = NetnsFile::open_session(pid)?;
    netns::run_in(ns, f).await
}

/// Looks a link up by name in the namespace of `handle`; `None` if absent.
pub async fn get_link(handle: &Handle, name: &str) -> Result<Option<LinkMessage>, NetError> {
    let mut links = pin!(handle.link().get().match_name(name).execute());
    match links.try_next().await {
        Ok(link) => Ok(link),
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
        Err(e) => Err(netlink("get link", name)(e)),
    }
}

/// The `IFLA_IFNAME` of a link message.
pub fn link_name(link: &LinkMessage) -> Option<&str> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.as_str()),
        _ => None,
    })
}

fn link_kind(link: &LinkMessage) -> Option<&InfoKind> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().find_map(|i| match i {
            LinkInfo::Kind(k) => Some(k),
            _ => None,
        }),
        _ => None,
    })
}

/// The in-namespace half of [`Net::create_session_veth`]; runs on the worker.
async fn configure_session_side(
    handle: &Handle,
    ip: Ipv4Addr,
    prefix: u8,
    gateway: Ipv4Addr,
    default_route: bool,
) -> Result<(), NetError> {
    set_up(handle, "lo").await?;
    let eth0 = get_link(handle, SESSION_IFNAME)
        .await?
        .ok_or_else(|| NetError::LinkNotFound(SESSION_IFNAME.to_string()))?
        .header
        .index;
    handle
        .address()
        .add(eth0, IpAddr::V4(ip), prefix)
        .execute()
        .await
        .map_err(netlink("add address", SESSION_IFNAME))?;
    handle
        .link()
        .change(LinkUnspec::new_with_index(eth0).up().build())
        .execute()
        .await
        .map_err(netlink("set up", SESSION_IFNAME))?;
    if default_route {
        add_default_route(handle, eth0, gateway).await?;
    }
    Ok(())
}

/// A default route via `gateway` out of the link `ifindex`, in the
/// namespace `handle` speaks to.
pub async fn add_default_route(
    handle: &Handle,
    ifindex: u32,
    gateway: Ipv4Addr,
) -> Result<(), NetError> {
    let route = RouteMessageBuilder::<Ipv4Addr>::new()
        .gateway(gateway)
        .output_interface(ifindex)
        .build();
    handle
        .route()
        .add(route)
        .execute()
        .await
        .map_err(netlink("add default route", SESSION_IFNAME))
}

async fn set_up(handle: &Handle, name: &str) -> Result<(), NetError> {
    let index = get_link(handle, name)
        .await?
        .ok_or_else(|| NetError::LinkNotFound(name.to_string()))?
        .header
        .index;
    handle
        .link()
        .change(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(netlink("set up", name))
}

/// Deletes the host end of a half-configured veth pair (which takes the peer
/// with it) and its firewall elements, unless disarmed by clearing `name`.
struct VethGuard {
    handle: Handle,
    bridge: String,
    name: Option<String>,
}

impl VethGuard {
    async fn delete_now(&mut self) {
        if let Some(name) = self.name.take() {
            delete_by_name(self.handle.clone(), self.bridge.clone(), name).await;
        }
    }
}

impl Drop for VethGuard {
    /// Only reached with a name when the `create_session_veth` future was
    /// dropped mid-way; error paths delete synchronously before returning.
    fn drop(&mut self) {
        let Some(name) = self.name.take() else { return };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(delete_by_name(
                    self.handle.clone(),
                    self.bridge.clone(),
                    name,
                ));
            }
            Err(_) => tracing::warn!(link = name, "cannot delete abandoned veth: no runtime"),
        }
    }
}

async fn delete_by_name(handle: Handle, bridge: String, name: String) {
    // By name rather than index: the host end's index may not be known yet.
    let msg = LinkUnspec::new_with_name(&name).build();
    match handle.link().del_with_message(msg).execute().await {
        Ok(()) => tracing::debug!(link = name, "deleted veth after failed setup"),
        Err(e) if errno(&e) == Some(libc::ENODEV) => {}
        Err(e) => {
            tracing::warn!(link = name, error = %e, "deleting veth after failed setup failed")
        }
    }
    // The link is gone, so a stale element could only ever match a future
    // link of the same name; remove it all the same.
    if let Err(e) = firewall::remove_port(&bridge, &name) {
        tracing::warn!(link = name, error = %e, "removing firewall elements after failed setup failed");
    }
}

fn check_ifname(name: &str) -> Result<(), NetError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() > MAX_IFNAME_LEN {
        "longer than 15 bytes"
    } else if name == "." || name == ".." {
        "reserved"
    } else if name
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        "contains '/', ':' or whitespace"
    } else {
        return Ok(());
    };
    Err(NetError::InvalidName {
        name: name.to_string(),
        reason,
    })
}

fn check_spec(spec: &VethSpec) -> Result<(), NetError> {
    check_ifname(&spec.host_name)?;
    check_ifname(&spec.bridge)?;
    let invalid = |reason| NetError::InvalidSpec {
        host_name: spec.host_name.clone(),
        reason,
    };
    if spec.prefix > 32 {
        return Err(invalid("prefix length above 32"));
    }
    if spec.mac[0] & 1 != 0 || spec.mac == [0; 6] {
        return Err(invalid("mac is not a unicast address"));
    }
    if spec.egress && !same_subnet(spec.ip, spec.gateway, spec.prefix) {
        return Err(invalid("gateway is outside the session subnet"));
    }
    Ok(())
}

fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
    u32::from(a) & mask == u32::from(b) & mask
}

/// A stable, locally administered unicast MAC derived from the bridge name
/// (FNV-1a), so the gateway MAC survives daemon restarts and bridge re-creation.
fn bridge_mac(name: &str) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let b = h.to_be_bytes();
    // 0x02: locally administered, unicast.
    [0x02, b[0], b[1], b[2], b[3], b[4]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subnet_math() {
        let ip = Ipv4Addr::new(10, 254, 7, 2);
        assert!(same_subnet(ip, Ipv4Addr::new(10, 254, 7, 1), 24));
        assert!(!same_subnet(ip, Ipv4Addr::new(10, 254, 8, 1), 24));
        assert!(same_subnet(ip, Ipv4Addr::new(1, 2, 3, 4), 0));
        assert!(!same_subnet(ip, Ipv4Addr::new(10, 254, 7, 1), 32));
    }

    #[test]
    fn bridge_mac_is_local_unicast_and_stable() {
        let mac = bridge_mac("drums0");
        assert_eq!(mac[0], 0x02);
        assert_eq!(mac, bridge_mac("drums0"));
        assert_ne!(mac, bridge_mac("drums1"));
    }

    #[test]
    fn ifname_rules() {
        assert!(check_ifname("drums1a2b3c4d5e").is_ok());
        assert!(check_ifname("drums1a2b3c4d5e6").is_err());
        assert!(check_ifname("").is_err());
        assert!(check_ifname("a/b").is_err());
        assert!(check_ifname("..").is_err());
    }
}
