//! One driver per run: a lease on the run in the store, renewed in the background while the run is driven, and
//! taken over at once from a holder known to be gone (a dead process on this machine, a cancelled driver here).

use crate::{DriverError, StopSignal};
use std::time::Duration;
use tooltune_store::Store;
use tooltune_worker::work::hostname;

/// How long a lease lasts without renewal: long enough that a busy machine's heartbeat is never late, short
/// enough that a crashed driver's run can be resumed soon after.
const LEASE_TTL: Duration = Duration::from_secs(60);

/// This process's claim on a run, renewed in the background while the run is driven, so that `tooltune serve`
/// and a `tooltune optimize --resume` in another terminal never drive the same run at once.
pub(crate) struct Lease {
    store: Store,
    run_id: String,
    owner: String,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl Lease {
    pub(crate) async fn take(
        store: &Store,
        run_id: &str,
        stop: StopSignal,
    ) -> Result<Lease, DriverError> {
        let owner = format!(
            "{} pid {} ({})",
            hostname(),
            std::process::id(),
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        if let Err((holder, until)) = store.lease_run(run_id, &owner, LEASE_TTL).await? {
            // A holder that was a process on this machine and is gone (killed, crashed), or a cancelled driver
            // of this process, cannot renew: take the run over now rather than make `--resume` after a crash
            // wait for the lease to run out.
            let dead = holder_is_dead_here(&holder)
                && store
                    .take_over_run(run_id, &holder, &owner, LEASE_TTL)
                    .await?;
            if !dead {
                return Err(DriverError::Busy {
                    run: run_id.to_string(),
                    owner: holder,
                    until,
                });
            }
            tracing::info!(
                run = run_id,
                holder,
                "took over the lease of a process that is gone"
            );
        }
        let (s, id, o) = (store.clone(), run_id.to_string(), owner.clone());
        let heartbeat = tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_TTL / 3).await;
                match s.lease_run(&id, &o, LEASE_TTL).await {
                    Ok(Ok(())) => {}
                    Ok(Err((holder, _))) => {
                        // Our lease lapsed (the process was suspended) and someone else took the run: stop
                        // after the current step rather than drive it twice.
                        tracing::warn!(run = %id, holder, "lost the run's lease; stopping");
                        stop.stop();
                        return;
                    }
                    Err(e) => tracing::warn!(run = %id, "renewing the run's lease: {e}"),
                }
            }
        });
        live_leases().insert(owner.clone());
        Ok(Lease {
            store: store.clone(),
            run_id: run_id.to_string(),
            owner,
            heartbeat,
        })
    }

    pub(crate) async fn release(self) {
        self.heartbeat.abort();
        if let Err(e) = self.store.release_run(&self.run_id, &self.owner).await {
            tracing::warn!(run = %self.run_id, "releasing the run's lease: {e}");
        }
    }
}

impl Drop for Lease {
    /// Also runs when the driving future is cancelled (a server shutting down aborts its jobs): the heartbeat
    /// stops, and this process no longer counts the lease as alive, so a new driver here may take it over.
    fn drop(&mut self) {
        self.heartbeat.abort();
        live_leases().remove(&self.owner);
    }
}

/// The leases this process holds right now. A lease naming this process but missing here belonged to a driver
/// that was cancelled, which no `/proc` check could tell.
fn live_leases() -> std::sync::MutexGuard<'static, std::collections::HashSet<String>> {
    static LIVE: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<String>>> =
        std::sync::OnceLock::new();
    LIVE.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether a lease holder written by [`Lease::take`] names a process on this machine that no longer exists.
/// Only decidable where `/proc` lists processes; elsewhere the lease must expire.
fn holder_is_dead_here(holder: &str) -> bool {
    let mut words = holder.split_whitespace();
    let (Some(host), Some("pid"), Some(pid)) = (words.next(), words.next(), words.next()) else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    if host != hostname() {
        return false;
    }
    if pid == std::process::id() {
        return !live_leases().contains(holder);
    }
    std::path::Path::new("/proc/self").exists()
        && !std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holder_is_dead_only_when_it_is_our_machine_and_its_process_is_gone() {
        let here = hostname();
        // A lease this process holds is alive; one it no longer holds (a cancelled driver's) is not.
        let mine = format!("{here} pid {} (abcd1234)", std::process::id());
        live_leases().insert(mine.clone());
        assert!(!holder_is_dead_here(&mine));
        live_leases().remove(&mine);
        assert!(holder_is_dead_here(&mine));
        // A pid above the kernel's limit cannot exist.
        if std::path::Path::new("/proc/self").exists() {
            assert!(holder_is_dead_here(&format!("{here} pid 4294967294 (x)")));
        }
        // Another machine's process, or a holder we did not write, is never declared dead.
        assert!(!holder_is_dead_here(
            "some-other-machine pid 4294967294 (x)"
        ));
        assert!(!holder_is_dead_here("someone"));
        assert!(!holder_is_dead_here(""));
    }
}
