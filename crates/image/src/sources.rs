//! Finding the Debian mirror in the host's apt configuration.
//!
//! drums does not carry a mirror of its own: the host already knows where its
//! Debian packages come from (a local mirror, a proxy, a snapshot), and
//! building images from the same place is what works on that machine.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::ImageError;

/// The Debian mirror URI for `suite` (e.g. "bookworm") from this machine's apt
/// sources.
///
/// Looks at deb822 files `/etc/apt/sources.list.d/*.sources` first (the
/// default format since bookworm), then the one-line `/etc/apt/sources.list`,
/// then one-line `/etc/apt/sources.list.d/*.list`. Within each, files are read
/// in name order and the first `deb` (not `deb-src`) entry whose suites include
/// `suite` wins. Security archives are skipped: they only carry updates, not a
/// full suite debootstrap could install from.
pub fn mirror_from_apt_sources(suite: &str) -> Result<String, ImageError> {
    mirror_from_apt_dir(Path::new("/etc/apt"), suite)
}

/// [`mirror_from_apt_sources`] with the apt configuration directory as a
/// parameter, so tests can point it at sample files.
pub(crate) fn mirror_from_apt_dir(etc_apt: &Path, suite: &str) -> Result<String, ImageError> {
    let list_d = etc_apt.join("sources.list.d");
    for path in files_with_extension(&list_d, "sources")? {
        if let Some(text) = read_source_file(&path)? {
            if let Some(uri) = parse_deb822(&text, suite).into_iter().next() {
                return Ok(uri);
            }
        }
    }
    let mut one_line = vec![etc_apt.join("sources.list")];
    one_line.extend(files_with_extension(&list_d, "list")?);
    for path in one_line {
        if let Some(text) = read_source_file(&path)? {
            if let Some(uri) = parse_one_line(&text, suite).into_iter().next() {
                return Ok(uri);
            }
        }
    }
    Err(ImageError::NoMirror {
        suite: suite.to_string(),
    })
}

/// Files in `dir` named `*.<ext>`, sorted by name (apt's own order). A missing
/// directory is simply empty. Names like `x.list.disabled` do not match, just
/// as apt ignores them.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, ImageError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(ImageError::io("read directory", dir, e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| ImageError::io("read directory", dir, e))?;
        let path = entry.path();
        if path.extension().is_some_and(|e| e == ext) && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// The file's text, or `None` if it does not exist.
fn read_source_file(path: &Path) -> Result<Option<String>, ImageError> {
    match fs::read(path) {
        // Lossy: a stray non-UTF-8 byte in a comment should not hide the mirror.
        Ok(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ImageError::io("read apt source file", path, e)),
    }
}

/// Mirror URIs for `suite` in a deb822 `.sources` file, in file order.
pub(crate) fn parse_deb822(text: &str, suite: &str) -> Vec<String> {
    let mut uris = Vec::new();
    for stanza in deb822_stanzas(text) {
        let field = |name: &str| -> &str {
            stanza
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map_or("", |(_, v)| v.as_str())
        };
        if field("Enabled").trim().eq_ignore_ascii_case("no") {
            continue;
        }
        if !field("Types").split_whitespace().any(|t| t == "deb") {
            continue;
        }
        if !field("Suites").split_whitespace().any(|s| s == suite) {
            continue;
        }
        uris.extend(
            field("URIs")
                .split_whitespace()
                .filter(|u| usable_uri(u))
                .map(|u| u.trim_end_matches('/').to_string()),
        );
    }
    uris
}

/// Splits deb822 text into stanzas of (field, value). Stanzas are separated
/// by blank lines, `#` lines are comments, and lines starting with whitespace
/// continue the previous field's value.
fn deb822_stanzas(text: &str) -> Vec<Vec<(String, String)>> {
    let mut stanzas = Vec::new();
    let mut current: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            if !current.is_empty() {
                stanzas.push(std::mem::take(&mut current));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        if line.starts_with([' ', '\t']) {
            if let Some((_, value)) = current.last_mut() {
                value.push(' ');
                value.push_str(line.trim());
            }
            continue;
        }
        if let Some((key, value)) = line.split_once(':') {
            current.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    if !current.is_empty() {
        stanzas.push(current);
    }
    stanzas
}

/// Mirror URIs for `suite` in one-line `sources.list` text, in file order:
/// `deb [ options ] uri suite [component...]`.
pub(crate) fn parse_one_line(text: &str, suite: &str) -> Vec<String> {
    let mut uris = Vec::new();
    for line in text.lines() {
        // Everything after '#' is a comment.
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("deb") else {
            continue;
        };
        // "deb-src" and "debfoo" are not binary sources.
        if !rest.starts_with([' ', '\t']) {
            continue;
        }
        let mut rest = rest.trim_start();
        // Options may contain spaces: "[ arch=amd64 signed-by=/x ]".
        if rest.starts_with('[') {
            let Some(end) = rest.find(']') else {
                continue;
            };
            rest = &rest[end + 1..];
        }
        let mut words = rest.split_whitespace();
        let (Some(uri), Some(line_suite)) = (words.next(), words.next()) else {
            continue;
        };
        if line_suite == suite && usable_uri(uri) {
            uris.push(uri.trim_end_matches('/').to_string());
        }
    }
    uris
}

/// A URI debootstrap can fetch a whole suite from: a scheme it supports
/// (apt-only schemes such as `mirror+file:`, `tor+http:` or `cdrom:` are not),
/// and not a security archive.
fn usable_uri(uri: &str) -> bool {
    let lower = uri.to_ascii_lowercase();
    let Some((scheme, rest)) = lower.split_once(':') else {
        return false;
    };
    if !matches!(scheme, "http" | "https" | "ftp" | "file") {
        return false;
    }
    let rest = rest.trim_start_matches('/');
    let (host, path) = if scheme == "file" {
        ("", rest)
    } else {
        rest.split_once('/').unwrap_or((rest, ""))
    };
    // Host part may carry credentials or a port: user@security.example:80.
    let host = host.rsplit('@').next().unwrap_or(host);
    let is_security = host.starts_with("security.")
        || path
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .is_some_and(|last| last.ends_with("-security"));
    !is_security
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEB822: &str = "\
Types: deb
URIs: http://mirror.invalid/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm-security
Components: main
";

    #[test]
    fn deb822_basic() {
        assert_eq!(
            parse_deb822(DEB822, "bookworm"),
            vec!["http://mirror.invalid/debian"]
        );
        // The updates suite is matched exactly, not as a prefix.
        assert_eq!(
            parse_deb822(DEB822, "bookworm-updates"),
            vec!["http://mirror.invalid/debian"]
        );
        assert!(parse_deb822(DEB822, "trixie").is_empty());
    }

    #[test]
    fn deb822_security_only_stanzas_are_skipped() {
        let text = "\
Types: deb
URIs: http://mirror.invalid/debian-security
Suites: bookworm bookworm-security
Components: main

Types: deb
URIs: http://security.mirror.invalid/debian/
Suites: bookworm
Components: main

Types: deb
URIs: http://mirror.invalid/debian/
Suites: bookworm
";
        assert_eq!(
            parse_deb822(text, "bookworm"),
            vec!["http://mirror.invalid/debian"]
        );
        assert!(parse_deb822(text, "bookworm-security")
            .iter()
            .all(|u| !u.contains("security")));
    }

    #[test]
    fn deb822_multiple_uris_comments_continuations_and_types() {
        let text = "\
# leading comment
Types: deb-src
URIs: http://src.mirror.invalid/debian
Suites: bookworm

Types: deb-src deb
URIs: mirror+file:/etc/apt/mirrors.txt
 http://one.mirror.invalid/debian
# comment inside a stanza
 http://two.mirror.invalid/debian
Suites:
 bookworm
Components: main

Types: deb
Enabled: no
URIs: http://disabled.mirror.invalid/debian
Suites: bookworm
";
        assert_eq!(
            parse_deb822(text, "bookworm"),
            vec![
                "http://one.mirror.invalid/debian",
                "http://two.mirror.invalid/debian"
            ]
        );
    }

    #[test]
    fn deb822_field_names_are_case_insensitive() {
        let text = "types: deb\nuris: https://mirror.invalid/debian\nsuites: bookworm\n";
        assert_eq!(
            parse_deb822(text, "bookworm"),
            vec!["https://mirror.invalid/debian"]
        );
    }

    #[test]
    fn one_line_format() {
        let text = "\
# deb http://commented.mirror.invalid/debian bookworm main
deb-src http://src.mirror.invalid/debian bookworm main
deb http://mirror.invalid/debian-security bookworm-security main
deb http://security.mirror.invalid/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] http://first.mirror.invalid/debian/ bookworm main contrib
deb [ trusted=yes ] file:///srv/debian bookworm main # trailing comment
deb http://other.mirror.invalid/debian trixie main
";
        assert_eq!(
            parse_one_line(text, "bookworm"),
            vec!["http://first.mirror.invalid/debian", "file:///srv/debian"]
        );
        assert_eq!(
            parse_one_line(text, "trixie"),
            vec!["http://other.mirror.invalid/debian"]
        );
        assert!(parse_one_line(text, "bookworm-security").is_empty());
    }

    #[test]
    fn apt_dir_prefers_deb822_then_sources_list_then_list_d() {
        let tmp = tempfile::tempdir().unwrap();
        let etc = tmp.path();
        let d = etc.join("sources.list.d");
        fs::create_dir(&d).unwrap();

        assert!(matches!(
            mirror_from_apt_dir(etc, "bookworm"),
            Err(ImageError::NoMirror { .. })
        ));

        fs::write(
            d.join("z.list"),
            "deb http://listd.mirror.invalid/debian bookworm main\n",
        )
        .unwrap();
        assert_eq!(
            mirror_from_apt_dir(etc, "bookworm").unwrap(),
            "http://listd.mirror.invalid/debian"
        );

        fs::write(
            etc.join("sources.list"),
            "deb http://oneline.mirror.invalid/debian bookworm main\n",
        )
        .unwrap();
        assert_eq!(
            mirror_from_apt_dir(etc, "bookworm").unwrap(),
            "http://oneline.mirror.invalid/debian"
        );

        // Disabled files are ignored, like apt does.
        fs::write(d.join("a.sources.disabled"), DEB822).unwrap();
        // A security-only deb822 file does not stop the search.
        fs::write(
            d.join("b.sources"),
            "Types: deb\nURIs: http://mirror.invalid/debian-security\nSuites: bookworm-security\n",
        )
        .unwrap();
        assert_eq!(
            mirror_from_apt_dir(etc, "bookworm").unwrap(),
            "http://oneline.mirror.invalid/debian"
        );

        fs::write(d.join("c.sources"), DEB822).unwrap();
        assert_eq!(
            mirror_from_apt_dir(etc, "bookworm").unwrap(),
            "http://mirror.invalid/debian"
        );
    }

    #[test]
    fn usable_uri_schemes() {
        assert!(usable_uri("http://mirror.invalid/debian"));
        assert!(usable_uri("https://user@mirror.invalid:8080/debian"));
        assert!(usable_uri("file:/srv/debian"));
        assert!(!usable_uri("cdrom:[Debian]/"));
        assert!(!usable_uri("tor+http://mirror.invalid/debian"));
        assert!(!usable_uri("https://user@security.mirror.invalid/debian"));
        assert!(!usable_uri("http://mirror.invalid/debian-security/"));
    }
}
