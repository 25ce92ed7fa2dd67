//! The network of sessions end to end, against a real drumsd, as root:
//! `drums create --egress nat` through the CLI and the API, a bad value
//! refused, and the firewall seen from inside real sessions. The test makes its
//! own "outside world": a network namespace behind the host at 198.51.100.2
//! (TEST-NET-2). No packet goes to any address beyond this machine. Every test
//! ends by stopping its daemon and proving nothing of it (links, nft tables,
//! namespaces, ip_forward) is left on the host.

mod common;

use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};

use common::{assert_schema, run, TestDaemon};
use drums_api::CreateSession;

const PORT: u16 = 18095;
const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// One world at a time in this binary: every world has the same addresses
/// and host-side link name, and the tests run two at a time.
static ONE_WORLD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The outside world: a namespace held by a `sleep`, with a veth to the host.
struct World {
    child: Child,
    host_end: String,
    listener: Option<TcpListener>,
    _only: std::sync::MutexGuard<'static, ()>,
}

impl World {
    const HOST: &'static str = "198.51.100.1";
    const ADDR: &'static str = "198.51.100.2";

    fn new() -> World {
        // A test that failed while holding it poisons it; the world it held
        // is gone with that test's Drop.
        let only = ONE_WORLD.lock().unwrap_or_else(|p| p.into_inner());
        let mut cmd = Command::new("sleep");
        cmd.arg("120").stdin(Stdio::null());
        // SAFETY: runs in the forked child before exec and only calls
        // unshare(2), which is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().expect("world namespace");
        let pid = child.id().to_string();
        let host_end = format!("drtw{}", std::process::id() % 100000);
        let mut w = World {
            child,
            host_end,
            listener: None,
            _only: only,
        };
        let ns = format!("--net=/proc/{pid}/ns/net");
        let host = format!("{}/24", World::HOST);
        let addr = format!("{}/24", World::ADDR);
        let steps: [&[&str]; 7] = [
            &[
                "ip",
                "link",
                "add",
                &w.host_end,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &pid,
            ],
            &["ip", "addr", "add", &host, "dev", &w.host_end],
            &["ip", "link", "set", &w.host_end, "up"],
            &["nsenter", &ns, "ip", "addr", "add", &addr, "dev", "eth0"],
            &["nsenter", &ns, "ip", "link", "set", "eth0", "up"],
            &["nsenter", &ns, "ip", "link", "set", "lo", "up"],
            &[
                "nsenter",
                &ns,
                "ip",
                "route",
                "add",
                "default",
                "via",
                World::HOST,
            ],
        ];
        for step in steps {
            let st = Command::new(step[0]).args(&step[1..]).status().unwrap();
            assert!(st.success(), "{step:?}: {st}");
        }
        // Bound from a thread inside the world, so the socket lives there.
        let pid = w.child.id();
        w.listener = Some(
            std::thread::spawn(move || {
                let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
                TcpListener::bind((Ipv4Addr::UNSPECIFIED, PORT)).unwrap()
            })
            .join()
            .unwrap(),
        );
        w
    }

    /// Ends the namespace (and with it the veth), and proves the link is gone.
    fn finish(mut self) {
        self.listener = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
        let link = std::path::Path::new("/sys/class/net").join(&self.host_end);
        assert!(
            common::gone(|| !link.exists()),
            "world veth {} leaked",
            self.host_end
        );
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl World {
    /// A name server inside the world on UDP port 53 that answers every A
    /// query with the world's own address, until the test ends. A minimal
    /// DNS responder: the question echoed, one answer pointing at it.
    fn serve_dns(&self) -> DnsServer {
        let pid = self.child.id();
        let sock = std::thread::spawn(move || {
            let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 53)).unwrap()
        })
        .join()
        .unwrap();
        // Polled, so the server can stop: its socket holds the world's
        // namespace (and its veth) for as long as it is open.
        sock.set_read_timeout(Some(std::time::Duration::from_millis(100)))
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok((n, peer)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                if n < 12 {
                    continue;
                }
                let mut a = buf[..n].to_vec();
                a[2] = 0x81; // response, recursion desired
                a[3] = 0x80; // recursion available, no error
                a[6..8].copy_from_slice(&1u16.to_be_bytes()); // one answer
                a[8..12].fill(0);
                // Name pointer to the question, A, IN, TTL 60, 4 bytes.
                a.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
                a.extend_from_slice(&World::ADDR.parse::<Ipv4Addr>().unwrap().octets());
                let _ = sock.send_to(&a, peer);
            }
        });
        DnsServer {
            stop,
            thread: Some(thread),
        }
    }
}

/// The world's name server; stops, and closes its socket, when dropped.
struct DnsServer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Python in the session: connect to `ip:port`, exit 0 on success.
fn connect_script(ip: &str, port: u16) -> String {
    format!("python3 -c \"import socket; socket.create_connection(('{ip}', {port}), timeout=1.5)\"")
}

#[test]
fn egress_nat_reaches_the_outside_and_nothing_else() {
    let ip_forward_before = std::fs::read_to_string(IP_FORWARD).unwrap();
    let mut d = TestDaemon::start();
    let world = World::new();
    let subnet = d.subnet();
    let gw = {
        let base: Ipv4Addr = subnet.split('/').next().unwrap().parse().unwrap();
        Ipv4Addr::from(u32::from(base) + 1)
    };
    // A host service on the bridge address that drums does not serve to
    // sessions: like the Python server of issue 10, it must stay unreachable.
    let host_service = TcpListener::bind((gw, PORT)).expect("listen on the bridge address");

    // Through the CLI, as a user would.
    let out = d.drums(&["create", "--egress", "nat", "--json"]);
    assert!(
        out.status.success(),
        "create --egress nat: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let nat: drums_api::Session = serde_json::from_slice(&out.stdout).unwrap();
    assert_schema("Session", &serde_json::to_value(&nat).unwrap());
    assert_eq!(nat.egress, drums_api::Egress::Nat);
    assert_eq!(
        std::fs::read_to_string(IP_FORWARD).unwrap().trim(),
        "1",
        "ip_forward on while a nat session exists"
    );
    // And the default, through the API.
    let closed = run(d.create(&CreateSession::default())).unwrap();
    assert_eq!(closed.egress, drums_api::Egress::None);

    let (_, route, _) = d.sh(&nat.id, "ip -4 route show default");
    assert!(
        route.starts_with(&format!("default via {gw} dev eth0")),
        "{route}"
    );
    let (_, route, _) = d.sh(&closed.id, "ip -4 route show default");
    assert_eq!(route, "", "egress none has no default route");

    let (code, _, err) = d.sh(&nat.id, &connect_script(World::ADDR, PORT));
    assert_eq!(code, 0, "nat session -> outside world: {err}");
    let (code, ..) = d.sh(&closed.id, &connect_script(World::ADDR, PORT));
    assert_ne!(code, 0, "a session without egress reached the outside");
    for (who, s) in [("nat", &nat), ("none", &closed)] {
        for ip in [gw.to_string(), World::HOST.to_string()] {
            let (code, ..) = d.sh(&s.id, &connect_script(&ip, PORT));
            assert_ne!(code, 0, "{who} session reached the host at {ip}");
        }
    }
    // The session rows say what they are, and go with their firewall elements.
    let got: drums_api::Session = run(d.client.json(
        hyper::Method::GET,
        &format!("/v1/sessions/{}", nat.id),
        None::<&()>,
    ))
    .unwrap();
    assert_eq!(got.egress, drums_api::Egress::Nat);

    // A restored sibling keeps its checkpoint's egress, with its own address.
    let ck = run(d.checkpoint(&nat.id, false, true));
    let sibling = run(d.restore(&ck.id, 1))
        .unwrap_or_else(|e| panic!("restore: {e}\n{}", d.log()))
        .sessions
        .remove(0);
    assert_eq!(sibling.egress, drums_api::Egress::Nat);
    assert_ne!(sibling.ip, nat.ip);
    let (code, _, err) = d.sh(&sibling.id, &connect_script(World::ADDR, PORT));
    assert_eq!(code, 0, "restored nat sibling -> outside world: {err}");
    let (code, ..) = d.sh(&sibling.id, &connect_script(&gw.to_string(), PORT));
    assert_ne!(code, 0, "restored sibling reached the host");

    assert_eq!(drums_net::firewall::ports(&d.bridge).unwrap().len(), 3);
    for s in [&nat, &sibling] {
        run(d.rm(&s.id)).unwrap();
    }
    let left = drums_net::firewall::ports(&d.bridge).unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1.to_string(), closed.ip.clone().unwrap());

    drop(host_service);
    d.stop_and_check_leaks();
    world.finish();
    assert_eq!(
        std::fs::read_to_string(IP_FORWARD).unwrap(),
        ip_forward_before,
        "ip_forward put back at shutdown"
    );
}

#[test]
fn bad_egress_is_refused_and_changes_nothing() {
    let mut d = TestDaemon::start();
    let out = d.drums(&["create", "--egress", "open"]);
    assert_eq!(out.status.code(), Some(2), "usage errors exit 2");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown egress \"open\": use none or nat"),
        "{err}"
    );
    let e = run(d.create(&CreateSession {
        network: Some("none".into()),
        egress: Some("nat".into()),
        ..Default::default()
    }))
    .expect_err("egress nat without the bridge");
    assert!(
        e.to_string().contains("egress nat needs network bridge"),
        "{e}"
    );
    let listed: drums_api::SessionList =
        run(d
            .client
            .json(hyper::Method::GET, "/v1/sessions", None::<&()>))
        .unwrap();
    assert!(listed.sessions.is_empty(), "{:?}", listed.sessions);
    d.stop_and_check_leaks();
}

/// A session with egress gets drumsd's name servers in /etc/resolv.conf and
/// may query them, so `pip install` can resolve its index; a session without
/// egress keeps the image's file and reaches no name server.
#[test]
fn egress_sessions_resolve_names_through_the_configured_name_server() {
    let world = World::new();
    let dns = world.serve_dns();
    let mut d = TestDaemon::start_with(&["--dns", World::ADDR]);
    let nat = run(d.create(&CreateSession {
        egress: Some("nat".into()),
        ..Default::default()
    }))
    .unwrap();
    let closed = run(d.create(&CreateSession::default())).unwrap();

    let (_, conf, _) = d.sh(&nat.id, "cat /etc/resolv.conf");
    assert_eq!(conf, format!("nameserver {}", World::ADDR));
    let (code, out, err) = d.sh(&nat.id, "getent hosts outside.test");
    assert_eq!(code, 0, "nat session could not resolve a name: {err}");
    assert!(out.starts_with(World::ADDR), "{out}");
    let (code, _, err) = d.sh(&nat.id, &connect_script("outside.test", PORT));
    assert_eq!(code, 0, "nat session -> outside world by name: {err}");

    let (_, conf, _) = d.sh(&closed.id, "cat /etc/resolv.conf");
    assert!(!conf.contains(World::ADDR), "{conf}");
    let (code, ..) = d.sh(
        &closed.id,
        &format!(
            "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1.5); s.sendto(b'x'*12, ('{}', 53)); s.recv(512)\"",
            World::ADDR
        ),
    );
    assert_ne!(code, 0, "a session without egress reached the name server");

    for s in [&nat, &closed] {
        run(d.rm(&s.id)).unwrap();
    }
    d.stop_and_check_leaks();
    drop(dns);
    world.finish();
}
