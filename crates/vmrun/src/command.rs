//! vmrun's command line: `vmrun [-T ws|fusion|player] COMMAND ARGS...`.
//!
//! Not clap: vmrun's grammar is positional with case-insensitive command
//! names and bare keywords (`nogui`, `hard`, `-wait`), and the forms OSWorld
//! uses must parse exactly as VMware's vmrun parses them. drums' own
//! connection options (`--state-dir`, `--socket`, `--no-autostart`, also
//! from the environment) may precede the command; they are handed to clap
//! through the CLI's `Global` so both programs read them alike.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// The host type of `-T`. All are served by the local drumsd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostType {
    Ws,
    Fusion,
    Player,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `list`
    List,
    /// `start VMX [gui|nogui]`; drums has no window to show, so both are the same.
    Start { vmx: PathBuf, gui: bool },
    /// `getGuestIPAddress VMX [-wait]`
    GetGuestIpAddress { vmx: PathBuf, wait: bool },
    /// `snapshot VMX NAME`
    Snapshot { vmx: PathBuf, name: String },
    /// `revertToSnapshot VMX NAME`
    RevertToSnapshot { vmx: PathBuf, name: String },
    /// `stop VMX [hard|soft]`; both remove the session.
    Stop { vmx: PathBuf, hard: bool },
}

impl Command {
    /// vmrun's spelling, for messages.
    pub fn verb(&self) -> &'static str {
        match self {
            Command::List => "list",
            Command::Start { .. } => "start",
            Command::GetGuestIpAddress { .. } => "getGuestIPAddress",
            Command::Snapshot { .. } => "snapshot",
            Command::RevertToSnapshot { .. } => "revertToSnapshot",
            Command::Stop { .. } => "stop",
        }
    }

    pub fn vmx(&self) -> Option<&PathBuf> {
        match self {
            Command::List => None,
            Command::Start { vmx, .. }
            | Command::GetGuestIpAddress { vmx, .. }
            | Command::Snapshot { vmx, .. }
            | Command::RevertToSnapshot { vmx, .. }
            | Command::Stop { vmx, .. } => Some(vmx),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub host: HostType,
    /// drums connection options, as `drums` spells them, for clap.
    pub drums_args: Vec<String>,
    pub command: Command,
}

pub const USAGE: &str = "\
vmrun (drums): the subset of VMware's vmrun that OSWorld uses, backed by drumsd

Usage: vmrun [-T ws|fusion|player] COMMAND [PARAMETERS]

  list                                  running VMs: a count, then one .vmx path a line
  start            PATH.vmx [gui|nogui] create the drums session the .vmx names
  getGuestIPAddress PATH.vmx [-wait]    the session's IP address
  snapshot         PATH.vmx NAME        checkpoint the session, keep it running
  revertToSnapshot PATH.vmx NAME        replace the session with a restore of NAME
  stop             PATH.vmx [hard|soft] remove the session

drums options (before COMMAND): --state-dir DIR (DRUMS_STATE_DIR),
  --socket PATH (DRUMS_SOCKET), --no-autostart (DRUMS_NO_AUTOSTART).
Registry of .vmx paths: DRUMS_VMRUN_REGISTRY (default: beside the state dir).
See docs/vmrun.md.";

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// Parse the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Invocation, UsageError> {
    let mut host = HostType::Ws;
    let mut drums_args = Vec::new();
    let mut i = 0;
    // Options come before the command, as in vmrun.
    while let Some(a) = args.get(i) {
        let value = |i: usize| {
            args.get(i + 1)
                .cloned()
                .ok_or_else(|| usage(format!("{a} needs a value")))
        };
        match a.as_str() {
            "-T" => {
                host = match value(i)?.to_ascii_lowercase().as_str() {
                    "ws" => HostType::Ws,
                    "fusion" => HostType::Fusion,
                    "player" => HostType::Player,
                    t => {
                        return Err(usage(format!(
                            "host type {t:?} is not supported: use ws, fusion or player (all run on the local drumsd)"
                        )))
                    }
                };
                i += 2;
            }
            // Guest credentials and the VM password: vmrun accepts them for
            // every command; none of ours runs in the guest through them.
            "-gu" | "-gp" | "-vp" => {
                value(i)?;
                i += 2;
            }
            "--state-dir" | "--socket" => {
                drums_args.push(a.clone());
                drums_args.push(value(i)?);
                i += 2;
            }
            "--no-autostart" => {
                drums_args.push(a.clone());
                i += 1;
            }
            s if s.starts_with("--state-dir=") || s.starts_with("--socket=") => {
                drums_args.push(a.clone());
                i += 1;
            }
            s if s.starts_with('-') => {
                return Err(usage(format!("unknown option {s:?}")));
            }
            _ => break,
        }
    }
    let verb = args
        .get(i)
        .ok_or_else(|| usage("no command given"))?
        .to_ascii_lowercase();
    let rest = &args[i + 1..];
    let command = match verb.as_str() {
        "list" => {
            arity("list", rest, 0, 0)?;
            Command::List
        }
        "start" => {
            arity("start", rest, 1, 2)?;
            let gui = match rest.get(1).map(|s| s.to_ascii_lowercase()).as_deref() {
                None | Some("gui") => true,
                Some("nogui") => false,
                Some(o) => return Err(usage(format!("start: {o:?} is not gui or nogui"))),
            };
            Command::Start {
                vmx: vmx(&rest[0])?,
                gui,
            }
        }
        "getguestipaddress" => {
            arity("getGuestIPAddress", rest, 1, 2)?;
            let wait = match rest.get(1).map(|s| s.to_ascii_lowercase()).as_deref() {
                None => false,
                Some("-wait") => true,
                Some(o) => return Err(usage(format!("getGuestIPAddress: {o:?} is not -wait"))),
            };
            Command::GetGuestIpAddress {
                vmx: vmx(&rest[0])?,
                wait,
            }
        }
        "snapshot" => {
            arity("snapshot", rest, 2, 2)?;
            Command::Snapshot {
                vmx: vmx(&rest[0])?,
                name: snapshot_name(&rest[1])?,
            }
        }
        "reverttosnapshot" => {
            arity("revertToSnapshot", rest, 2, 2)?;
            Command::RevertToSnapshot {
                vmx: vmx(&rest[0])?,
                name: snapshot_name(&rest[1])?,
            }
        }
        "stop" => {
            arity("stop", rest, 1, 2)?;
            let hard = match rest.get(1).map(|s| s.to_ascii_lowercase()).as_deref() {
                None | Some("soft") => false,
                Some("hard") => true,
                Some(o) => return Err(usage(format!("stop: {o:?} is not hard or soft"))),
            };
            Command::Stop {
                vmx: vmx(&rest[0])?,
                hard,
            }
        }
        other => {
            return Err(usage(format!(
                "unrecognized command {other:?}: this vmrun serves list, start, getGuestIPAddress, snapshot, revertToSnapshot and stop"
            )))
        }
    };
    Ok(Invocation {
        host,
        drums_args,
        command,
    })
}

fn arity(verb: &str, rest: &[String], min: usize, max: usize) -> Result<(), UsageError> {
    if rest.len() < min || rest.len() > max {
        let want = if min == max {
            format!("{min}")
        } else {
            format!("{min} to {max}")
        };
        return Err(usage(format!(
            "{verb} takes {want} parameters, got {}",
            rest.len()
        )));
    }
    Ok(())
}

fn vmx(s: &str) -> Result<PathBuf, UsageError> {
    if s.is_empty() {
        return Err(usage("empty .vmx path"));
    }
    Ok(PathBuf::from(s))
}

fn snapshot_name(s: &str) -> Result<String, UsageError> {
    if s.is_empty() {
        return Err(usage("empty snapshot name"));
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Invocation, UsageError> {
        let v: Vec<String> = s.split_whitespace().map(str::to_owned).collect();
        parse(&v)
    }
    fn cmd(s: &str) -> Command {
        p(s).unwrap_or_else(|e| panic!("{s}: {e}")).command
    }

    #[test]
    fn every_form_osworld_uses() {
        assert_eq!(cmd("-T ws list"), Command::List);
        assert_eq!(
            cmd("-T ws start /vm/x.vmx nogui"),
            Command::Start {
                vmx: "/vm/x.vmx".into(),
                gui: false
            }
        );
        assert_eq!(
            cmd("-T ws start /vm/x.vmx"),
            Command::Start {
                vmx: "/vm/x.vmx".into(),
                gui: true
            }
        );
        assert_eq!(
            cmd("-T ws start x.vmx gui"),
            Command::Start {
                vmx: "x.vmx".into(),
                gui: true
            }
        );
        assert_eq!(
            cmd("-T ws getGuestIPAddress /vm/x.vmx -wait"),
            Command::GetGuestIpAddress {
                vmx: "/vm/x.vmx".into(),
                wait: true
            }
        );
        assert_eq!(
            cmd("-T ws getGuestIPAddress /vm/x.vmx"),
            Command::GetGuestIpAddress {
                vmx: "/vm/x.vmx".into(),
                wait: false
            }
        );
        assert_eq!(
            cmd("-T ws snapshot /vm/x.vmx init_state"),
            Command::Snapshot {
                vmx: "/vm/x.vmx".into(),
                name: "init_state".into()
            }
        );
        assert_eq!(
            cmd("-T ws revertToSnapshot /vm/x.vmx init_state"),
            Command::RevertToSnapshot {
                vmx: "/vm/x.vmx".into(),
                name: "init_state".into()
            }
        );
        assert_eq!(
            cmd("-T ws stop /vm/x.vmx"),
            Command::Stop {
                vmx: "/vm/x.vmx".into(),
                hard: false
            }
        );
        assert_eq!(
            cmd("-T ws stop /vm/x.vmx hard"),
            Command::Stop {
                vmx: "/vm/x.vmx".into(),
                hard: true
            }
        );
        assert_eq!(
            cmd("-T ws stop /vm/x.vmx soft"),
            Command::Stop {
                vmx: "/vm/x.vmx".into(),
                hard: false
            }
        );
    }

    #[test]
    fn host_types_and_no_t() {
        assert_eq!(p("-T ws list").unwrap().host, HostType::Ws);
        assert_eq!(p("-T fusion list").unwrap().host, HostType::Fusion);
        assert_eq!(p("-T player list").unwrap().host, HostType::Player);
        assert_eq!(p("list").unwrap().host, HostType::Ws);
        assert_eq!(cmd("-T fusion snapshot a.vmx s").verb(), "snapshot");
        assert!(p("-T esx list").is_err());
        assert!(p("-T").is_err());
    }

    #[test]
    fn commands_are_case_insensitive_like_vmrun() {
        assert_eq!(cmd("LIST"), Command::List);
        assert_eq!(
            cmd("getguestipaddress a.vmx -WAIT").verb(),
            "getGuestIPAddress"
        );
        assert_eq!(cmd("reverttosnapshot a.vmx s").verb(), "revertToSnapshot");
    }

    #[test]
    fn drums_options_pass_through() {
        let i = p("--socket /s.sock --no-autostart -T ws list").unwrap();
        assert_eq!(i.drums_args, ["--socket", "/s.sock", "--no-autostart"]);
        let i = p("--state-dir=/st -T ws list").unwrap();
        assert_eq!(i.drums_args, ["--state-dir=/st"]);
        let i = p("-gu root -gp pw -T ws list").unwrap();
        assert!(i.drums_args.is_empty());
    }

    #[test]
    fn bad_forms() {
        for bad in [
            "",
            "-T ws",
            "-T ws list extra",
            "-T ws start",
            "-T ws start a.vmx headless",
            "-T ws start a.vmx nogui more",
            "-T ws getGuestIPAddress",
            "-T ws getGuestIPAddress a.vmx wait",
            "-T ws getGuestIPAddress a.vmx -wait more",
            "-T ws snapshot a.vmx",
            "-T ws snapshot a.vmx s more",
            "-T ws revertToSnapshot a.vmx",
            "-T ws stop",
            "-T ws stop a.vmx now",
            "-T ws suspend a.vmx",
            "-x list",
            "--socket",
        ] {
            assert!(p(bad).is_err(), "{bad:?} parsed");
        }
        assert!(parse(&["start".into(), String::new()]).is_err());
        assert!(parse(&["snapshot".into(), "a.vmx".into(), String::new()]).is_err());
    }
}
