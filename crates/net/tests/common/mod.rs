//! The fixture the drums-net tests share: a bridge, session namespaces held by
//! `sleep` children, and a leak check of links and nft tables at the end.
//! Traffic only ever goes to the test's own 10.254.x.0/24 addresses (and, in
//! the egress test, the documentation ranges) inside namespaces these tests
//! create.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::hash_map::RandomState;
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use drums_net::rtnetlink;
use drums_net::{Net, NetError, VethSpec};
use nix::sched::{setns, unshare, CloneFlags};

pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// A /24 under 10.254.0.0/16 that no other test of this run uses.
pub fn next_subnet_octet() -> u8 {
    static START: OnceLock<u8> = OnceLock::new();
    static NEXT: AtomicU8 = AtomicU8::new(0);
    let start = *START.get_or_init(|| (random_u64() % 200) as u8);
    start + NEXT.fetch_add(1, Ordering::Relaxed) % 50 + 1
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs `f` on a thread that joined the network namespace of `pid`; sockets it
/// creates stay in that namespace.
pub fn in_ns_blocking<T: Send + 'static>(pid: i32, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let ns = File::open(format!("/proc/{pid}/ns/net")).unwrap();
        setns(&ns, CloneFlags::CLONE_NEWNET).unwrap();
        f()
    })
    .join()
    .unwrap()
}

pub struct Fixture {
    pub prefix: String,
    pub bridge: String,
    pub octet: u8,
    pub children: Vec<Child>,
    /// Sockets inside session namespaces keep those namespaces (and their
    /// veths) alive, so they are dropped before the leak check.
    pub listeners: Vec<TcpListener>,
    pub finished: bool,
}

impl Fixture {
    pub fn new() -> Fixture {
        // "drumst" + 6 hex = 12 chars; links are prefix + 2 chars <= 15.
        let prefix = format!("drumst{:06x}", random_u64() & 0xff_ffff);
        Fixture {
            bridge: format!("{prefix}br"),
            prefix,
            octet: next_subnet_octet(),
            children: Vec::new(),
            listeners: Vec::new(),
            finished: false,
        }
    }

    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 254, self.octet, 1)
    }

    pub fn ip(&self, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 254, self.octet, host)
    }

    /// Starts a `sleep` that is in a fresh network namespace by the time this
    /// returns (the unshare happens before exec, and spawn waits for exec).
    pub fn spawn_session(&mut self) -> i32 {
        let mut cmd = Command::new("sleep");
        cmd.arg("60")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: the closure runs in the forked child before exec and only
        // makes the unshare(2) system call, which is async-signal-safe and
        // does not allocate or take locks.
        unsafe {
            cmd.pre_exec(|| unshare(CloneFlags::CLONE_NEWNET).map_err(io::Error::from));
        }
        let child = cmd.spawn().expect("spawn sleep in new netns");
        let pid = child.id() as i32;
        self.children.push(child);
        pid
    }

    pub fn spec(&self, suffix: &str, pid: i32, host: u8, egress: bool) -> VethSpec {
        VethSpec {
            host_name: format!("{}{suffix}", self.prefix),
            bridge: self.bridge.clone(),
            netns_pid: pid,
            mac: [0x02, 0xd7, 0x00, 0x00, self.octet, host],
            ip: self.ip(host),
            prefix: 24,
            gateway: self.gateway(),
            egress,
            listed: false,
        }
    }

    /// Kills the children, deletes the bridge, and waits for the session
    /// namespaces (and with them the veths) to go away. Returns the links with
    /// the test's prefix that were still there; those are then deleted so a
    /// failing test does not litter the host.
    pub fn cleanup(&mut self) -> Vec<String> {
        self.finished = true;
        self.listeners.clear();
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
        runtime().block_on(async {
            let net = Net::new().await.expect("netlink connection for cleanup");
            net.delete_link(&self.bridge).await.expect("delete bridge");
            drums_net::firewall::remove(&self.bridge).expect("remove firewall");
            // Namespace teardown after the last process exits is done by the
            // kernel asynchronously, so give the veths a moment to vanish.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let left = net.links_with_prefix(&self.prefix).await.unwrap();
                if left.is_empty() || Instant::now() > deadline {
                    for name in &left {
                        let _ = net.delete_link(name).await;
                    }
                    return left;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    }

    /// Cleans up and asserts that nothing leaked.
    pub fn finish(mut self) {
        let left = self.cleanup();
        assert!(left.is_empty(), "links leaked on the host: {left:?}");
        let tables = drums_net::firewall::tables().expect("list nft tables");
        let ours = drums_net::firewall::table_name(&self.bridge);
        assert!(
            !tables.iter().any(|(_, name)| *name == ours),
            "nft tables leaked: {tables:?}"
        );
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if !self.finished {
            let left = self.cleanup();
            if !left.is_empty() {
                eprintln!("links leaked on the host (deleted now): {left:?}");
            }
        }
    }
}

pub fn netlink_err(op: &'static str) -> impl FnOnce(rtnetlink::Error) -> NetError {
    move |source| NetError::Netlink {
        op,
        link: "test".into(),
        source,
    }
}
