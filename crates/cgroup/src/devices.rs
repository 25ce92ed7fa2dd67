//! Which devices a session may use, enforced by the kernel's devices
//! controller rather than by what its /dev happens to contain: a process that
//! makes a node for a disk with mknod (CAP_MKNOD is in runc's set) still
//! cannot open it.

/// What the devices controller lets a session do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Devices {
    /// runc's default allow-list ([`ALLOW_LIST`]); everything else refused.
    AllowList,
    /// Every device (a `--privileged` session).
    All,
}

/// runc's default rules, in the v1 `devices.allow` syntax: `mknod` of any
/// node (so images that ship device nodes unpack, and overlay whiteouts work),
/// and read/write only of the harmless character devices.
pub const ALLOW_LIST: &[&str] = &[
    "c *:* m",
    "b *:* m",
    "c 1:3 rwm",    // null
    "c 1:5 rwm",    // zero
    "c 1:7 rwm",    // full
    "c 1:8 rwm",    // random
    "c 1:9 rwm",    // urandom
    "c 5:0 rwm",    // tty
    "c 5:1 rwm",    // console
    "c 5:2 rwm",    // ptmx
    "c 136:* rwm",  // the session's own pseudo-terminals (devpts)
    "c 10:200 rwm", // tun
];

/// The writes that put `policy` into a v1 devices cgroup, in order: first
/// deny everything (`a`), then allow each rule.
pub fn v1_writes(policy: Devices) -> Vec<(&'static str, &'static str)> {
    match policy {
        Devices::All => vec![("devices.allow", "a")],
        Devices::AllowList => std::iter::once(("devices.deny", "a"))
            .chain(ALLOW_LIST.iter().map(|r| ("devices.allow", *r)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deny_comes_first_and_no_block_device_is_readable() {
        let w = v1_writes(Devices::AllowList);
        assert_eq!(w[0], ("devices.deny", "a"));
        assert!(w[1..].iter().all(|(f, _)| *f == "devices.allow"));
        for (_, rule) in &w[1..] {
            assert!(
                !(rule.starts_with('b') && rule.contains('r')),
                "{rule} opens block devices"
            );
        }
        assert_eq!(v1_writes(Devices::All), vec![("devices.allow", "a")]);
    }
}
