//! The firewall drumsd owns for one bridge: nftables rules, applied in-process
//! through libnftables' JSON interface (never a forked `nft`).
//!
//! Each bridge gets two tables named `drums-<bridge>`, so several daemons (the
//! tests run many) never touch each other's rules:
//!
//! * `bridge drums-<bridge>` sees every frame a session sends, before the
//!   bridge decides where it goes. A port listed in `port_names` may only send
//!   IPv4 and ARP whose (port, source MAC, source IP) is its own element of
//!   `ports`; everything else from it (spoofed IPv4 or ARP, IPv6 with its
//!   router advertisements and redirects, VLAN tags, other ethertypes) is
//!   dropped. The port is listed before it is enslaved (see
//!   [`crate::Net::create_session_veth`]): this kernel lacks
//!   `meta ibrname` (CONFIG_NFT_BRIDGE_META), so "a port of this bridge" can
//!   only be said by name.
//! * `inet drums-<bridge>` filters at the IP layer: input from the bridge is
//!   dropped except replies and the `services` allow-list on the bridge's own
//!   address (the sessions' gateway; the same port on any other host address
//!   is dropped like everything else); forwarding from the
//!   bridge back to the bridge is dropped (no session reaches another through
//!   the host's routing, whatever `ip_forward` says); forwarding from the bridge
//!   elsewhere is allowed only from the `egress` sources and never to the
//!   `private` ranges, except DNS (port 53) to the `resolvers` drumsd names
//!   for egress sessions ([`set_resolvers`]), and is masqueraded; nothing from
//!   elsewhere is forwarded into the bridge except replies.
//!
//! Both tables are replaced atomically by [`install`] (one nftables
//! transaction) and deleted together by [`remove`].

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::str::FromStr;
use std::sync::Mutex;

use serde_json::{json, Value};

/// The ranges a session with egress `nat` still never reaches: RFC 1918, CGNAT
/// (100.64/10), link-local (169.254/16, which holds cloud metadata services),
/// loopback, "this network", multicast and the reserved 240/4 (broadcast
/// included). The host's own addresses are covered by the input chain, which
/// drops everything from the bridge whatever its destination.
pub const PRIVATE_RANGES: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(127, 0, 0, 0), 8),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

/// Errors of the firewall module.
#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("creating an nftables context failed")]
    Context,

    #[error("nftables {op} failed for table {table}: {message}")]
    Nft {
        op: &'static str,
        table: String,
        message: String,
    },

    #[error("reading the nftables answer to {op} failed for table {table}")]
    Answer {
        op: &'static str,
        table: String,
        #[source]
        source: serde_json::Error,
    },

    #[error("writing sysctl {path} failed")]
    Sysctl {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("invalid service {0:?}: expected tcp:PORT or udp:PORT with a port from 1 to 65535")]
    InvalidService(String),
}

/// A transport protocol of an allow-listed service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// A port drums serves to sessions on the bridge address (for example the
/// coordinator's proxy): the only new connections the host accepts from a
/// session. Written `tcp:PORT` or `udp:PORT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    pub proto: Proto,
    pub port: u16,
}

impl FromStr for Service {
    type Err = FirewallError;

    fn from_str(s: &str) -> Result<Service, FirewallError> {
        let bad = || FirewallError::InvalidService(s.to_string());
        let (proto, port) = s.split_once(':').ok_or_else(bad)?;
        let proto = match proto {
            "tcp" => Proto::Tcp,
            "udp" => Proto::Udp,
            _ => return Err(bad()),
        };
        match port.parse::<u16>() {
            Ok(port) if port != 0 => Ok(Service { proto, port }),
            _ => Err(bad()),
        }
    }
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.proto.as_str(), self.port)
    }
}

/// One bridge port as the anti-spoofing and egress sets know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Port {
    /// Host end of the session's veth.
    pub ifname: String,
    pub mac: [u8; 6],
    pub ip: Ipv4Addr,
    /// The session may leave the host through NAT.
    pub egress: bool,
}

/// The name of both tables of `bridge`.
pub fn table_name(bridge: &str) -> String {
    format!("drums-{bridge}")
}

/// Installs (or atomically replaces) the firewall of `bridge`, which must
/// exist, with `services` as the allow-list on the bridge address `gateway`
/// (and on no other address of the host), and makes
/// the host ignore IPv6 router advertisements and redirects arriving on it.
/// Ports listed by an earlier install are forgotten: a daemon calls this once
/// at start, after its sweep.
pub fn install(bridge: &str, gateway: Ipv4Addr, services: &[Service]) -> Result<(), FirewallError> {
    ignore_ipv6_ra_and_redirects(bridge)?;
    let table = table_name(bridge);
    let mut cmds = Vec::new();
    for family in ["bridge", "inet"] {
        // "add" then "delete" makes the delete succeed whether or not a
        // previous table exists, all in the same transaction as the new one.
        let t = json!({"table": {"family": family, "name": table}});
        cmds.push(json!({"add": t}));
        cmds.push(json!({"delete": t}));
        cmds.push(json!({"add": t}));
    }
    cmds.extend(bridge_table(&table));
    cmds.extend(inet_table(&table, bridge, gateway, services));
    Nft::new()?.run("install", &table, &json!({"nftables": cmds}))?;
    Ok(())
}

/// Deletes both tables of `bridge`. `Ok(false)` if there were none.
pub fn remove(bridge: &str) -> Result<bool, FirewallError> {
    let table = table_name(bridge);
    let nft = Nft::new()?;
    let mut existed = false;
    for family in ["bridge", "inet"] {
        if has_table(&nft, family, &table)? {
            let t = json!({"table": {"family": family, "name": table}});
            nft.run(
                "delete table",
                &table,
                &json!({"nftables": [{"delete": t}]}),
            )?;
            existed = true;
        }
    }
    Ok(existed)
}

/// Whether any table of `bridge` exists.
pub fn exists(bridge: &str) -> Result<bool, FirewallError> {
    let table = table_name(bridge);
    let nft = Nft::new()?;
    Ok(has_table(&nft, "bridge", &table)? || has_table(&nft, "inet", &table)?)
}

/// The names of every nftables table on the host (for leak checks).
pub fn tables() -> Result<Vec<(String, String)>, FirewallError> {
    let out = Nft::new()?.run(
        "list tables",
        "*",
        &json!({"nftables": [{"list": {"tables": null}}]}),
    )?;
    let answer: Value = parse(&out, "list tables", "*")?;
    Ok(objects(&answer, "table")
        .filter_map(|t| Some((t["family"].as_str()?.into(), t["name"].as_str()?.into())))
        .collect())
}

/// The ports `bridge`'s firewall knows, as (ifname, ip); empty without a
/// firewall.
pub fn ports(bridge: &str) -> Result<Vec<(String, Ipv4Addr)>, FirewallError> {
    let table = table_name(bridge);
    let nft = Nft::new()?;
    if !has_table(&nft, "bridge", &table)? {
        return Ok(Vec::new());
    }
    let cmd = json!({"nftables": [{"list": {"set":
        {"family": "bridge", "table": table, "name": "ports"}}}]});
    let out = nft.run("list ports", &table, &cmd)?;
    let answer = parse(&out, "list ports", &table)?;
    Ok(objects(&answer, "set")
        .flat_map(|s| s["elem"].as_array().cloned().unwrap_or_default())
        .filter_map(|e| {
            let parts = &e["concat"];
            Some((
                parts[0].as_str()?.to_string(),
                parts[2].as_str()?.parse().ok()?,
            ))
        })
        .collect())
}

/// Lets `port` send on `bridge` from its own MAC and IP (and, with egress,
/// leave the host). Must run before the port is enslaved: until then frames
/// from it would not be checked.
pub fn add_port(bridge: &str, port: &Port) -> Result<(), FirewallError> {
    let table = table_name(bridge);
    let mut cmds = vec![
        element("add", "bridge", &table, "port_names", json!(port.ifname)),
        element("add", "bridge", &table, "ports", port_element(port)),
    ];
    if port.egress {
        cmds.push(element(
            "add",
            "inet",
            &table,
            "egress",
            json!(port.ip.to_string()),
        ));
    }
    Nft::new()?.run("add port", &table, &json!({"nftables": cmds}))?;
    Ok(())
}

/// The name servers egress sessions may query on port 53 (UDP and TCP), even
/// where they lie in a `private` range, as a host's resolver often does: the
/// `resolvers` set becomes exactly `resolvers`. A session without egress
/// reaches none of them (its traffic is never forwarded at all).
pub fn set_resolvers(bridge: &str, resolvers: &[Ipv4Addr]) -> Result<(), FirewallError> {
    let table = table_name(bridge);
    let mut cmds = vec![json!({"flush": {"set": {"family": "inet", "table": table,
        "name": "resolvers"}}})];
    if !resolvers.is_empty() {
        cmds.push(json!({"add": {"element": {"family": "inet", "table": table,
            "name": "resolvers",
            "elem": resolvers.iter().map(|r| r.to_string()).collect::<Vec<_>>()}}}));
    }
    Nft::new()?.run("set resolvers", &table, &json!({"nftables": cmds}))?;
    Ok(())
}

/// Forgets every element naming `ifname` on `bridge` (its spoofing and egress
/// entries). Absent elements, or an absent firewall, are fine: teardown calls
/// this for every link it deletes, after a crash at any point.
pub fn remove_port(bridge: &str, ifname: &str) -> Result<(), FirewallError> {
    let table = table_name(bridge);
    let nft = Nft::new()?;
    if !has_table(&nft, "bridge", &table)? {
        return Ok(());
    }
    let set = |family, name| json!({"nftables": [{"list": {"set": {"family": family, "table": table, "name": name}}}]});
    let out = nft.run("list ports", &table, &set("bridge", "ports"))?;
    let answer = parse(&out, "list ports", &table)?;
    let mut cmds = Vec::new();
    let mut ips = Vec::new();
    for s in objects(&answer, "set") {
        for e in s["elem"].as_array().into_iter().flatten() {
            let parts = &e["concat"];
            if parts[0].as_str() == Some(ifname) {
                cmds.push(element("delete", "bridge", &table, "ports", e.clone()));
                ips.extend(parts[2].as_str().map(str::to_string));
            }
        }
    }
    let out = nft.run("list port names", &table, &set("bridge", "port_names"))?;
    if objects(&parse(&out, "list port names", &table)?, "set").any(|s| {
        s["elem"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e.as_str() == Some(ifname))
    }) {
        cmds.push(element(
            "delete",
            "bridge",
            &table,
            "port_names",
            json!(ifname),
        ));
    }
    if has_table(&nft, "inet", &table)? {
        let out = nft.run("list egress", &table, &set("inet", "egress"))?;
        let answer = parse(&out, "list egress", &table)?;
        for s in objects(&answer, "set") {
            for e in s["elem"].as_array().into_iter().flatten() {
                if e.as_str().is_some_and(|ip| ips.iter().any(|x| x == ip)) {
                    cmds.push(element("delete", "inet", &table, "egress", e.clone()));
                }
            }
        }
    }
    if !cmds.is_empty() {
        nft.run("remove port", &table, &json!({"nftables": cmds}))?;
    }
    Ok(())
}

/// `net.ipv4.ip_forward`, which NAT egress needs and which is host-wide:
/// turned on with the first session that has egress, and put back to the value
/// found by [`IpForward::restore`] (the daemon calls it when it stops).
#[derive(Debug, Default)]
pub struct IpForward {
    /// The value found before this daemon first turned forwarding on.
    saved: Mutex<Option<String>>,
}

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

impl IpForward {
    pub fn new() -> IpForward {
        IpForward::default()
    }

    /// Turns forwarding on, remembering the previous value the first time.
    pub fn enable(&self) -> Result<(), FirewallError> {
        let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        let path = PathBuf::from(IP_FORWARD);
        let err = |source| FirewallError::Sysctl {
            path: path.clone(),
            source,
        };
        let current = std::fs::read_to_string(&path).map_err(err)?;
        if saved.is_none() {
            *saved = Some(current.trim().to_string());
        }
        if current.trim() != "1" {
            std::fs::write(&path, "1").map_err(err)?;
            tracing::info!("net.ipv4.ip_forward set to 1 for egress (restored when drumsd stops)");
        }
        Ok(())
    }

    /// Puts back the value [`IpForward::enable`] found; nothing if it never ran.
    pub fn restore(&self) -> Result<(), FirewallError> {
        let mut saved = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = saved.take() {
            std::fs::write(IP_FORWARD, &old).map_err(|source| FirewallError::Sysctl {
                path: IP_FORWARD.into(),
                source,
            })?;
        }
        Ok(())
    }
}

/// A hostile session could otherwise send router advertisements that give the
/// host a default route or addresses through it, or redirects that reroute the
/// host's traffic. The bridge table drops those frames already; these
/// per-interface settings make the host ignore them even if they got through.
/// A missing directory means IPv6 is off on this host or interface: then there
/// is nothing to ignore.
fn ignore_ipv6_ra_and_redirects(bridge: &str) -> Result<(), FirewallError> {
    for knob in ["accept_ra", "accept_redirects"] {
        let path = PathBuf::from(format!("/proc/sys/net/ipv6/conf/{bridge}/{knob}"));
        match std::fs::write(&path, "0") {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(path = %path.display(), "no IPv6 on the bridge");
            }
            Err(source) => return Err(FirewallError::Sysctl { path, source }),
        }
    }
    Ok(())
}

fn bridge_table(table: &str) -> Vec<Value> {
    let set = |name: &str, ty: Value| json!({"add": {"set": {"family": "bridge", "table": table, "name": name, "type": ty}}});
    let rule = |chain: &str, expr: Value| json!({"add": {"rule": {"family": "bridge", "table": table, "chain": chain, "expr": expr}}});
    let iifname = json!({"meta": {"key": "iifname"}});
    let in_ports = |fields: [Value; 2]| {
        json!({"match": {"op": "==", "right": "@ports",
            "left": {"concat": [iifname, fields[0], fields[1]]}}})
    };
    let payload =
        |protocol: &str, field: &str| json!({"payload": {"protocol": protocol, "field": field}});
    vec![
        set("port_names", json!("ifname")),
        set("ports", json!(["ifname", "ether_addr", "ipv4_addr"])),
        // Before the bridge's own filter priority, so nothing else sees a
        // spoofed frame first.
        json!({"add": {"chain": {"family": "bridge", "table": table, "name": "prerouting",
            "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}}}),
        json!({"add": {"chain": {"family": "bridge", "table": table, "name": "from_session"}}}),
        rule(
            "prerouting",
            json!([
                {"match": {"op": "==", "left": iifname, "right": "@port_names"}},
                {"jump": {"target": "from_session"}}
            ]),
        ),
        rule(
            "from_session",
            json!([
                in_ports([payload("ether", "saddr"), payload("ip", "saddr")]),
                {"accept": null}
            ]),
        ),
        // ARP: the frame's source MAC and the sender fields both belong to
        // the port, so no session can claim another's address in the host's
        // neighbour table.
        rule(
            "from_session",
            json!([
                in_ports([payload("ether", "saddr"), payload("arp", "saddr ip")]),
                in_ports([payload("arp", "saddr ether"), payload("arp", "saddr ip")]),
                {"accept": null}
            ]),
        ),
        // Dropped by the last rule anyway; named here so that allowing IPv6
        // one day cannot silently let these through.
        rule(
            "from_session",
            json!([
                {"match": {"op": "==", "left": payload("icmpv6", "type"),
                    "right": {"set": ["nd-router-advert", "nd-redirect"]}}},
                {"drop": null}
            ]),
        ),
        rule("from_session", json!([{"drop": null}])),
    ]
}

fn inet_table(table: &str, bridge: &str, gateway: Ipv4Addr, services: &[Service]) -> Vec<Value> {
    let chain = |name: &str, ty: &str, hook: &str, prio: i32| {
        json!({"add": {"chain": {"family": "inet", "table": table, "name": name,
            "type": ty, "hook": hook, "prio": prio, "policy": "accept"}}})
    };
    let rule = |chain: &str, expr: Value| json!({"add": {"rule": {"family": "inet", "table": table, "chain": chain, "expr": expr}}});
    let meta_is = |key: &str, op: &str, value: &str| json!({"match": {"op": op, "left": {"meta": {"key": key}}, "right": value}});
    let from_bridge = meta_is("iifname", "==", bridge);
    let to_bridge = meta_is("oifname", "==", bridge);
    let replies = json!({"match": {"op": "in", "left": {"ct": {"key": "state"}},
        "right": ["established", "related"]}});
    let ip = |field: &str, op: &str, set: &str| {
        json!({"match": {"op": op, "left": {"payload": {"protocol": "ip", "field": field}},
            "right": set}})
    };

    let mut services_set = json!({"family": "inet", "table": table, "name": "services",
        "type": ["inet_proto", "inet_service"]});
    if !services.is_empty() {
        services_set["elem"] = services
            .iter()
            .map(|s| json!({"concat": [s.proto.as_str(), s.port]}))
            .collect();
    }
    let private: Vec<Value> = PRIVATE_RANGES
        .iter()
        .map(|(addr, len)| json!({"prefix": {"addr": addr.to_string(), "len": len}}))
        .collect();
    vec![
        json!({"add": {"set": services_set}}),
        json!({"add": {"set": {"family": "inet", "table": table, "name": "egress",
            "type": "ipv4_addr"}}}),
        json!({"add": {"set": {"family": "inet", "table": table, "name": "private",
            "type": "ipv4_addr", "flags": ["interval"], "elem": private}}}),
        json!({"add": {"set": {"family": "inet", "table": table, "name": "resolvers",
            "type": "ipv4_addr"}}}),
        chain("input", "filter", "input", 0),
        chain("forward", "filter", "forward", 0),
        chain("postrouting", "nat", "postrouting", 100),
        // Input: any host address, through the bridge.
        rule("input", json!([from_bridge, replies, {"accept": null}])),
        // The services only on the gateway: drumsd binds its own to the
        // bridge address, but another listener on the same port of another
        // host address (`--llm-proxy-local 0.0.0.0:7080`, an operator's
        // service) is not meant for sessions, and may trust what a session
        // says (the local proxy trusts `x-drums-session`).
        rule(
            "input",
            json!([from_bridge, ip("daddr", "==", &gateway.to_string()),
                {"match": {"op": "==", "right": "@services",
                "left": {"concat": [{"meta": {"key": "l4proto"}},
                    {"payload": {"protocol": "th", "field": "dport"}}]}}},
                {"accept": null}]),
        ),
        rule("input", json!([from_bridge, {"drop": null}])),
        // Forward: never session to session, even routed by the host.
        rule("forward", json!([from_bridge, to_bridge, {"drop": null}])),
        // DNS for egress sessions, before the private ranges are refused: a
        // host's resolver is usually in one.
        rule(
            "forward",
            json!([from_bridge, ip("saddr", "==", "@egress"), ip("daddr", "==", "@resolvers"),
                {"match": {"op": "==", "left": {"meta": {"key": "l4proto"}},
                    "right": {"set": ["udp", "tcp"]}}},
                {"match": {"op": "==", "left": {"payload": {"protocol": "th", "field": "dport"}},
                    "right": 53}},
                {"accept": null}]),
        ),
        rule(
            "forward",
            json!([from_bridge, ip("saddr", "==", "@egress"), ip("daddr", "!=", "@private"),
                {"accept": null}]),
        ),
        rule("forward", json!([from_bridge, {"drop": null}])),
        rule("forward", json!([to_bridge, replies, {"accept": null}])),
        rule("forward", json!([to_bridge, {"drop": null}])),
        rule(
            "postrouting",
            json!([ip("saddr", "==", "@egress"), meta_is("oifname", "!=", bridge),
                {"masquerade": null}]),
        ),
    ]
}

fn element(verb: &str, family: &str, table: &str, set: &str, elem: Value) -> Value {
    json!({verb: {"element": {"family": family, "table": table, "name": set, "elem": [elem]}}})
}

fn port_element(port: &Port) -> Value {
    let m = port.mac;
    let mac = format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    );
    json!({"concat": [port.ifname, mac, port.ip.to_string()]})
}

fn has_table(nft: &Nft, family: &str, table: &str) -> Result<bool, FirewallError> {
    let cmd = json!({"nftables": [{"list": {"tables": {"family": family}}}]});
    let out = nft.run("list tables", table, &cmd)?;
    Ok(objects(&parse(&out, "list tables", table)?, "table")
        .any(|t| t["name"].as_str() == Some(table) && t["family"].as_str() == Some(family)))
}

fn parse(out: &str, op: &'static str, table: &str) -> Result<Value, FirewallError> {
    if out.trim().is_empty() {
        return Ok(json!({"nftables": []}));
    }
    serde_json::from_str(out).map_err(|source| FirewallError::Answer {
        op,
        table: table.to_string(),
        source,
    })
}

/// The objects of kind `kind` in a JSON answer (`{"nftables": [{kind: {...}}]}`).
fn objects<'a>(answer: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    answer["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(move |o| o.get(kind))
}

// libnftables, the library behind `nft`: the few calls drums needs.
const NFT_CTX_DEFAULT: c_uint = 0;
/// Also makes nft_run_cmd_from_buffer parse its input as JSON.
const NFT_CTX_OUTPUT_JSON: c_uint = 1 << 4;

#[link(name = "nftables")]
extern "C" {
    fn nft_ctx_new(flags: u32) -> *mut c_void;
    fn nft_ctx_free(ctx: *mut c_void);
    fn nft_ctx_output_set_flags(ctx: *mut c_void, flags: c_uint);
    fn nft_ctx_buffer_output(ctx: *mut c_void) -> c_int;
    fn nft_ctx_buffer_error(ctx: *mut c_void) -> c_int;
    fn nft_ctx_get_output_buffer(ctx: *mut c_void) -> *const c_char;
    fn nft_ctx_get_error_buffer(ctx: *mut c_void) -> *const c_char;
    fn nft_run_cmd_from_buffer(ctx: *mut c_void, buf: *const c_char) -> c_int;
}

/// Held while a libnftables context exists: a context is not thread-safe, and
/// neither is the library's one-time initialisation in nft_ctx_new, so this
/// process uses one context at a time (never two at once in one thread:
/// every function below makes exactly one).
static LIBNFTABLES: Mutex<()> = Mutex::new(());

/// One libnftables context. Each operation makes its own, which costs well
/// under a millisecond.
struct Nft {
    ctx: NonNull<c_void>,
    _only_one: std::sync::MutexGuard<'static, ()>,
}

impl Nft {
    fn new() -> Result<Nft, FirewallError> {
        // Poison is harmless here: a panicking holder's context was freed
        // by its Drop on the way out.
        let guard = LIBNFTABLES.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: nft_ctx_new has no preconditions; it returns NULL on failure.
        let ctx =
            NonNull::new(unsafe { nft_ctx_new(NFT_CTX_DEFAULT) }).ok_or(FirewallError::Context)?;
        let nft = Nft {
            ctx,
            _only_one: guard,
        };
        // SAFETY: ctx is a live context owned by `nft`; buffering makes output
        // and errors readable from memory instead of going to stdout/stderr.
        let failed = unsafe {
            nft_ctx_output_set_flags(ctx.as_ptr(), NFT_CTX_OUTPUT_JSON);
            nft_ctx_buffer_output(ctx.as_ptr()) != 0 || nft_ctx_buffer_error(ctx.as_ptr()) != 0
        };
        if failed {
            return Err(FirewallError::Context);
        }
        Ok(nft)
    }

    /// Runs one JSON batch (a single kernel transaction) and returns what
    /// nftables printed.
    fn run(&self, op: &'static str, table: &str, cmd: &Value) -> Result<String, FirewallError> {
        let nft_err = |message: String| FirewallError::Nft {
            op,
            table: table.to_string(),
            message,
        };
        // Serialised JSON escapes NUL, so this cannot fail in practice.
        let buf = CString::new(cmd.to_string()).map_err(|e| nft_err(e.to_string()))?;
        let ctx = self.ctx.as_ptr();
        // SAFETY: ctx is live; buf is a NUL-terminated string that outlives
        // the call. The buffers returned afterwards belong to ctx and are
        // valid until the next call on it, so they are copied out at once.
        unsafe {
            let rc = nft_run_cmd_from_buffer(ctx, buf.as_ptr());
            let text = |p: *const c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().trim().to_string()
                }
            };
            if rc != 0 {
                return Err(nft_err(text(nft_ctx_get_error_buffer(ctx))));
            }
            Ok(text(nft_ctx_get_output_buffer(ctx)))
        }
    }
}

impl Drop for Nft {
    fn drop(&mut self) {
        // SAFETY: the context was made by nft_ctx_new and is freed only here.
        unsafe { nft_ctx_free(self.ctx.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_parse_and_refuse() {
        assert_eq!(
            "tcp:8080".parse::<Service>().unwrap(),
            Service {
                proto: Proto::Tcp,
                port: 8080
            }
        );
        assert_eq!("udp:53".parse::<Service>().unwrap().to_string(), "udp:53");
        for bad in ["tcp", "tcp:0", "tcp:65536", "icmp:1", ":80", "tcp:80:1", ""] {
            assert!(bad.parse::<Service>().is_err(), "{bad}");
        }
    }

    /// DNS to the configured resolvers is accepted before the private ranges
    /// are refused (a host's resolver is usually in one), and only for egress
    /// sources and port 53.
    #[test]
    fn resolvers_are_allowed_before_the_private_ranges_are_refused() {
        let cmds = inet_table("drums-x", "x", Ipv4Addr::new(10, 0, 0, 1), &[]);
        let forward: Vec<String> = cmds
            .iter()
            .filter(|c| c["add"]["rule"]["chain"] == "forward")
            .map(|c| c["add"]["rule"]["expr"].to_string())
            .collect();
        let dns = forward
            .iter()
            .position(|e| e.contains("@resolvers"))
            .unwrap();
        let private = forward.iter().position(|e| e.contains("@private")).unwrap();
        assert!(dns < private, "{forward:#?}");
        assert!(forward[dns].contains("@egress") && forward[dns].contains("53"));
        assert!(cmds.iter().any(|c| c["add"]["set"]["name"] == "resolvers"));
    }

    /// The allow-list is accepted on the gateway's address only.
    #[test]
    fn services_are_matched_on_the_gateway_only() {
        let services = [Service {
            proto: Proto::Tcp,
            port: 7080,
        }];
        let cmds = inet_table("drums-x", "x", Ipv4Addr::new(10, 9, 0, 1), &services);
        let rule = cmds
            .iter()
            .map(|c| c["add"]["rule"]["expr"].to_string())
            .find(|e| e.contains("@services"))
            .unwrap();
        assert!(
            rule.contains(r#""field":"daddr""#) && rule.contains("10.9.0.1"),
            "{rule}"
        );
    }

    #[test]
    fn port_element_spells_mac_and_ip() {
        let p = Port {
            ifname: "drumsabc".into(),
            mac: [0x02, 0xab, 0, 1, 2, 0xff],
            ip: Ipv4Addr::new(10, 1, 2, 3),
            egress: false,
        };
        assert_eq!(
            port_element(&p),
            json!({"concat": ["drumsabc", "02:ab:00:01:02:ff", "10.1.2.3"]})
        );
    }
}
