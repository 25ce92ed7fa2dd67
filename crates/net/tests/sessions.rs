//! Real (root, no mocks) tests of drums-net: a bridge, two session namespaces
//! held by `sleep` children, veth pairs into them, and TCP between host and
//! sessions. Traffic only ever goes to the test's own 10.254.x.0/24 addresses
//! inside namespaces these tests create.
//!
//! Every test owns a random link-name prefix; its `Fixture` (tests/common)
//! kills the children, deletes the bridge and its firewall and then checks that
//! no link with that prefix and no nft table of it is left on the host, also
//! when the test fails. The firewall's rules are tested in tests/firewall.rs.

mod common;

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use drums_net::rtnetlink::packet_route::address::{AddressAttribute, AddressMessage};
use drums_net::rtnetlink::packet_route::link::{
    InfoBridgePort, InfoPortData, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use drums_net::rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteScope,
};
use drums_net::rtnetlink::{LinkUnspec, RouteMessageBuilder};
use drums_net::{get_link, in_netns, loopback_up, Net, NetError, Proto, Service};
use futures::TryStreamExt;

use common::{in_ns_blocking, netlink_err, runtime, Fixture};

/// What a session namespace looks like from inside.
struct Inside {
    eth0: Option<LinkMessage>,
    lo: LinkMessage,
    eth0_addrs: Vec<AddressMessage>,
    routes: Vec<RouteMessage>,
}

async fn look_inside(pid: i32) -> Inside {
    in_netns(pid, |h| async move {
        let eth0 = get_link(&h, "eth0").await?;
        let lo = get_link(&h, "lo").await?.expect("lo exists");
        let mut eth0_addrs = Vec::new();
        if let Some(eth0) = &eth0 {
            eth0_addrs = h
                .address()
                .get()
                .set_link_index_filter(eth0.header.index)
                .execute()
                .try_collect()
                .await
                .map_err(netlink_err("list addresses"))?;
        }
        let routes = h
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(netlink_err("list routes"))?;
        Ok(Inside {
            eth0,
            lo,
            eth0_addrs,
            routes,
        })
    })
    .await
    .expect("look inside session netns")
}

fn is_up(link: &LinkMessage) -> bool {
    link.header.flags.contains(LinkFlags::Up)
}

fn mac_of(link: &LinkMessage) -> Option<Vec<u8>> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Address(m) => Some(m.clone()),
        _ => None,
    })
}

fn v4_addrs(addrs: &[AddressMessage]) -> Vec<(Ipv4Addr, u8)> {
    addrs
        .iter()
        .filter_map(|m| {
            m.attributes.iter().find_map(|a| match a {
                AddressAttribute::Local(std::net::IpAddr::V4(ip)) => {
                    Some((*ip, m.header.prefix_len))
                }
                _ => None,
            })
        })
        .collect()
}

fn default_gateway(routes: &[RouteMessage]) -> Option<Ipv4Addr> {
    routes
        .iter()
        .filter(|r| r.header.destination_prefix_length == 0)
        .find_map(|r| {
            r.attributes.iter().find_map(|a| match a {
                RouteAttribute::Gateway(RouteAddress::Inet(gw)) => Some(*gw),
                _ => None,
            })
        })
}

fn port_is_isolated(link: &LinkMessage) -> bool {
    link.attributes.iter().any(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().any(|i| match i {
            LinkInfo::PortData(InfoPortData::BridgePort(opts)) => {
                opts.contains(&InfoBridgePort::Isolated(true))
            }
            _ => false,
        }),
        _ => false,
    })
}

fn controller(link: &LinkMessage) -> Option<u32> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Controller(i) => Some(*i),
        _ => None,
    })
}

const PORT: u16 = 18080;
/// The port the tests allow-list on the bridge address.
const SERVED_PORT: u16 = 18081;

#[test]
fn two_sessions_reach_allowed_host_port_but_not_each_other() {
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let gw = fx.gateway();
    // The only host port sessions may open: the firewall's allow-list.
    let services = [Service {
        proto: Proto::Tcp,
        port: SERVED_PORT,
    }];

    let br = rt
        .block_on(net.ensure_bridge(&fx.bridge, gw, 24, &services))
        .expect("create bridge");
    // Idempotent: a second call finds the bridge and its address.
    assert_eq!(
        rt.block_on(net.ensure_bridge(&fx.bridge, gw, 24, &services))
            .unwrap(),
        br
    );

    let pid_a = fx.spawn_session();
    let pid_b = fx.spawn_session();
    let spec_a = fx.spec("va", pid_a, 2, true);
    let spec_b = fx.spec("vb", pid_b, 3, false);
    rt.block_on(net.create_session_veth(&spec_a))
        .expect("veth a");
    rt.block_on(net.create_session_veth(&spec_b))
        .expect("veth b");

    let mut names = rt.block_on(net.links_with_prefix(&fx.prefix)).unwrap();
    names.sort();
    assert_eq!(
        names,
        vec![
            fx.bridge.clone(),
            spec_a.host_name.clone(),
            spec_b.host_name.clone()
        ]
    );

    // Host ends: enslaved, isolated, up.
    for spec in [&spec_a, &spec_b] {
        let host_end = rt
            .block_on(get_link(net.handle(), &spec.host_name))
            .unwrap()
            .expect("host end exists");
        assert_eq!(
            controller(&host_end),
            Some(br),
            "{} enslaved",
            spec.host_name
        );
        assert!(port_is_isolated(&host_end), "{} isolated", spec.host_name);
        assert!(is_up(&host_end), "{} up", spec.host_name);
    }

    // Inside: eth0 with MAC, address and up; lo up; default route only for A.
    for spec in [&spec_a, &spec_b] {
        let inside = rt.block_on(look_inside(spec.netns_pid));
        let eth0 = inside.eth0.expect("eth0 in session");
        assert_eq!(mac_of(&eth0), Some(spec.mac.to_vec()));
        assert!(is_up(&eth0), "eth0 up");
        assert!(is_up(&inside.lo), "lo up");
        assert_eq!(v4_addrs(&inside.eth0_addrs), vec![(spec.ip, 24)]);
        let expected_gw = spec.egress.then_some(gw);
        assert_eq!(default_gateway(&inside.routes), expected_gw);
    }

    // A listener in each session on its own address, and one on the host's
    // bridge address. The kernel completes handshakes into the backlog, so no
    // accept loop is needed.
    for spec in [&spec_a, &spec_b] {
        let ip = spec.ip;
        let l = in_ns_blocking(spec.netns_pid, move || TcpListener::bind((ip, PORT)))
            .expect("listen in session");
        fx.listeners.push(l);
    }
    let host_listener = TcpListener::bind((gw, SERVED_PORT)).expect("listen on bridge address");
    let host_addr = host_listener.local_addr().unwrap();

    let ok = Duration::from_secs(3);
    for spec in [&spec_a, &spec_b] {
        let to = SocketAddr::from((spec.ip, PORT));
        TcpStream::connect_timeout(&to, ok).unwrap_or_else(|e| panic!("host -> {to}: {e}"));
        let from_session = in_ns_blocking(spec.netns_pid, move || {
            TcpStream::connect_timeout(&host_addr, ok).map(drop)
        });
        from_session.unwrap_or_else(|e| panic!("session {} -> host {host_addr}: {e}", spec.ip));
    }

    // Isolated ports: no ARP and no traffic between sessions.
    let short = Duration::from_millis(500);
    for (from, to) in [(&spec_a, &spec_b), (&spec_b, &spec_a)] {
        let target = SocketAddr::from((to.ip, PORT));
        let res = in_ns_blocking(from.netns_pid, move || {
            TcpStream::connect_timeout(&target, short).map(drop)
        });
        assert!(
            res.is_err(),
            "session {} reached session {}",
            from.ip,
            to.ip
        );
    }

    drop(host_listener);
    fx.finish();
}

#[test]
fn missing_pid_fails_and_leaves_nothing() {
    let rt = runtime();
    let fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    rt.block_on(net.ensure_bridge(&fx.bridge, fx.gateway(), 24, &[]))
        .unwrap();

    // Above any possible pid_max (2^22).
    let spec = fx.spec("vx", i32::MAX - 7, 2, true);
    let err = rt
        .block_on(net.create_session_veth(&spec))
        .expect_err("no such pid");
    assert!(matches!(err, NetError::OpenNetns { .. }), "{err:?}");
    assert!(!rt.block_on(net.link_exists(&spec.host_name)).unwrap());
    assert_eq!(
        rt.block_on(net.links_with_prefix(&fx.prefix)).unwrap(),
        vec![fx.bridge.clone()]
    );
    fx.finish();
}

#[test]
fn failure_after_veth_creation_rolls_back() {
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    rt.block_on(net.ensure_bridge(&fx.bridge, fx.gateway(), 24, &[]))
        .unwrap();
    let pid = fx.spawn_session();

    // A default route that already exists inside the session makes the very
    // last step (adding ours) fail, after the pair exists and is configured.
    rt.block_on(in_netns(pid, |h| async move {
        let lo = get_link(&h, "lo").await?.expect("lo").header.index;
        h.link()
            .change(LinkUnspec::new_with_index(lo).up().build())
            .execute()
            .await
            .map_err(netlink_err("set lo up"))?;
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .output_interface(lo)
            .scope(RouteScope::Link)
            .build();
        h.route()
            .add(route)
            .execute()
            .await
            .map_err(netlink_err("add conflicting route"))
    }))
    .expect("pre-existing default route");
    let spec = fx.spec("vr", pid, 2, true);
    let err = rt
        .block_on(net.create_session_veth(&spec))
        .expect_err("default route exists");
    assert!(
        matches!(
            err,
            NetError::Netlink {
                op: "add default route",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!rt.block_on(net.link_exists(&spec.host_name)).unwrap());
    assert!(
        rt.block_on(look_inside(pid)).eth0.is_none(),
        "eth0 left in session"
    );

    // Without the default route the same spec works in the same namespace.
    let spec = fx.spec("vr", pid, 2, false);
    rt.block_on(net.create_session_veth(&spec)).expect("retry");
    assert!(rt.block_on(net.link_exists(&spec.host_name)).unwrap());
    fx.finish();
}

#[test]
fn loopback_up_and_host_namespace_refused() {
    let rt = runtime();
    let mut fx = Fixture::new();
    let pid = fx.spawn_session();
    assert!(!is_up(&rt.block_on(look_inside(pid)).lo));
    rt.block_on(loopback_up(pid)).expect("loopback up");
    assert!(is_up(&rt.block_on(look_inside(pid)).lo));

    // Our own pid is in the host namespace: never configure that.
    let err = rt
        .block_on(loopback_up(std::process::id() as i32))
        .expect_err("host namespace");
    assert!(matches!(err, NetError::HostNetns { .. }), "{err:?}");
    fx.finish();
}

#[test]
fn delete_missing_link_is_ok_false() {
    let rt = runtime();
    let fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let name = format!("{}zz", fx.prefix);
    assert!(!rt.block_on(net.link_exists(&name)).unwrap());
    assert!(!rt.block_on(net.delete_link(&name)).unwrap());

    rt.block_on(net.ensure_bridge(&fx.bridge, fx.gateway(), 24, &[]))
        .unwrap();
    assert!(rt.block_on(net.link_exists(&fx.bridge)).unwrap());
    assert!(rt.block_on(net.delete_link(&fx.bridge)).unwrap());
    assert!(!rt.block_on(net.link_exists(&fx.bridge)).unwrap());
    fx.finish();
}
