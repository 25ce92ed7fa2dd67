//! A command in a session, its output streamed to the caller's sinks, and
//! its end as the exit code `drums exec` gives it.

use std::io::Write;

use drums_api::exec::enc;
use drums_api::{Client, ExecRequest, Session};
use hyper::Method;

use crate::exit::{self, Failure};

/// The streaming exec, writing to the given sinks (the demo captures them).
pub async fn run_exec(
    c: &Client,
    session: &str,
    req: &ExecRequest,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<i32, Failure> {
    let st = drums_api::exec(c, session, req, |stream, bytes| {
        let w: &mut dyn Write = match stream {
            drums_api::Stream::Stderr => &mut *err,
            drums_api::Stream::Stdout => &mut *out,
        };
        let _ = w.write_all(bytes).and_then(|_| w.flush());
    })
    .await;
    match st {
        Ok(st) if st.timed_out => {
            let _ = writeln!(err, "drums: command timed out and was killed");
            Ok(exit::TIMED_OUT)
        }
        Ok(st) => Ok(st.code.unwrap_or_else(|| 128 + st.signal.unwrap_or(0))),
        Err(drums_api::ExecError::Start { source, .. }) => Err(source.into()),
        Err(drums_api::ExecError::Broke { why, .. }) => {
            Err(exec_broke(c, session, format!("exec stream broke: {why}")).await)
        }
        Err(e) => Err(Failure::internal(&e)),
    }
}

/// Why an exec's output stream broke or ended early: most often the session
/// was removed (its guest agent died with it), which the caller should hear
/// in those words rather than as a transport error.
async fn exec_broke(c: &Client, session: &str, otherwise: String) -> Failure {
    // Asked right after the break, the removal may still be under way.
    let removed = match c
        .json::<Session>(
            Method::GET,
            &format!("/v1/sessions/{}", enc(session)),
            None::<&()>,
        )
        .await
    {
        Ok(s) => s.state == drums_api::SessionState::Removing,
        Err(e) => matches!(e, drums_api::ClientError::Api { status: 404, .. }),
    };
    if removed {
        Failure::new(
            exit::INTERNAL,
            format!("session {session} was removed while the command ran"),
        )
    } else {
        Failure::new(exit::INTERNAL, otherwise)
    }
}
