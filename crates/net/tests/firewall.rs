//! Real (root, real nftables, real namespaces) tests of drumsd's firewall:
//! each rule is shown to stop what it claims to, and, where a test could pass
//! for another reason, the same probe is repeated with the firewall removed to
//! show that it then gets through.
//!
//! Traffic goes only to addresses inside namespaces these tests create: the
//! test bridge's 10.254.x.0/24, and, for egress, an "outside world" namespace
//! at 203.0.113.2 (TEST-NET-3) with a second, private address 100.64.x.2 on it.

mod common;

use std::fs::File;
use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use drums_net::rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute};
use drums_net::rtnetlink::{LinkUnspec, LinkVeth, RouteMessageBuilder};
use drums_net::{firewall, get_link, in_netns, IpForward, Net, NetError, Proto, Service};

use common::{in_ns_blocking, netlink_err, runtime, Fixture};

const SERVED: u16 = 18091;
const UNSERVED: u16 = 18092;
const PORT: u16 = 18093;
const SHORT: Duration = Duration::from_millis(700);
const OK: Duration = Duration::from_secs(3);

/// Tests that turn ip_forward on run one at a time: each puts back what it
/// found, which must not be another test's value.
static FORWARDING: Mutex<()> = Mutex::new(());

/// `net.ipv4.ip_forward` on, through the helper drumsd uses, and back to what
/// it was when dropped (also when the test fails).
struct Forwarding(IpForward);

impl Forwarding {
    fn on() -> Forwarding {
        let f = IpForward::new();
        f.enable().expect("enable ip_forward");
        assert_eq!(sysctl("/proc/sys/net/ipv4/ip_forward"), "1");
        Forwarding(f)
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.0.restore().expect("restore ip_forward");
    }
}

fn sysctl(path: &str) -> String {
    std::fs::read_to_string(path).unwrap().trim().to_string()
}

fn connect_from(pid: i32, to: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    in_ns_blocking(pid, move || {
        TcpStream::connect_timeout(&to, timeout).map(drop)
    })
}

fn listen_in(pid: i32, ip: Ipv4Addr, port: u16) -> TcpListener {
    in_ns_blocking(pid, move || TcpListener::bind((ip, port))).expect("listen in namespace")
}

fn two_sessions(fx: &mut Fixture, net: &Net, rt: &tokio::runtime::Runtime) -> [(i32, u8); 2] {
    let a = fx.spawn_session();
    let b = fx.spawn_session();
    rt.block_on(net.create_session_veth(&fx.spec("va", a, 2, false)))
        .expect("veth a");
    rt.block_on(net.create_session_veth(&fx.spec("vb", b, 3, false)))
        .expect("veth b");
    [(a, 2), (b, 3)]
}

#[test]
fn firewall_comes_with_the_bridge_and_goes_with_it() {
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let table = firewall::table_name(&fx.bridge);
    assert!(!firewall::exists(&fx.bridge).unwrap());

    rt.block_on(net.ensure_bridge(&fx.bridge, fx.gateway(), 24, &[]))
        .expect("bridge");
    let tables = firewall::tables().unwrap();
    for family in ["bridge", "inet"] {
        assert!(
            tables.contains(&(family.to_string(), table.clone())),
            "no {family} {table} in {tables:?}"
        );
    }
    // The host ignores router advertisements and redirects on the bridge.
    let conf = format!("/proc/sys/net/ipv6/conf/{}", fx.bridge);
    if std::path::Path::new("/proc/sys/net/ipv6").exists() {
        assert_eq!(sysctl(&format!("{conf}/accept_ra")), "0");
        assert_eq!(sysctl(&format!("{conf}/accept_redirects")), "0");
    }

    // A port is listed with its veth and forgotten by remove_port.
    let pid = fx.spawn_session();
    let spec = fx.spec("va", pid, 2, false);
    rt.block_on(net.create_session_veth(&spec)).expect("veth");
    assert_eq!(
        firewall::ports(&fx.bridge).unwrap(),
        vec![(spec.host_name.clone(), spec.ip)]
    );
    firewall::remove_port(&fx.bridge, &spec.host_name).unwrap();
    assert_eq!(firewall::ports(&fx.bridge).unwrap(), vec![]);
    // Twice is fine (teardown after a crash), and so is an unknown port.
    firewall::remove_port(&fx.bridge, &spec.host_name).unwrap();
    firewall::remove_port("nosuchbridge", "nosuchport").unwrap();

    // A veth that fails half-way takes its elements with it.
    let bad = fx.spec("vx", i32::MAX - 7, 4, false);
    assert!(rt.block_on(net.create_session_veth(&bad)).is_err());
    assert!(firewall::ports(&fx.bridge).unwrap().is_empty());

    assert!(firewall::remove(&fx.bridge).unwrap());
    assert!(!firewall::exists(&fx.bridge).unwrap());
    assert!(!firewall::remove(&fx.bridge).unwrap(), "second remove");
    fx.finish();
}

#[test]
fn a_session_reaches_only_the_served_ports_of_the_host() {
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let gw = fx.gateway();
    let services = [Service {
        proto: Proto::Tcp,
        port: SERVED,
    }];
    rt.block_on(net.ensure_bridge(&fx.bridge, gw, 24, &services))
        .unwrap();
    let [(a, _), _] = two_sessions(&mut fx, &net, &rt);
    let served = TcpListener::bind((gw, SERVED)).unwrap();
    let unserved = TcpListener::bind((gw, UNSERVED)).unwrap();

    connect_from(a, (gw, SERVED).into(), OK).expect("the served port is reachable");
    let e = connect_from(a, (gw, UNSERVED).into(), SHORT).expect_err("unserved port reached");
    // Dropped, not refused: the session learns nothing about host ports.
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");

    // The host can still reach the session (replies come back in).
    let ip_a = fx.ip(2);
    fx.listeners.push(listen_in(a, ip_a, PORT));
    TcpStream::connect_timeout(&(ip_a, PORT).into(), OK).expect("host -> session");

    // Without the firewall the same probe gets through: it was the firewall.
    firewall::remove(&fx.bridge).unwrap();
    connect_from(a, (gw, UNSERVED).into(), OK).expect("reachable without the firewall");
    drop((served, unserved));
    fx.finish();
}

/// One more host address, on a veth pair of the host's own (this kernel has
/// no dummy links), deleted when dropped, also when the test fails: another
/// address of the host, on no bridge, that nothing outside the machine can
/// reach.
struct OtherAddress {
    name: String,
}

impl OtherAddress {
    fn add(net: &Net, rt: &tokio::runtime::Runtime, name: String, ip: Ipv4Addr) -> OtherAddress {
        let peer = format!("{name}p");
        rt.block_on(
            net.handle()
                .link()
                .add(LinkVeth::new(&name, &peer).build())
                .execute(),
        )
        .expect("add a veth pair");
        let other = OtherAddress { name };
        let index = rt
            .block_on(get_link(net.handle(), &other.name))
            .unwrap()
            .expect("the veth")
            .header
            .index;
        rt.block_on(
            net.handle()
                .address()
                .add(index, std::net::IpAddr::V4(ip), 32)
                .execute(),
        )
        .expect("an address on the veth");
        rt.block_on(
            net.handle()
                .link()
                .change(LinkUnspec::new_with_index(index).up().build())
                .execute(),
        )
        .expect("set the veth up");
        other
    }
}

impl Drop for OtherAddress {
    fn drop(&mut self) {
        let rt = runtime();
        let name = self.name.clone();
        let deleted = rt.block_on(async move { Net::new().await?.delete_link(&name).await });
        if let Err(e) = deleted {
            eprintln!("delete veth {}: {e}", self.name);
        }
    }
}

/// The bridge services are served on the gateway only: a session that
/// routes another host address through the gateway finds the same port
/// there dropped (issue 23, item 7: a listener such as
/// `--llm-proxy-local 0.0.0.0:7080` trusts what its callers say). Without
/// the firewall the same probe connects, so it is the rule that stops it.
#[test]
fn a_service_port_on_another_host_address_is_not_reachable() {
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let gw = fx.gateway();
    let services = [Service {
        proto: Proto::Tcp,
        port: SERVED,
    }];
    rt.block_on(net.ensure_bridge(&fx.bridge, gw, 24, &services))
        .unwrap();
    let other_ip = Ipv4Addr::new(198, 51, 100, fx.octet);
    let other = OtherAddress::add(&net, &rt, format!("{}o", fx.prefix), other_ip);
    let [(a, _), _] = two_sessions(&mut fx, &net, &rt);
    // What a hostile session would do: send to the other address through
    // its gateway, the host.
    rt.block_on(in_netns(a, move |h| async move {
        let eth0 = get_link(&h, "eth0").await?.expect("eth0").header.index;
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(other_ip, 32)
            .gateway(gw)
            .output_interface(eth0)
            .build();
        h.route()
            .add(route)
            .execute()
            .await
            .map_err(netlink_err("add route via host"))
    }))
    .expect("route via the host");
    let on_gateway = TcpListener::bind((gw, SERVED)).unwrap();
    let on_other = TcpListener::bind((other_ip, SERVED)).unwrap();

    connect_from(a, (gw, SERVED).into(), OK).expect("the service on the gateway is reachable");
    let e = connect_from(a, (other_ip, SERVED).into(), SHORT)
        .expect_err("the service port on another host address was reached");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");

    firewall::remove(&fx.bridge).unwrap();
    connect_from(a, (other_ip, SERVED).into(), OK).expect("reachable without the firewall");
    drop((on_gateway, on_other, other));
    fx.finish();
}

#[test]
fn sessions_never_reach_each_other_even_with_ip_forward() {
    let _serial = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let gw = fx.gateway();
    rt.block_on(net.ensure_bridge(&fx.bridge, gw, 24, &[]))
        .unwrap();
    let [(a, ha), (b, hb)] = two_sessions(&mut fx, &net, &rt);
    let _fwd = Forwarding::on();
    // What a hostile session would do: route its neighbour through the host,
    // since the isolated bridge port keeps it from reaching it directly. (No
    // redirects, so the host's ICMP redirect cannot divert the probe.)
    for (pid, peer) in [(a, fx.ip(hb)), (b, fx.ip(ha))] {
        in_ns_blocking(pid, || {
            std::fs::write("/proc/sys/net/ipv4/conf/eth0/accept_redirects", "0")
        })
        .unwrap();
        rt.block_on(in_netns(pid, move |h| async move {
            let eth0 = get_link(&h, "eth0").await?.expect("eth0").header.index;
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(peer, 32)
                .gateway(gw)
                .output_interface(eth0)
                .build();
            h.route()
                .add(route)
                .execute()
                .await
                .map_err(netlink_err("add route via host"))
        }))
        .expect("route via the host");
    }
    let ip_b = fx.ip(hb);
    fx.listeners.push(listen_in(b, ip_b, PORT));

    let e = connect_from(a, (ip_b, PORT).into(), SHORT).expect_err("a reached b");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");

    firewall::remove(&fx.bridge).unwrap();
    connect_from(a, (ip_b, PORT).into(), OK).expect("routed by the host without the firewall");
    fx.finish();
}

/// An Ethernet frame carrying IPv4/UDP to `dst_ip:port` with `payload`.
fn udp_frame(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    port: u16,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend(dst_mac);
    f.extend(src_mac);
    f.extend(0x0800u16.to_be_bytes());
    let total = (20 + 8 + payload.len()) as u16;
    let mut ip = vec![0x45, 0];
    ip.extend(total.to_be_bytes());
    ip.extend([0, 1, 0x40, 0, 64, 17, 0, 0]);
    ip.extend(src_ip.octets());
    ip.extend(dst_ip.octets());
    let mut sum: u32 = ip
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    ip[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    f.extend(ip);
    f.extend(40000u16.to_be_bytes());
    f.extend(port.to_be_bytes());
    f.extend(((8 + payload.len()) as u16).to_be_bytes());
    f.extend([0, 0]); // no UDP checksum (optional in IPv4)
    f.extend(payload);
    f
}

/// A broadcast ARP request for `target` claiming `sender_ip` is at
/// `sender_mac`, sent with Ethernet source `src_mac`.
fn arp_frame(
    src_mac: [u8; 6],
    sender_mac: [u8; 6],
    sender_ip: Ipv4Addr,
    target: Ipv4Addr,
) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend(src_mac);
    f.extend(0x0806u16.to_be_bytes());
    f.extend([0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend(sender_mac);
    f.extend(sender_ip.octets());
    f.extend([0; 6]);
    f.extend(target.octets());
    f
}

/// An ICMPv6 router advertisement to all nodes (its contents beyond the type
/// do not matter: it must not reach the host at all).
fn router_advert(src_mac: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0x33, 0x33, 0, 0, 0, 1];
    f.extend(src_mac);
    f.extend(0x86ddu16.to_be_bytes());
    f.extend([0x60, 0, 0, 0, 0, 16, 58, 255]);
    f.extend([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    f.extend([0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    f.extend([134, 0, 0, 0, 64, 0, 0x07, 0x08]);
    f.extend([0; 8]);
    f
}

fn packet_socket(protocol: u16) -> OwnedFd {
    // SAFETY: plain socket(2); the result is checked before it is wrapped.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(protocol.to_be())) };
    assert!(
        fd >= 0,
        "packet socket: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn link_addr(ifindex: i32, protocol: u16, mac: [u8; 6]) -> libc::sockaddr_ll {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = protocol.to_be();
    sa.sll_ifindex = ifindex;
    sa.sll_halen = 6;
    sa.sll_addr[..6].copy_from_slice(&mac);
    sa
}

fn ifindex(name: &str) -> i32 {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: c is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    assert!(i > 0, "no interface {name}");
    i as i32
}

/// Sends raw frames from `eth0` inside the namespace of `pid`: what a session's
/// root can do with CAP_NET_RAW in its own namespace.
fn send_raw(pid: i32, frames: Vec<Vec<u8>>) {
    in_ns_blocking(pid, move || {
        let sock = packet_socket(0);
        let sa = link_addr(ifindex("eth0"), 0, [0; 6]);
        for f in &frames {
            // SAFETY: f and sa are valid for the call; the lengths are theirs.
            let n = unsafe {
                libc::sendto(
                    sock.as_raw_fd(),
                    f.as_ptr().cast(),
                    f.len(),
                    0,
                    (&sa as *const libc::sockaddr_ll).cast(),
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            assert_eq!(
                n,
                f.len() as isize,
                "send: {}",
                std::io::Error::last_os_error()
            );
        }
    })
}

/// Captures every frame that reaches the host through `bridge` (a packet
/// socket on the bridge device sees a frame only after the bridge's
/// prerouting hook let it through) while `send` runs, and a little after.
fn seen_by_host(bridge: &str, send: impl FnOnce()) -> Vec<Vec<u8>> {
    const ETH_P_ALL: u16 = 0x0003;
    let index = ifindex(bridge);
    let (ready_tx, ready_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let tap = std::thread::spawn(move || {
        let sock = packet_socket(ETH_P_ALL);
        let sa = link_addr(index, ETH_P_ALL, [0; 6]);
        // SAFETY: sa is a valid sockaddr_ll of the given size.
        let rc = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind tap: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: tv is a valid timeval of the given size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        ready_tx.send(()).unwrap();
        let mut file = File::from(sock);
        let mut frames = Vec::new();
        let mut buf = vec![0u8; 2048];
        loop {
            match file.read(&mut buf) {
                Ok(n) => frames.push(buf[..n].to_vec()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("tap read: {e}"),
            }
            if stop_rx.try_recv().is_ok() {
                return frames;
            }
        }
    });
    ready_rx.recv().unwrap();
    send();
    std::thread::sleep(Duration::from_millis(500));
    stop_tx.send(()).unwrap();
    tap.join().unwrap()
}

fn bridge_mac(net: &Net, rt: &tokio::runtime::Runtime, bridge: &str) -> [u8; 6] {
    let link = rt
        .block_on(get_link(net.handle(), bridge))
        .unwrap()
        .unwrap();
    link.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(m) => m.as_slice().try_into().ok(),
            _ => None,
        })
        .expect("bridge mac")
}

fn has_udp_payload(frames: &[Vec<u8>], marker: &[u8]) -> bool {
    frames
        .iter()
        .any(|f| f.windows(marker.len()).any(|w| w == marker))
}

fn has_arp(frames: &[Vec<u8>], sender_mac: [u8; 6], sender_ip: Ipv4Addr) -> bool {
    frames.iter().any(|f| {
        f.len() >= 42
            && f[12..14] == [0x08, 0x06]
            && f[22..28] == sender_mac
            && f[28..32] == sender_ip.octets()
    })
}

fn has_router_advert(frames: &[Vec<u8>], src_mac: [u8; 6]) -> bool {
    frames
        .iter()
        .any(|f| f.len() > 54 && f[6..12] == src_mac && f[12..14] == [0x86, 0xdd] && f[54] == 134)
}

#[test]
fn a_session_sends_only_from_its_own_mac_and_ip() {
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let gw = fx.gateway();
    rt.block_on(net.ensure_bridge(&fx.bridge, gw, 24, &[]))
        .unwrap();
    let [(a, ha), (_, hb)] = two_sessions(&mut fx, &net, &rt);
    let (spec_a, spec_b) = (fx.spec("va", a, ha, false), fx.spec("vb", 0, hb, false));
    let (mac_a, ip_a, mac_b, ip_b) = (spec_a.mac, spec_a.ip, spec_b.mac, spec_b.ip);
    let gw_mac = bridge_mac(&net, &rt, &fx.bridge);

    let probes = |tag: &str| {
        let marker = |what: &str| format!("drums-{tag}-{what}-{:x}", common::random_u64());
        let (honest, spoofed_ip, spoofed_mac) = (marker("honest"), marker("ip"), marker("mac"));
        let frames = vec![
            udp_frame(mac_a, gw_mac, ip_a, gw, PORT, honest.as_bytes()),
            udp_frame(mac_a, gw_mac, ip_b, gw, PORT, spoofed_ip.as_bytes()),
            udp_frame(mac_b, gw_mac, ip_a, gw, PORT, spoofed_mac.as_bytes()),
            arp_frame(mac_a, mac_a, ip_a, gw),
            // B's address at A's MAC: the classic poisoning of the host's
            // neighbour table, which would send B's traffic to A.
            arp_frame(mac_a, mac_a, ip_b, gw),
            // Consistent lies: B's MAC and address throughout.
            arp_frame(mac_b, mac_b, ip_b, gw),
            // An honest Ethernet source with a forged ARP sender MAC.
            arp_frame(mac_a, mac_b, ip_a, gw),
            router_advert(mac_a),
        ];
        (honest, spoofed_ip, spoofed_mac, frames)
    };

    let (honest, spoofed_ip, spoofed_mac, frames) = probes("fw");
    let seen = seen_by_host(&fx.bridge, || send_raw(a, frames));
    assert!(
        has_udp_payload(&seen, honest.as_bytes()),
        "honest IPv4 not seen"
    );
    assert!(
        !has_udp_payload(&seen, spoofed_ip.as_bytes()),
        "spoofed source IP seen"
    );
    assert!(
        !has_udp_payload(&seen, spoofed_mac.as_bytes()),
        "spoofed source MAC seen"
    );
    assert!(has_arp(&seen, mac_a, ip_a), "honest ARP not seen");
    assert!(
        !has_arp(&seen, mac_a, ip_b),
        "ARP claiming B's address seen"
    );
    assert!(!has_arp(&seen, mac_b, ip_b), "ARP as B seen");
    assert!(
        !has_arp(&seen, mac_b, ip_a),
        "ARP with a forged sender MAC seen"
    );
    assert!(
        !has_router_advert(&seen, mac_a),
        "router advertisement seen"
    );

    // The same frames without the firewall all arrive: the probes can fail.
    firewall::remove(&fx.bridge).unwrap();
    let (honest, spoofed_ip, spoofed_mac, frames) = probes("open");
    let seen = seen_by_host(&fx.bridge, || send_raw(a, frames));
    assert!(has_udp_payload(&seen, honest.as_bytes()));
    assert!(has_udp_payload(&seen, spoofed_ip.as_bytes()));
    assert!(has_udp_payload(&seen, spoofed_mac.as_bytes()));
    assert!(has_arp(&seen, mac_a, ip_b));
    assert!(has_router_advert(&seen, mac_a));
    fx.finish();
}

/// The test's "outside world": a namespace held by a child of the fixture,
/// wired to the host by a veth `<prefix>wo` as 203.0.113.1 (host) and
/// 203.0.113.2 (world), with the private address `private` on the world's
/// loopback, routed by the host through the world.
fn make_world(fx: &mut Fixture, net: &Net, rt: &tokio::runtime::Runtime, private: Ipv4Addr) -> i32 {
    let pid = fx.spawn_session();
    let host_end = format!("{}wo", fx.prefix);
    let ns = File::open(format!("/proc/{pid}/ns/net")).unwrap();
    assert_ne!(
        ns.metadata().unwrap().ino(),
        std::fs::metadata("/proc/self/ns/net").unwrap().ino()
    );
    let peer = LinkUnspec::new_with_name("eth0")
        .setns_by_fd(ns.as_raw_fd())
        .build();
    let veth = LinkVeth::new(&host_end, "eth0")
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
        .build();
    let host = Ipv4Addr::new(203, 0, 113, 1);
    let world = Ipv4Addr::new(203, 0, 113, 2);
    rt.block_on(async {
        let h = net.handle();
        h.link()
            .add(veth)
            .execute()
            .await
            .map_err(netlink_err("add world veth"))?;
        let index = get_link(h, &host_end)
            .await?
            .expect("world veth")
            .header
            .index;
        h.address()
            .add(index, host.into(), 24)
            .execute()
            .await
            .map_err(netlink_err("world host address"))?;
        h.link()
            .change(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(netlink_err("world veth up"))?;
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(private, 32)
            .gateway(world)
            .output_interface(index)
            .build();
        h.route()
            .add(route)
            .execute()
            .await
            .map_err(netlink_err("route to the private address"))?;
        Ok::<_, NetError>(())
    })
    .expect("world, host side");
    rt.block_on(in_netns(pid, move |h| async move {
        for (name, addr, len) in [("lo", private, 32), ("eth0", world, 24)] {
            let index = get_link(&h, name).await?.expect("link").header.index;
            h.address()
                .add(index, addr.into(), len)
                .execute()
                .await
                .map_err(netlink_err("world address"))?;
            h.link()
                .change(LinkUnspec::new_with_index(index).up().build())
                .execute()
                .await
                .map_err(netlink_err("world link up"))?;
        }
        let eth0 = get_link(&h, "eth0").await?.expect("eth0").header.index;
        drums_net::add_default_route(&h, eth0, host).await
    }))
    .expect("world, inside");
    pid
}

#[test]
fn egress_nat_reaches_the_outside_but_not_the_host_or_private_ranges() {
    let _serial = FORWARDING.lock().unwrap_or_else(|e| e.into_inner());
    let rt = runtime();
    let mut fx = Fixture::new();
    let net = rt.block_on(Net::new()).unwrap();
    let gw = fx.gateway();
    rt.block_on(net.ensure_bridge(&fx.bridge, gw, 24, &[]))
        .unwrap();
    let private = Ipv4Addr::new(100, 64, fx.octet, 2);
    let world_pid = make_world(&mut fx, &net, &rt, private);
    let _fwd = Forwarding::on();

    let nat = fx.spawn_session();
    let closed = fx.spawn_session();
    rt.block_on(net.create_session_veth(&fx.spec("vn", nat, 2, true)))
        .expect("nat veth");
    rt.block_on(net.create_session_veth(&fx.spec("vc", closed, 3, false)))
        .expect("closed veth");
    // A hostile session without egress adds the default route itself.
    rt.block_on(in_netns(closed, move |h| async move {
        let eth0 = get_link(&h, "eth0").await?.expect("eth0").header.index;
        drums_net::add_default_route(&h, eth0, gw).await
    }))
    .unwrap();

    let outside = Ipv4Addr::new(203, 0, 113, 2);
    let world = in_ns_blocking(world_pid, || {
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT))
    })
    .expect("listen in the world");
    // The host itself reaches both world addresses: the routes are there.
    TcpStream::connect_timeout(&(outside, PORT).into(), OK).expect("host -> world");
    TcpStream::connect_timeout(&(private, PORT).into(), OK).expect("host -> private");
    let (_, from) = world.accept().unwrap();
    assert_eq!(from.ip(), Ipv4Addr::new(203, 0, 113, 1));
    let _ = world.accept().unwrap();

    connect_from(nat, (outside, PORT).into(), OK).expect("nat session -> outside");
    let (_, from) = world.accept().unwrap();
    assert_eq!(
        from.ip(),
        Ipv4Addr::new(203, 0, 113, 1),
        "masqueraded as the host"
    );
    let e = connect_from(closed, (outside, PORT).into(), SHORT)
        .expect_err("session without egress reached the outside");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    let e = connect_from(nat, (private, PORT).into(), SHORT)
        .expect_err("nat session reached a private address");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");

    // The host, by its bridge address and by its outside address.
    let on_gw = TcpListener::bind((gw, PORT)).unwrap();
    let on_outside = TcpListener::bind((Ipv4Addr::new(203, 0, 113, 1), PORT + 1)).unwrap();
    for to in [
        SocketAddr::from((gw, PORT)),
        SocketAddr::from((Ipv4Addr::new(203, 0, 113, 1), PORT + 1)),
    ] {
        let e = connect_from(nat, to, SHORT).expect_err("nat session reached the host");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{to}: {e}");
    }

    // Without the firewall the host routes both refused probes: it was the
    // firewall that stopped them.
    firewall::remove(&fx.bridge).unwrap();
    connect_from(closed, (outside, PORT).into(), OK).expect("routed without the firewall");
    connect_from(nat, (private, PORT).into(), OK).expect("routed without the firewall");
    drop((on_gw, on_outside, world));
    fx.finish();
}
