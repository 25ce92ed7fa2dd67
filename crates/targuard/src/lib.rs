//! A tar stream from a stranger, bounded before the `tar` crate reads it.
//!
//! The `tar` crate reads a GNU long name or long link (`L`, `K`) and a PAX
//! extended header (`x`) whole into memory before it hands out the entry
//! they describe, whatever size their header claims. Zeros compress a
//! thousandfold, so a 10 MB layer can make drumsd allocate 10 GiB: every
//! archive drums reads (image layers, image archives, checkpoint archives
//! before their signature is checked) comes from someone else.
//!
//! [`Guard`] sits between the bytes and the `tar` crate and walks the same
//! block structure the crate walks: a 512-byte header, then the entry's
//! data rounded up to a block. It refuses an extension header (`L`, `K`,
//! `x`, `g`) whose size is over [`MAX_EXTENSION_BYTES`] *before* a byte of
//! its data is passed on, and a GNU sparse entry, whose extra headers it
//! does not follow (no image or checkpoint drums reads has one). To stay
//! in step it applies a PAX `size` record to the next entry as the crate
//! does, and stops looking at the first all-zero header, where the crate
//! stops reading entries. Everything else (checksums, paths, types) is
//! still the crate's and its caller's to check: the guard only bounds what
//! can be asked of memory.

use std::io::{self, Read};

/// The largest extension header accepted: a PAX header holds a path, a
/// link target and a file's extended attributes (at most 64 KiB each on
/// Linux), so a megabyte leaves room for any real one.
pub const MAX_EXTENSION_BYTES: u64 = 1 << 20;

const BLOCK: usize = 512;

/// Reads through `inner`, refusing what the `tar` crate would read whole
/// past [`MAX_EXTENSION_BYTES`] (see the crate documentation).
pub struct Guard<R> {
    inner: R,
    limit: u64,
    state: State,
    /// The header being read, and how much of it has come.
    header: [u8; BLOCK],
    have: usize,
    /// A PAX local header's data, collected (bounded) to find its `size`.
    pax: Option<Vec<u8>>,
    /// The `size` a PAX header gave the next entry that is not itself an
    /// extension header.
    pending_size: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a header block.
    Header,
    /// Inside an entry's data (and its padding): bytes left.
    Data(u64),
    /// Past the end-of-archive marker, or past a header the crate itself
    /// will refuse: bytes pass unexamined.
    Done,
}

impl<R> Guard<R> {
    pub fn new(inner: R) -> Guard<R> {
        Guard::with_limit(inner, MAX_EXTENSION_BYTES)
    }

    /// With another bound than [`MAX_EXTENSION_BYTES`] (for tests).
    pub fn with_limit(inner: R, limit: u64) -> Guard<R> {
        Guard {
            inner,
            limit,
            state: State::Header,
            header: [0; BLOCK],
            have: 0,
            pax: None,
            pending_size: None,
        }
    }

    pub fn into_inner(self) -> R {
        self.inner
    }

    pub fn get_ref(&self) -> &R {
        &self.inner
    }

    /// Walk `bytes`, just read, through the block structure.
    fn walk(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            match self.state {
                State::Done => return Ok(()),
                State::Data(left) => {
                    let n = (left.min(bytes.len() as u64)) as usize;
                    if let Some(p) = self.pax.as_mut() {
                        // Bounded: the header's size was checked.
                        p.extend_from_slice(&bytes[..n]);
                    }
                    bytes = &bytes[n..];
                    let left = left - n as u64;
                    self.state = State::Data(left);
                    if left == 0 {
                        self.data_done();
                    }
                }
                State::Header => {
                    let n = (BLOCK - self.have).min(bytes.len());
                    self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                    self.have += n;
                    bytes = &bytes[n..];
                    if self.have == BLOCK {
                        self.have = 0;
                        self.header_done()?;
                    }
                }
            }
        }
        Ok(())
    }

    fn header_done(&mut self) -> io::Result<()> {
        let h = &self.header;
        if h.iter().all(|b| *b == 0) {
            // The crate ends its entries here (it does not ignore zeros).
            self.state = State::Done;
            return Ok(());
        }
        // The crate refuses a size it cannot parse as well.
        let size = entry_size(&h[124..136]).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a tar header with an unreadable size",
            )
        })?;
        let kind = h[156];
        let extension = matches!(kind, b'L' | b'K' | b'x' | b'g');
        if extension && size > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a tar extension header (type {:?}) of {size} bytes, over the limit of {}",
                    kind as char, self.limit
                ),
            ));
        }
        if kind == b'S' {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a GNU sparse tar entry, which drums does not read",
            ));
        }
        // The crate reads a PAX header as one only in a ustar or GNU header;
        // in another it is an ordinary entry, and its records apply to nothing.
        let recognized = &h[257..265] == b"ustar\x0000" || &h[257..265] == b"ustar  \x00";
        let size = if extension {
            size
        } else {
            self.pending_size.take().unwrap_or(size)
        };
        if kind == b'x' && recognized {
            self.pax = Some(Vec::with_capacity(size as usize));
        }
        let padded = size
            .checked_add(BLOCK as u64 - 1)
            .map(|s| s & !(BLOCK as u64 - 1))
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "tar entry size overflow"))?;
        self.state = State::Data(padded);
        if padded == 0 {
            self.data_done();
        }
        Ok(())
    }

    fn data_done(&mut self) {
        self.state = State::Header;
        if let Some(p) = self.pax.take() {
            if let Some(s) = pax_size(&p) {
                self.pending_size = Some(s);
            }
        }
    }
}

impl<R: Read> Read for Guard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.walk(&buf[..n])?;
        Ok(n)
    }
}

/// A header's size field exactly as the `tar` crate reads it (`octal_from`,
/// `numeric_extended_from`): big-endian base-256 in the last 8 bytes when
/// the first byte's high bit is set; else octal text up to the first NUL,
/// trimmed. Any difference would let an entry's data pass as headers.
fn entry_size(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        let mut v = 0u64;
        for b in &field[field.len() - 8..] {
            v = (v << 8) | u64::from(*b);
        }
        return Some(v);
    }
    let text = match field.iter().position(|b| *b == 0) {
        Some(i) => &field[..i],
        None => field,
    };
    u64::from_str_radix(std::str::from_utf8(text).ok()?.trim(), 8).ok()
}

/// The `size` record of PAX data exactly as the `tar` crate takes it
/// (`pax_extensions_value`): records are lines, each `LEN KEY=VALUE` with
/// LEN counting its newline; an empty line ends them; a malformed record
/// before the first `size`, or a `size` that is not a number, gives none.
fn pax_size(data: &[u8]) -> Option<u64> {
    for line in data.split(|b| *b == b'\n') {
        if line.is_empty() {
            return None;
        }
        let sp = line.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&line[..sp]).ok()?.parse().ok()?;
        if line.len() + 1 != len {
            return None;
        }
        let rec = &line[sp + 1..];
        let eq = rec.iter().position(|b| *b == b'=')?;
        if &rec[..eq] != b"size" {
            continue;
        }
        return std::str::from_utf8(&rec[eq + 1..]).ok()?.parse().ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(path: &str, kind: tar::EntryType, size: u64) -> tar::Header {
        let mut h = tar::Header::new_ustar();
        h.set_path(path).unwrap();
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_cksum();
        h
    }

    /// An archive with an extension header of `size` zero bytes, then a
    /// file: the shape of the bombs.
    fn bomb(kind: tar::EntryType, size: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.resize(out.len() + (size as usize).div_ceil(BLOCK) * BLOCK, 0);
        let f = header("f", tar::EntryType::Regular, 3);
        out.extend_from_slice(f.as_bytes());
        out.extend_from_slice(b"abc");
        out.resize(out.len() + BLOCK - 3 + 2 * BLOCK, 0);
        out
    }

    fn names(r: impl Read) -> io::Result<Vec<String>> {
        let mut a = tar::Archive::new(r);
        let mut out = Vec::new();
        for e in a.entries()? {
            let mut e = e?;
            let mut s = String::new();
            e.read_to_string(&mut s)?;
            out.push(format!("{}={s}", e.path()?.display()));
        }
        Ok(out)
    }

    #[test]
    fn an_extension_header_over_the_limit_is_refused_before_it_is_read() {
        for kind in [
            tar::EntryType::GNULongName,
            tar::EntryType::GNULongLink,
            tar::EntryType::XHeader,
            tar::EntryType::XGlobalHeader,
        ] {
            let b = bomb(kind, 4096);
            let err = names(Guard::with_limit(&b[..], 4095)).unwrap_err();
            assert!(
                err.to_string().contains("over the limit of 4095"),
                "{kind:?}: {err}"
            );
            // At the limit it passes on to the crate.
            assert!(names(Guard::with_limit(&b[..], 4096)).is_ok(), "{kind:?}");
        }
    }

    /// The guard refuses in the header, so the reader never gets the
    /// extension's data: a 10 GiB header costs one block of reading.
    #[test]
    fn a_huge_header_is_refused_after_one_block() {
        struct Zeros(u64);
        impl Read for Zeros {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = (buf.len() as u64).min(self.0) as usize;
                buf[..n].fill(0);
                self.0 -= n as u64;
                Ok(n)
            }
        }
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::XHeader);
        h.set_size(10 << 30);
        h.set_cksum();
        let r = h.as_bytes().chain(Zeros(10 << 30));
        let mut g = Guard::new(r);
        let mut buf = vec![0u8; 64 << 10];
        let mut read = 0u64;
        let err = loop {
            match g.read(&mut buf) {
                Ok(0) => panic!("the whole header was read"),
                Ok(n) => read += n as u64,
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("over the limit"), "{err}");
        assert!(read < 1 << 20, "{read} bytes read before the refusal");
    }

    #[test]
    fn long_names_pax_and_sizes_pass_as_the_crate_reads_them() {
        let long = "d/".repeat(200) + "file";
        let mut b = tar::Builder::new(Vec::new());
        // A GNU long name.
        let mut h = tar::Header::new_gnu();
        h.set_size(5);
        h.set_mode(0o644);
        b.append_data(&mut h, &long, &b"hello"[..]).unwrap();
        // A PAX header with a size record that matches, and one with a path.
        b.append_pax_extensions([("size", &b"2"[..]), ("path", long.as_bytes())])
            .unwrap();
        let mut h = header("short", tar::EntryType::Regular, 2);
        h.set_cksum();
        b.append(&h, &b"hi"[..]).unwrap();
        let mut h = header("empty", tar::EntryType::Regular, 0);
        h.set_cksum();
        b.append(&h, &b""[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let plain = names(&bytes[..]).unwrap();
        let guarded = names(Guard::new(&bytes[..])).unwrap();
        assert_eq!(plain, guarded);
        assert_eq!(
            guarded,
            [
                format!("{long}=hello"),
                format!("{long}=hi"),
                "empty=".into()
            ]
        );
    }

    /// A PAX `size` moves where the next header is: the guard must follow
    /// it, or a bomb after it would pass unseen.
    #[test]
    fn a_pax_size_is_followed_to_the_next_header() {
        let pax = b"13 size=1024\n";
        let mut out = Vec::new();
        out.extend_from_slice(header("pax", tar::EntryType::XHeader, pax.len() as u64).as_bytes());
        out.extend_from_slice(pax);
        out.resize(2 * BLOCK, 0);
        // The header says 0; the PAX record says 1024 bytes follow, which
        // look like a header of a small entry but are data.
        out.extend_from_slice(header("f", tar::EntryType::Regular, 0).as_bytes());
        out.extend_from_slice(header("looks-like-a-header", tar::EntryType::Regular, 0).as_bytes());
        out.extend_from_slice(&[b'x'; 512]);
        out.extend_from_slice(&bomb(tar::EntryType::GNULongName, 8192));
        let err = names(Guard::with_limit(&out[..], 4096)).unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
        // The crate agrees on where the entries are.
        let plain = names(&out[..]).unwrap();
        assert_eq!(plain.len(), 2, "{plain:?}");
        assert!(plain[0].starts_with("f="), "{plain:?}");
    }

    #[test]
    fn sparse_entries_are_refused() {
        let mut h = tar::Header::new_gnu();
        h.set_path("s").unwrap();
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_size(0);
        h.set_cksum();
        let mut out = h.as_bytes().to_vec();
        out.resize(4 * BLOCK, 0);
        let err = names(Guard::new(&out[..])).unwrap_err();
        assert!(err.to_string().contains("sparse"), "{err}");
    }

    #[test]
    fn sizes_parse_as_the_crate_parses_them() {
        assert_eq!(entry_size(b"00000001750\0"), Some(1000));
        assert_eq!(entry_size(b"   1750 \0 7\0"), Some(1000));
        let mut b256 = [0u8; 12];
        b256[0] = 0x80;
        b256[11] = 7;
        b256[10] = 1;
        assert_eq!(entry_size(&b256), Some(263));
        assert_eq!(entry_size(b"zz\0\0\0\0\0\0\0\0\0\0"), None);
        assert_eq!(pax_size(b"11 size=42\n"), Some(42));
        assert_eq!(pax_size(b"12 path=abc\n11 size=42\n"), Some(42));
        assert_eq!(pax_size(b"99 size=42\n"), None);
        assert_eq!(pax_size(b"11 size=4x\n11 size=42\n"), None);
    }
}
