//! An error and its sources on one line: the one place an error becomes
//! text, at the edges where it has to (an API error body, the CLI's
//! message, a log line, a report to drumsd on a pipe). Everywhere else an
//! error keeps its type and its source.

use std::error::Error;

/// "op: cause: cause": `e`, then each of its sources, joined with ": ".
///
/// A source whose text already ends the line is left out: an error that
/// prints its source in its own message (some crates' do) would otherwise
/// say it twice.
pub fn error_chain(e: &dyn Error) -> String {
    error_chain_map(e, str::to_owned)
}

/// [`error_chain`], with each part passed through `part` first (the guest
/// agent lowercases the OS's capitalised texts, as its API promises).
pub fn error_chain_map(e: &dyn Error, part: impl Fn(&str) -> String) -> String {
    let mut s = part(&e.to_string());
    let mut cur = e.source();
    while let Some(c) = cur {
        let m = part(&c.to_string());
        if !s.ends_with(&m) {
            s.push_str(": ");
            s.push_str(&m);
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("open /x")]
    struct Open(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("start")]
    struct Start(#[source] Open);

    /// Repeats its source in its own message, as some crates' errors do.
    #[derive(Debug, thiserror::Error)]
    #[error("read /y: {0}")]
    struct Loud(#[source] std::io::Error);

    /// ENOENT, whose text the OS capitalises.
    fn enoent() -> std::io::Error {
        std::io::Error::from_raw_os_error(2)
    }

    #[test]
    fn every_source_in_order() {
        assert_eq!(
            error_chain(&Start(Open(enoent()))),
            "start: open /x: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn a_source_already_said_is_not_repeated() {
        assert_eq!(
            error_chain(&Loud(enoent())),
            "read /y: No such file or directory (os error 2)"
        );
    }

    #[test]
    fn each_part_mapped() {
        let lower = |s: &str| s.to_lowercase();
        assert_eq!(
            error_chain_map(&Open(enoent()), lower),
            "open /x: no such file or directory (os error 2)"
        );
    }
}
