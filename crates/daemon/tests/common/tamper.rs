//! Archives rebuilt from a real export, changed or not, to test what an
//! import refuses: read its members, change one (or the manifest), pack them
//! again and seal them with a key (`archive::seal`).

#![allow(dead_code)]

use drums_checkpoint::archive;

/// One archive member, as read from a real export, to be packed again
/// (changed or not).
#[derive(Clone)]
pub struct Member {
    pub header: tar::Header,
    pub path: Vec<u8>,
    pub link: Option<Vec<u8>>,
    pub data: Vec<u8>,
    /// Pax records to write before it (its xattrs).
    pub pax: Vec<(String, Vec<u8>)>,
}

impl Member {
    pub fn new(kind: tar::EntryType, path: &[u8], mode: u32, data: &[u8]) -> Member {
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1);
        Member {
            header,
            path: path.to_vec(),
            link: None,
            data: data.to_vec(),
            pax: vec![],
        }
    }
}

/// Every member of an archive but its signature.
pub fn read_members(bytes: &[u8]) -> Vec<Member> {
    let mut a = tar::Archive::new(bytes);
    let mut out = Vec::new();
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path_bytes().into_owned();
        if path == archive::SIGNATURE_MEMBER.as_bytes() {
            continue;
        }
        let link = e.link_name_bytes().map(|l| l.into_owned());
        let mut pax = Vec::new();
        if let Some(x) = e.pax_extensions().unwrap() {
            for r in x {
                let r = r.unwrap();
                let k = r.key().unwrap().to_owned();
                if k.starts_with("SCHILY.xattr.") {
                    pax.push((k, r.value_bytes().to_vec()));
                }
            }
        }
        let header = e.header().clone();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        out.push(Member {
            header,
            path,
            link,
            data,
            pax,
        });
    }
    out
}

/// Pack members with no end-of-archive blocks (what [`archive::seal`] signs).
/// Short paths are written into the header as they are, so an absolute path
/// or a `..` reaches the archive unchanged.
pub fn pack(members: &[Member]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for m in members {
        if !m.pax.is_empty() {
            b.append_pax_extensions(m.pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))
                .unwrap();
        }
        let mut h = m.header.clone();
        h.set_size(m.data.len() as u64);
        if let Some(l) = &m.link {
            h.set_link_name_literal(l).unwrap();
        }
        if m.path.len() < 100 {
            let name = &mut h.as_old_mut().name;
            name.fill(0);
            name[..m.path.len()].copy_from_slice(&m.path);
            h.set_cksum();
            b.append(&h, m.data.as_slice()).unwrap();
        } else {
            let p = std::str::from_utf8(&m.path).unwrap();
            b.append_data(&mut h, p, m.data.as_slice()).unwrap();
        }
    }
    let mut bytes = b.into_inner().unwrap();
    bytes.truncate(bytes.len() - 1024);
    bytes
}

pub fn with_manifest(members: &[Member], f: impl FnOnce(&mut serde_json::Value)) -> Vec<Member> {
    let mut out = members.to_vec();
    let mut m: serde_json::Value = serde_json::from_slice(&out[0].data).unwrap();
    f(&mut m);
    out[0].data = serde_json::to_vec(&m).unwrap();
    out
}
