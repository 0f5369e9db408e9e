//! The reading threads of a SQLite import, kept at a lower scheduling priority so that SQLite's one writer thread,
//! which cannot be parallelised, keeps its core.

use std::sync::OnceLock;

/// The threads a SQLite import reads and parses on: one per core, each at a lower scheduling priority (Linux; one
/// fewer than the cores elsewhere).
///
/// SQLite's single writer thread cannot be parallelised, so every moment the readers take its core slows the whole
/// import. On rayon's global pool (a thread per core, same priority) the readers kept the writer off its core for
/// a third of the time, and sat idle whenever the channel was full: on 2 cores, 200,000 tooltune records took
/// 21.7 s; with the readers at a lower priority, 17.3 s. One reader fewer would have done the same for a format
/// that is cheap to parse, but slowed a costly one, where the writer waits on the readers rather than the other
/// way round (Langfuse: 9.7k trajectories/s with two low-priority readers, 7.2k with one). PostgreSQL writes in
/// its own processes, so its imports parse on the global pool.
///
/// `None` if the threads could not be started; the import then parses on the global pool.
pub(super) fn parse_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        let threads = if cfg!(target_os = "linux") {
            cores
        } else {
            cores.saturating_sub(1).max(1)
        };
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("tooltune-parse-{i}"))
            .start_handler(|_| lower_this_threads_priority())
            .build()
            .ok()
    })
    .as_ref()
}

/// Makes the calling thread yield its core to the others of the process (nice +10), so that the writer runs
/// whenever it has work. Linux schedules threads one by one, so this affects no other thread. Best effort: a
/// failure leaves the thread at its priority.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // The workspace denies unsafe code; setpriority and gettid have no safe wrapper in std.
fn lower_this_threads_priority() {
    // SAFETY: both calls take plain integers and touch no memory of ours.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 10);
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_this_threads_priority() {}
