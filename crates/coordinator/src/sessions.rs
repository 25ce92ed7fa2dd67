//! What the coordinator needs of drumsd's sessions, and nothing more: the
//! session manager in drumsd, a fake in the unit tests (so the proxy, its
//! gating and its turn logic are tested without a drumsd, namespaces or
//! root).

use std::future::Future;
use std::net::Ipv4Addr;
use std::sync::Arc;

use drums_api::{
    AgentMarked, EndTurn, Job, Policy, Session, SessionVersion, TurnBegun, TurnEffects,
};
use drums_session::{Manager, SessionError};

/// Held while a request to a session's guest is open: a checkpoint waits
/// for it (CRIU cannot dump the guest's end of a connection to drumsd).
pub trait StreamGuard: Send {}
impl StreamGuard for drums_session::manager::GuestStream {}

pub trait Sessions: Send + Sync + 'static {
    /// A session by id or name.
    fn get(&self, id_or_name: &str) -> Result<Session, SessionError>;
    /// The session with bridge address `ip`, if any.
    fn session_at(&self, ip: Ipv4Addr) -> Result<Option<Session>, SessionError>;
    /// Its versions, oldest first.
    fn session_versions(&self, id_or_name: &str) -> Result<Vec<SessionVersion>, SessionError>;
    /// End the open turn of session `id`, named `name`, and submit its
    /// version (not waited for).
    fn end_model_turn(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        req: &EndTurn,
    ) -> impl Future<Output = Result<TurnEffects, SessionError>> + Send;
    /// Take the session's first version, if it has none; its job's id.
    fn base_version(
        self: &Arc<Self>,
        id: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<Option<String>, SessionError>> + Send;
    fn turn_begin(&self, id_or_name: &str) -> Result<TurnBegun, SessionError>;
    /// Begin the next turn of session `id`, named `name`, at once if its
    /// turns are watched already; `None` if not, and the caller takes
    /// [`Sessions::turn_begin`] (which may load a watch: tens of ms).
    fn turn_begin_watched(&self, id: &str, name: &str) -> Option<Result<TurnBegun, SessionError>>;
    /// The session's open turn, if one is.
    fn open_turn(&self, id_or_name: &str) -> Option<u64>;
    /// The version the session was taken back to since this was last
    /// asked (a rollback or recovery), once.
    fn take_restored(&self, id: &str) -> Option<String>;
    /// The version the session is at.
    fn at_version(&self, id: &str) -> Option<String>;
    /// Something changed in the session outside every turn: its next
    /// version must be full.
    fn changed_outside_turns(&self, id: &str);
    /// A client of the session's guest.
    fn guest_proxy(&self, s: &Session) -> Result<drums_api::Client, SessionError>;
    fn guest_stream(&self, id: &str) -> impl StreamGuard;
    /// Exclude the agent living in the session (its pid there) from process
    /// tracking.
    fn mark_agent(&self, id_or_name: &str, pid: i32) -> Result<AgentMarked, SessionError>;
    /// A checkpoint job, waited for if `wait`.
    fn job(&self, id: &str, wait: bool) -> impl Future<Output = Result<Job, SessionError>> + Send;
    /// Move a queued job ahead (its answer is being held for it).
    fn promote_job(&self, id: &str) -> impl Future<Output = Result<Job, SessionError>> + Send;
    /// The coordinator's record of a request, to every `turns` stream.
    fn publish_coordinated(&self, record: drums_api::CoordinatedTurn);
    /// Bring the session back from its newest done version.
    fn recover(
        &self,
        id_or_name: &str,
    ) -> impl Future<Output = Result<Session, SessionError>> + Send;
    /// Whether a running session's processes died.
    fn processes_died(&self, id_or_name: &str) -> Result<bool, SessionError>;
    /// Host pids of the session's processes.
    fn session_pids(&self, id: &str) -> Result<Vec<i32>, SessionError>;
    /// Processes the OOM killer killed in the session.
    fn oom_kills(&self, id: &str) -> Option<u64>;
    /// Kill every process left of the session.
    fn kill_processes(&self, id: &str) -> Result<(), SessionError>;
}

impl Sessions for Manager {
    fn get(&self, id_or_name: &str) -> Result<Session, SessionError> {
        Manager::get(self, id_or_name)
    }
    fn session_at(&self, ip: Ipv4Addr) -> Result<Option<Session>, SessionError> {
        Manager::session_at(self, ip)
    }
    fn session_versions(&self, id_or_name: &str) -> Result<Vec<SessionVersion>, SessionError> {
        Manager::session_versions(self, id_or_name)
    }
    fn end_model_turn(
        self: &Arc<Self>,
        id: &str,
        name: &str,
        req: &EndTurn,
    ) -> impl Future<Output = Result<TurnEffects, SessionError>> + Send {
        Manager::end_model_turn(self, id, name, req)
    }
    fn base_version(
        self: &Arc<Self>,
        id: &str,
        policy: Policy,
    ) -> impl Future<Output = Result<Option<String>, SessionError>> + Send {
        Manager::base_version(self, id, policy)
    }
    fn turn_begin(&self, id_or_name: &str) -> Result<TurnBegun, SessionError> {
        Manager::turn_begin(self, id_or_name)
    }
    fn turn_begin_watched(&self, id: &str, name: &str) -> Option<Result<TurnBegun, SessionError>> {
        Manager::turn_begin_watched(self, id, name)
    }
    fn open_turn(&self, id_or_name: &str) -> Option<u64> {
        Manager::open_turn(self, id_or_name)
    }
    fn take_restored(&self, id: &str) -> Option<String> {
        Manager::take_restored(self, id)
    }
    fn at_version(&self, id: &str) -> Option<String> {
        Manager::at_version(self, id)
    }
    fn changed_outside_turns(&self, id: &str) {
        Manager::changed_outside_turns(self, id)
    }
    fn guest_proxy(&self, s: &Session) -> Result<drums_api::Client, SessionError> {
        Manager::guest_proxy(self, s)
    }
    fn guest_stream(&self, id: &str) -> impl StreamGuard {
        Manager::guest_stream(self, id)
    }
    fn mark_agent(&self, id_or_name: &str, pid: i32) -> Result<AgentMarked, SessionError> {
        Manager::mark_agent(self, id_or_name, pid)
    }
    fn job(&self, id: &str, wait: bool) -> impl Future<Output = Result<Job, SessionError>> + Send {
        Manager::job(self, id, wait)
    }
    fn promote_job(&self, id: &str) -> impl Future<Output = Result<Job, SessionError>> + Send {
        Manager::promote_job(self, id)
    }
    fn publish_coordinated(&self, record: drums_api::CoordinatedTurn) {
        Manager::publish_coordinated(self, record)
    }
    fn recover(
        &self,
        id_or_name: &str,
    ) -> impl Future<Output = Result<Session, SessionError>> + Send {
        Manager::recover(self, id_or_name)
    }
    fn processes_died(&self, id_or_name: &str) -> Result<bool, SessionError> {
        Manager::processes_died(self, id_or_name)
    }
    fn session_pids(&self, id: &str) -> Result<Vec<i32>, SessionError> {
        Manager::session_pids(self, id)
    }
    fn oom_kills(&self, id: &str) -> Option<u64> {
        Manager::oom_kills(self, id)
    }
    fn kill_processes(&self, id: &str) -> Result<(), SessionError> {
        Manager::kill_processes(self, id)
    }
}
