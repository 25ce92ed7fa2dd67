//! Decoding the records the BPF programs write (layout in `src/bpf/inspect.h`).

use crate::bpf::types;

pub const EVENT_VERSION: u16 = 1;

pub const F_CREATED: u32 = 0x1;
pub const F_UNREADABLE: u32 = 0x2;
pub const F_TRUNCATED: u32 = 0x4;
pub const F_THREAD: u32 = 0x20;

/// What an event says happened; the numbers are `enum ev_op` in inspect.h.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    OpenWrite,
    Write,
    Truncate,
    Rename,
    Unlink,
    Rmdir,
    Mkdir,
    Mknod,
    Link,
    Symlink,
    Chmod,
    Chown,
    Xattr,
    Utimes,
    MmapShared,
    Ioctl,
    Opaque,
    MemWrite,
    Ipc,
    Fork,
    Exec,
    Exit,
}

impl Op {
    fn from_u16(n: u16) -> Option<Op> {
        Some(match n {
            1 => Op::OpenWrite,
            2 => Op::Write,
            3 => Op::Truncate,
            4 => Op::Rename,
            5 => Op::Unlink,
            6 => Op::Rmdir,
            7 => Op::Mkdir,
            8 => Op::Mknod,
            9 => Op::Link,
            10 => Op::Symlink,
            11 => Op::Chmod,
            12 => Op::Chown,
            13 => Op::Xattr,
            14 => Op::Utimes,
            15 => Op::MmapShared,
            16 => Op::Ioctl,
            17 => Op::Opaque,
            18 => Op::MemWrite,
            19 => Op::Ipc,
            32 => Op::Fork,
            33 => Op::Exec,
            34 => Op::Exit,
            _ => return None,
        })
    }

    /// The name reported in a file effect's `ops`.
    pub fn name(self) -> &'static str {
        match self {
            Op::OpenWrite => "open-write",
            Op::Write => "write",
            Op::Truncate => "truncate",
            Op::Rename => "rename",
            Op::Unlink => "unlink",
            Op::Rmdir => "rmdir",
            Op::Mkdir => "mkdir",
            Op::Mknod => "mknod",
            Op::Link => "link",
            Op::Symlink => "symlink",
            Op::Chmod => "chmod",
            Op::Chown => "chown",
            Op::Xattr => "xattr",
            Op::Utimes => "utimes",
            Op::MmapShared => "mmap-shared-write",
            Op::Ioctl => "ioctl",
            Op::Opaque => "opaque",
            Op::MemWrite => "memwrite",
            Op::Ipc => "ipc",
            Op::Fork => "fork",
            Op::Exec => "exec",
            Op::Exit => "exit",
        }
    }
}

/// One decoded event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub op: Op,
    pub flags: u32,
    pub cgroup: u64,
    pub epoch: u64,
    pub pid: u32,
    pub tgid: u32,
    pub ppid: u32,
    pub ret: i32,
    pub comm: String,
    /// The first and second path, as the session sees them ("/etc/x").
    pub path: Option<String>,
    pub path2: Option<String>,
}

impl Event {
    /// Whether every path in the event was read whole.
    pub fn certain(&self) -> bool {
        self.flags & (F_UNREADABLE | F_TRUNCATED) == 0
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("event of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("event format version {0}, expected {EVENT_VERSION}")]
    Version(u16),
    #[error("unknown event op {0}")]
    Op(u16),
    #[error("event fields overrun the record")]
    Overrun,
}

pub fn decode(buf: &[u8]) -> Result<Event, DecodeError> {
    let n = std::mem::size_of::<types::event_hdr>();
    if buf.len() < n {
        return Err(DecodeError::Short(buf.len()));
    }
    // SAFETY: the buffer holds at least a header's bytes; event_hdr is plain
    // integers, valid for any bit pattern, and read_unaligned needs no alignment.
    let h: types::event_hdr = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast()) };
    if h.version != EVENT_VERSION {
        return Err(DecodeError::Version(h.version));
    }
    let op = Op::from_u16(h.op).ok_or(DecodeError::Op(h.op))?;
    let mut fields: [&[u8]; 4] = [&[]; 4];
    let mut at = n;
    for (i, len) in h.lens.iter().enumerate() {
        let end = at + *len as usize;
        fields[i] = buf.get(at..end).ok_or(DecodeError::Overrun)?;
        at = end;
    }
    let comm: Vec<u8> = h
        .comm
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    let path_of = |name: &[u8], base: &[u8]| {
        (!name.is_empty() || !base.is_empty()).then(|| compose(name, base))
    };
    Ok(Event {
        op,
        flags: h.flags,
        cgroup: h.cgroup,
        epoch: h.epoch,
        pid: h.pid,
        tgid: h.tgid,
        ppid: h.ppid,
        ret: h.ret,
        comm: String::from_utf8_lossy(&comm).into_owned(),
        path: path_of(fields[0], fields[1]),
        path2: path_of(fields[2], fields[3]),
    })
}

/// A path from a name as given and the base it is relative to (components
/// from the leaf up, each NUL-terminated, ended by an empty one). "." and
/// empty components are dropped; ".." is kept, because only the kernel knows
/// what it crosses (a symlink, say), and the path is only ever looked up again
/// through the kernel, from the session's root.
pub fn compose(name: &[u8], base: &[u8]) -> String {
    let name = cstr(name);
    let mut parts: Vec<&[u8]> = Vec::new();
    if name.first() != Some(&b'/') {
        let mut up: Vec<&[u8]> = base
            .split(|b| *b == 0)
            .take_while(|c| !c.is_empty())
            .collect();
        up.reverse();
        parts.extend(up);
    }
    parts.extend(name.split(|b| *b == b'/'));
    let mut out = String::new();
    for p in parts {
        if p.is_empty() || p == b"." {
            continue;
        }
        out.push('/');
        out.push_str(&String::from_utf8_lossy(p));
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

fn cstr(b: &[u8]) -> &[u8] {
    b.split(|c| *c == 0).next().unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composes_paths_from_names_and_bases() {
        assert_eq!(compose(b"x\0", b"work\0home\0\0"), "/home/work/x");
        assert_eq!(compose(b"/etc/./a//b\0", b"work\0home\0\0"), "/etc/a/b");
        assert_eq!(compose(b"../y\0", b"d\0\0"), "/d/../y");
        // An operation on an open file: no name, the base is the file.
        assert_eq!(compose(b"\0", b"f.txt\0tmp\0\0"), "/tmp/f.txt");
        assert_eq!(compose(b"\0", b"\0"), "/");
        assert_eq!(compose(b"./\0", b"\0"), "/");
    }

    fn record(op: u16, lens: [u16; 4], data: &[u8]) -> Vec<u8> {
        let mut h = types::event_hdr {
            version: EVENT_VERSION,
            op,
            flags: F_CREATED,
            cgroup: 7,
            epoch: 3,
            pid: 11,
            tgid: 10,
            lens,
            ..Default::default()
        };
        for (d, s) in h.comm.iter_mut().zip(b"touch") {
            *d = *s as i8;
        }
        let n = std::mem::size_of::<types::event_hdr>();
        let mut v = vec![0u8; n];
        // SAFETY: v has exactly a header's bytes.
        unsafe { std::ptr::write_unaligned(v.as_mut_ptr().cast(), h) };
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn decodes_a_rename() {
        let data = b"a\0tmp\0\0/b\0\0";
        let ev = decode(&record(4, [2, 5, 3, 1], data)).unwrap();
        assert_eq!(ev.op, Op::Rename);
        assert_eq!(ev.path.as_deref(), Some("/tmp/a"));
        assert_eq!(ev.path2.as_deref(), Some("/b"));
        assert_eq!((ev.cgroup, ev.epoch, ev.pid, ev.tgid), (7, 3, 11, 10));
        assert_eq!(ev.comm, "touch");
        assert!(ev.certain());
    }

    #[test]
    fn refuses_bad_records() {
        assert_eq!(decode(&[0; 4]), Err(DecodeError::Short(4)));
        let mut r = record(4, [2, 0, 0, 0], b"a\0");
        assert_eq!(decode(&record(99, [0; 4], b"")), Err(DecodeError::Op(99)));
        assert_eq!(
            decode(&record(4, [9, 0, 0, 0], b"a\0")),
            Err(DecodeError::Overrun)
        );
        r[0] = 9;
        assert_eq!(decode(&r), Err(DecodeError::Version(9)));
    }
}
