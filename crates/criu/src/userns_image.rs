//! Give a restore its own id range: rewrite the `userns-N.img` of a dump.
//!
//! CRIU restores a user namespace with the uid and gid maps it dumped. The
//! tasks' credentials are stored as ids inside the namespace, so changing
//! only the maps' host side (`lower_first`) restores the same tree as another
//! host range. drums gives each restored sibling a range of its own this way
//! (docs/security.md, "User namespace").
//!
//! The image is CRIU's usual framing (criu/include/magic.h,
//! images/userns.proto): two little-endian u32 magics, then one entry: a u32
//! size and a protobuf `UsernsEntry { repeated UidGidExtent uid_map = 1;
//! repeated UidGidExtent gid_map = 2; }`, `UidGidExtent { uint32 first = 1;
//! uint32 lower_first = 2; uint32 count = 3; }`. rust-criu ships only CRIU's
//! RPC protos, and the message is three integers, so it is read here by hand
//! and anything unexpected is refused rather than guessed at.

use std::path::Path;

use crate::CriuError;

/// CRIU's IMG_COMMON_MAGIC, then USERNS_MAGIC.
const MAGICS: [u32; 2] = [0x5456_4319, 0x5547_4906];

/// One line of a map, as CRIU stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub first: u32,
    pub lower_first: u32,
    pub count: u32,
}

/// The uid and gid maps of a user namespace image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsernsMaps {
    pub uid: Vec<Extent>,
    pub gid: Vec<Extent>,
}

fn bad(path: &Path, why: &str) -> CriuError {
    CriuError::Image {
        path: path.to_owned(),
        why: why.to_owned(),
    }
}

/// The file name of the user namespace image in `images`, if the dump has one
/// (a tree without a user namespace has none). More than one is refused:
/// CRIU does not dump nested user namespaces.
pub fn find(images: &Path) -> Result<Option<String>, CriuError> {
    let mut found = None;
    let rd = std::fs::read_dir(images).map_err(|source| CriuError::Io {
        op: "list",
        path: images.to_owned(),
        source,
    })?;
    for e in rd {
        let e = e.map_err(|source| CriuError::Io {
            op: "list",
            path: images.to_owned(),
            source,
        })?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("userns-") && name.ends_with(".img") {
            if found.is_some() {
                return Err(bad(images, "more than one user namespace image"));
            }
            found = Some(name);
        }
    }
    Ok(found)
}

pub fn read(path: &Path) -> Result<UsernsMaps, CriuError> {
    let bytes = std::fs::read(path).map_err(|source| CriuError::Io {
        op: "read",
        path: path.to_owned(),
        source,
    })?;
    decode(&bytes).map_err(|why| bad(path, why))
}

pub fn write(path: &Path, maps: &UsernsMaps) -> Result<(), CriuError> {
    std::fs::write(path, encode(maps)).map_err(|source| CriuError::Io {
        op: "write",
        path: path.to_owned(),
        source,
    })
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn varint(b: &[u8], pos: &mut usize) -> Result<u64, &'static str> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint too long")
}

fn decode(b: &[u8]) -> Result<UsernsMaps, &'static str> {
    if u32_at(b, 0) != Some(MAGICS[0]) || u32_at(b, 4) != Some(MAGICS[1]) {
        return Err("not a CRIU user namespace image (magic)");
    }
    let size = u32_at(b, 8).ok_or("truncated")? as usize;
    let entry = b.get(12..12 + size).ok_or("truncated entry")?;
    if b.len() != 12 + size {
        return Err("more than one entry");
    }
    let mut maps = UsernsMaps {
        uid: vec![],
        gid: vec![],
    };
    let mut pos = 0;
    while pos < entry.len() {
        let key = varint(entry, &mut pos)?;
        if key & 7 != 2 {
            return Err("unexpected field type");
        }
        let len = varint(entry, &mut pos)? as usize;
        let msg = entry.get(pos..pos + len).ok_or("truncated extent")?;
        pos += len;
        let ext = extent(msg)?;
        match key >> 3 {
            1 => maps.uid.push(ext),
            2 => maps.gid.push(ext),
            _ => return Err("unexpected field"),
        }
    }
    Ok(maps)
}

fn extent(msg: &[u8]) -> Result<Extent, &'static str> {
    let mut f = [None::<u32>; 3];
    let mut pos = 0;
    while pos < msg.len() {
        let key = varint(msg, &mut pos)?;
        let field = (key >> 3) as usize;
        if key & 7 != 0 || !(1..=3).contains(&field) {
            return Err("unexpected extent field");
        }
        let v = u32::try_from(varint(msg, &mut pos)?).map_err(|_| "id out of range")?;
        f[field - 1] = Some(v);
    }
    match f {
        [Some(first), Some(lower_first), Some(count)] => Ok(Extent {
            first,
            lower_first,
            count,
        }),
        _ => Err("an extent without all three fields"),
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn encode(maps: &UsernsMaps) -> Vec<u8> {
    let mut entry = Vec::new();
    for (field, list) in [(1u64, &maps.uid), (2, &maps.gid)] {
        for e in list {
            let mut msg = Vec::new();
            for (f, v) in [(1u64, e.first), (2, e.lower_first), (3, e.count)] {
                put_varint(&mut msg, f << 3);
                put_varint(&mut msg, u64::from(v));
            }
            put_varint(&mut entry, (field << 3) | 2);
            put_varint(&mut entry, msg.len() as u64);
            entry.extend_from_slice(&msg);
        }
    }
    let mut out = Vec::new();
    for m in MAGICS {
        out.extend_from_slice(&m.to_le_bytes());
    }
    out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
    out.extend_from_slice(&entry);
    out
}

/// The maps with every extent's host side moved from `from` to `to` (an
/// extent must lie in `from..from + count`, which is what a drums session's
/// single-extent map is).
pub fn rebase(maps: &UsernsMaps, from: u32, to: u32, count: u32) -> Option<UsernsMaps> {
    let move_all = |v: &[Extent]| {
        v.iter()
            .map(|e| {
                let off = e.lower_first.checked_sub(from)?;
                (off.checked_add(e.count)? <= count).then(|| Extent {
                    lower_first: to + off,
                    ..*e
                })
            })
            .collect::<Option<Vec<_>>>()
    };
    Some(UsernsMaps {
        uid: move_all(&maps.uid)?,
        gid: move_all(&maps.gid)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real CRIU 4.2.1 dump's image of a namespace mapped `0 100000 65536`.
    const DUMPED: &str = "194356540649475518000000\
                          0a0a080010a08d061880800412\
                          0a080010a08d0618808004";

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn a_real_image_reads_rebases_and_writes_back() {
        let bytes = hex(DUMPED);
        let maps = decode(&bytes).unwrap();
        let e = Extent {
            first: 0,
            lower_first: 100_000,
            count: 65536,
        };
        assert_eq!(maps.uid, vec![e]);
        assert_eq!(maps.gid, vec![e]);
        assert_eq!(encode(&maps), bytes, "written as CRIU wrote it");
        let moved = rebase(&maps, 100_000, 200_000, 65536).unwrap();
        assert_eq!(moved.uid[0].lower_first, 200_000);
        assert_eq!(decode(&encode(&moved)).unwrap(), moved);
        assert!(rebase(&maps, 100_001, 200_000, 65536).is_none());
    }

    #[test]
    fn anything_unexpected_is_refused() {
        let bytes = hex(DUMPED);
        let mut wrong_magic = bytes.clone();
        wrong_magic[4] ^= 1;
        assert!(decode(&wrong_magic).is_err());
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(decode(&extra).is_err());
    }
}
