//! Running a verb on the network in force: as a task of its own, holding the operation guard,
//! answered within the operation deadline (or "try again later" while it goes on).

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cni::CniError;

use super::super::options::Limits;
use crate::daemon::api::Response;
use crate::daemon::state::{Active, DaemonState};

/// Runs `op` on the network in force, as a task of its own that holds the operation guard and
/// a snapshot of the network, and answers within the operation deadline: "try again later"
/// when the network is not ready, a config change does not end in time, or `op` does not.
pub(super) async fn in_operation<F, Fut>(
    state: &DaemonState,
    limits: &Limits,
    what: String,
    op: F,
) -> Response
where
    F: FnOnce(Arc<Active>) -> Fut,
    Fut: Future<Output = Response> + Send + 'static,
{
    let deadline = Instant::now() + limits.operation_deadline;
    let Ok(guard) = tokio::time::timeout_at(deadline, state.begin_operation()).await else {
        return CniError::try_again_later(format!(
            "{what}: a network config change did not finish within {:?}",
            limits.operation_deadline
        ))
        .into();
    };
    let active = match require_active(state).await {
        Ok(active) => active,
        Err(response) => return response,
    };
    let work = op(active);
    let task = tokio::spawn(async move {
        let _running = guard;
        work.await
    });
    answer_by(deadline, limits.operation_deadline, &what, task).await
}

/// The answer of `task`, or at `deadline` "try again later" while the task goes on (so that
/// what it started is finished or rolled back; the caller's retry then converges).
async fn answer_by(
    deadline: Instant,
    allowed: Duration,
    what: &str,
    task: JoinHandle<Response>,
) -> Response {
    match tokio::time::timeout_at(deadline, task).await {
        Ok(Ok(response)) => response,
        Ok(Err(err)) => CniError::internal(format!("{what} failed: {err}")).into(),
        Err(_) => {
            tracing::warn!(
                operation = what,
                ?allowed,
                "operation over its deadline: answered try again later, it goes on"
            );
            CniError::try_again_later(format!(
                "{what} did not finish within {allowed:?}; it goes on in the daemon: retry later"
            ))
            .into()
        }
    }
}

/// A snapshot of the network in force, or code 11 (try again later) with the reasons it is
/// not ready.
async fn require_active(state: &DaemonState) -> Result<Arc<Active>, Response> {
    if let Some(active) = state.active() {
        return Ok(active);
    }
    let status = state.status().await;
    Err(CniError::try_again_later(format!(
        "provisioner daemon not ready: {}",
        status.reasons.join("; ")
    ))
    .into())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn an_operation_over_its_deadline_is_answered_try_again_later_and_goes_on() {
        let finished = std::sync::Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let finished = std::sync::Arc::clone(&finished);
            async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                finished.store(true, Ordering::SeqCst);
                Response::Ok {
                    result: serde_json::Value::Null,
                }
            }
        });
        let allowed = Duration::from_millis(20);
        let started = Instant::now();
        let answer = answer_by(started + allowed, allowed, "ADD of container c", task).await;
        assert!(started.elapsed() < Duration::from_millis(250));
        match answer {
            Response::Error { code, msg, .. } => {
                assert_eq!(code, CniError::TRY_AGAIN_LATER);
                assert!(
                    msg.contains("ADD of container c did not finish within"),
                    "{msg}"
                );
            }
            Response::Ok { .. } => panic!("answered before the operation could finish"),
        }
        // The operation was not cancelled: it finishes (or rolls back) on its own.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !finished.load(Ordering::SeqCst) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn an_operation_within_its_deadline_is_answered_with_its_result() {
        let task = tokio::spawn(async {
            Response::Ok {
                result: serde_json::json!({ "done": true }),
            }
        });
        let allowed = Duration::from_secs(5);
        let answer = answer_by(Instant::now() + allowed, allowed, "DEL", task).await;
        assert_eq!(
            answer,
            Response::Ok {
                result: serde_json::json!({ "done": true })
            }
        );
    }
}
