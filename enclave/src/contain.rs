//! Faults in one request's handling stay in that request.
//!
//! A panic in a task fails that task: [`contain`] catches it at the task's
//! top, logs where it happened, and lets the caller answer the request as a
//! failure; the process keeps serving every other session. The panic hook
//! [`install_quiet_hook`] puts in place logs a panic's location only, never
//! its message: Rust's own messages can quote the data they failed on (a
//! string sliced off a character boundary is printed whole), and that data
//! may be a prompt.
//!
//! What this cannot contain is the end of the process itself: a stack
//! overflow aborts it. Nothing a client sends runs deep recursion on a
//! serving thread (response formats compile in worker processes,
//! `pipeline::entry::format_jobs`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;

/// Panics contained since start.
pub static CONTAINED: AtomicUsize = AtomicUsize::new(0);

/// Runs `task`; a panic in it is logged (as `what`, without its message)
/// and becomes `None`.
pub async fn contain<F: Future>(task: F, what: &'static str) -> Option<F::Output> {
    match AssertUnwindSafe(task).catch_unwind().await {
        Ok(out) => Some(out),
        Err(_) => {
            CONTAINED.fetch_add(1, Ordering::Relaxed);
            tracing::error!(task = what, "a panic failed this request; the process keeps serving");
            None
        }
    }
}

/// A panic hook that logs the thread and location of a panic, not its
/// message.
pub fn install_quiet_hook() {
    std::panic::set_hook(Box::new(|info| {
        let thread = std::thread::current();
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        tracing::error!(thread = thread.name().unwrap_or("unnamed"), %location, "panic (message withheld: it may quote request data)");
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_becomes_none_and_the_next_one_runs() {
        let before = CONTAINED.load(Ordering::Relaxed);
        let failed = contain(async { panic!("boom") }, "test").await;
        assert_eq!(failed, None::<()>);
        assert_eq!(contain(async { 7 }, "test").await, Some(7));
        assert!(CONTAINED.load(Ordering::Relaxed) > before);
    }
}
