//! Finding the agent in a session from its connection to the proxy, so that
//! nobody has to mark it by hand (the inspector's agent marking).
//!
//! The proxy sees the connection's source address and port. In the
//! session's network namespace (`/proc/INIT/net/tcp`) that pair is one
//! socket, by inode; the process of the session holding that inode in its
//! file table is the agent. A connection handed to a child (a helper
//! process) names the child: the first holder in pid order is taken, which
//! for a forked client is the parent.

use std::net::SocketAddrV4;

/// The agent's pids: on the host (to watch it) and in the session (to mark it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Agent {
    pub host_pid: i32,
    pub ns_pid: i32,
}

/// The process among `pids` (host pids of the session's cgroup) that holds
/// the TCP connection from `from`, looked up in the network namespace of
/// `init` (host pid).
pub fn holder(init: i32, from: SocketAddrV4, pids: &[i32]) -> Option<Agent> {
    let table = std::fs::read_to_string(format!("/proc/{init}/net/tcp")).ok()?;
    let inode = socket_inode(&table, from)?;
    let link = format!("socket:[{inode}]");
    pids.iter().find_map(|&pid| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
        let holds = fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == link.as_str()));
        holds.then(|| {
            ns_pid(pid).map(|ns_pid| Agent {
                host_pid: pid,
                ns_pid,
            })
        })?
    })
}

/// The inode of the socket whose local end is `local` in a `/proc/net/tcp`
/// table (addresses as the kernel prints them: the IPv4 address as a native
/// endian u32 in hex, the port in hex).
fn socket_inode(table: &str, local: SocketAddrV4) -> Option<u64> {
    let want = format!(
        "{:08X}:{:04X}",
        u32::from_ne_bytes(local.ip().octets()),
        local.port()
    );
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode
        (f.get(1) == Some(&want.as_str()))
            .then(|| f.get(9)?.parse().ok())
            .flatten()
            .filter(|&i: &u64| i != 0)
    })
}

/// A host pid's pid in its own (innermost) pid namespace.
fn ns_pid(pid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// An IPv4 peer, or nothing (the bridge is IPv4 only).
pub fn v4(peer: std::net::SocketAddr) -> Option<SocketAddrV4> {
    match peer {
        std::net::SocketAddr::V4(a) => Some(a),
        std::net::SocketAddr::V6(a) => a
            .ip()
            .to_ipv4_mapped()
            .map(|ip| SocketAddrV4::new(ip, a.port())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};

    #[test]
    fn a_socket_is_found_by_its_local_end() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0 100 0 0 10 0\n   \
            1: 0200D70A:A1B2 0100D70A:1BA8 01 00000000:00000000 00:00000000 00000000     0        0 5678 1 0 20 4 30 10 -1\n";
        let a = SocketAddrV4::new(Ipv4Addr::new(10, 215, 0, 2), 0xA1B2);
        assert_eq!(socket_inode(table, a), Some(5678));
        let b = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 8080);
        assert_eq!(socket_inode(table, b), Some(1234));
        assert_eq!(
            socket_inode(table, SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 1)),
            None
        );
    }

    #[test]
    fn this_process_holds_its_own_connection() {
        // The test's own network namespace and process stand in for a
        // session's: the holder of a connection is found by its local end.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let _accepted = l.accept().unwrap();
        let from = v4(c.local_addr().unwrap()).unwrap();
        let me = std::process::id() as i32;
        let found = holder(me, from, &[me]).expect("found");
        assert_eq!(found.host_pid, me);
        assert!(found.ns_pid > 0);
        assert_eq!(
            holder(me, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1), &[me]),
            None
        );
    }
}
