//! Creating a session, one recorded step at a time. Each step is a fault point;
//! if any step fails, the ledger names everything made so far and
//! [`crate::teardown`] removes it.

use drums_api::{CreateSession, Session};
use drums_api::{Network, SessionState};
use drums_catalog::SessionRecord;

use crate::boot::{boot, Plan, Ready, Start, Upper};
use crate::manager::{guest_client, Manager};
use crate::spec::{hostname_for, Spec};
use crate::SessionError;

impl Manager {
    /// Create a session and return once its guest agent answers.
    pub async fn create(&self, req: &CreateSession) -> Result<Session, SessionError> {
        let spec = Spec::from_request(req, &self.host.limits)?;
        let image = self.resolve_image(&spec.image)?;
        // The desktop's services and user come with the image's desktop
        // layer: without it the guest cannot start them, which is the
        // caller's choice of image, not drums failing.
        if spec.desktop.is_some() && !image.desktop {
            return Err(SessionError::Invalid(format!(
                "image {:?} has no desktop layer: the desktop profile needs a drums image built as desktop",
                spec.image
            )));
        }
        let id = random_hex(6);
        let name = spec.name.clone().unwrap_or_else(|| id.clone());
        let rec = SessionRecord {
            hostname: hostname_for(&name, &id),
            id,
            name,
            profile: spec.profile,
            image: image.key.clone(),
            state: SessionState::Creating,
            network: spec.network,
            egress: spec.egress,
            ip: None,
            mac: None,
            limits: serde_json::to_value(&spec.limits).expect("limits serialize"),
            init_pid: None,
            created_at_ms: drums_catalog::now_ms(),
            generation: 0,
            origin: None,
            privileged: spec.privileged,
            id_base: None,
            pool: None,
        };
        let pool = (spec.network == Network::Bridge).then(|| self.host.pool());
        // A privileged session keeps host root, as Podman's does.
        let ids = (!spec.privileged).then_some(crate::ids::POOL);
        // Reserves the name, the address and the id range atomically.
        // Refused before anything is made: an image with nothing to run.
        let run = match (req.run, &image.oci) {
            (false, _) => None,
            (true, Some(config)) => match crate::images::default_process(config) {
                Some(argv) => Some((argv, config.clone())),
                None => {
                    return Err(SessionError::Invalid(format!(
                        "image {:?} names no Entrypoint or Cmd to run",
                        spec.image
                    )))
                }
            },
            (true, None) => {
                return Err(SessionError::Invalid(format!(
                    "run needs an OCI image with an Entrypoint or Cmd; {:?} is a drums image",
                    spec.image
                )))
            }
        };
        let rec = self
            .host
            .catalog
            .insert_session(rec, pool, ids, self.host.cfg.max_sessions)?;
        let plan = Plan {
            limits: &spec.limits,
            privileged: spec.privileged,
            lower: &image.rootfs,
            upper: Upper::Empty,
            start: Start::Cold { last_pid: None },
            ready: Ready::Fresh(spec.desktop.as_ref()),
        };
        let mut built = boot(&self.host, &rec, plan).await;
        if let (Ok(pid), Some((argv, config))) = (&built, run) {
            if let Err(e) = start_default_process(*pid, argv, &config).await {
                built = Err(e);
            }
        }
        self.settle(&rec, built).await
    }
}

/// The host end of a session's veth: `drums` + 10 hex digits of the id, 15
/// characters, the kernel's limit.
pub fn veth_name(id: &str) -> String {
    format!("drums{}", &id[..10.min(id.len())])
}

pub(crate) fn parse_mac(s: &str) -> [u8; 6] {
    let mut mac = [0u8; 6];
    for (i, part) in s.split(':').take(6).enumerate() {
        mac[i] = u8::from_str_radix(part, 16).unwrap_or(0);
    }
    mac
}

/// Random lowercase hex from the kernel's RNG.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    let mut f = std::fs::File::open("/dev/urandom").expect("/dev/urandom is always there");
    std::io::Read::read_exact(&mut f, &mut buf).expect("read /dev/urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a session's default process writes, inside the session.
pub const MAIN_LOG: &str = "/var/log/drums/main.log";

/// The image's default process, detached, with the image's config: its
/// failure to start (no such program, no such user) fails the create.
async fn start_default_process(
    pid: i32,
    argv: Vec<String>,
    config: &drums_oci::ImageConfig,
) -> Result<(), SessionError> {
    let mut req = drums_api::ExecRequest {
        argv,
        detach: true,
        log: Some(MAIN_LOG.into()),
        ..Default::default()
    };
    crate::images::apply_defaults(&mut req, config);
    let _: serde_json::Value = guest_client(pid)
        .json(hyper::Method::POST, "/v1/exec", Some(&req))
        .await
        .map_err(|e| {
            SessionError::refused(
                format!("start the image's default process {:?}", req.argv),
                e,
            )
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_macs() {
        assert_eq!(veth_name("0123456789abcdef"), "drums0123456789");
        assert_eq!(veth_name("0123456789abcdef").len(), 15);
        assert_eq!(parse_mac("02:64:0a:d5:00:02"), [2, 0x64, 10, 0xd5, 0, 2]);
        assert_eq!(random_hex(6).len(), 12);
        assert_ne!(random_hex(8), random_hex(8));
    }
}
