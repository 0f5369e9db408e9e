//! Starts the disk writes of a large SQLite import while it runs, so that its commit does not wait for all of them.
//!
//! An import is one transaction. SQLite (WAL mode, `synchronous = NORMAL`) writes its pages to the WAL file as its
//! page cache spills, and the kernel keeps them in memory (by default it starts writing back only when a tenth of
//! the RAM is dirty: 2.4 GB on the 24 GB bench machine), so nothing reached the disk before the commit's
//! checkpoint called `fsync`. That checkpoint then waited for the whole WAL (230 MB for
//! 200,000 bench trajectories; 0.6 s), copied it into the database file, and waited for that too (0.4 s), with
//! both cores idle. Asking the kernel to start writing back every few hundred milliseconds
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which returns without waiting) moves that writing under the
//! import's parsing: the commit of 200,000 trajectories went from 1.3-1.7 s to 0.8-1.1 s, with no slower
//! import before it.
//!
//! It promises nothing about durability (that stays SQLite's `fsync`), so every error is ignored: a file that
//! cannot be opened or flushed just means the commit waits as it did without this. Linux only; elsewhere it does
//! nothing.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// How often writeback is started. Short enough that little is left for the commit, long enough that each call
/// finds megabytes to send rather than a page.
const EVERY: Duration = Duration::from_millis(200);

/// Starts writeback of a SQLite database's files until dropped.
pub(crate) struct Writeback {
    /// Dropping it wakes the thread, which then stops (within one call; dropping does not wait for it).
    _stop: mpsc::Sender<()>,
    #[cfg_attr(not(test), allow(dead_code))]
    thread: std::thread::JoinHandle<()>,
}

impl Writeback {
    /// Starts a thread that flushes `database` and its WAL (`database-wal`, once it exists); `None` when the
    /// thread cannot be started or the platform has no such call.
    pub(crate) fn start(database: &Path) -> Option<Writeback> {
        if !cfg!(target_os = "linux") {
            return None;
        }
        let mut wal = database.as_os_str().to_owned();
        wal.push("-wal");
        let files = [database.to_path_buf(), PathBuf::from(wal)];
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("tooltune-writeback".into())
            .spawn(move || run(&files, &stopped))
            .ok()?;
        Some(Writeback {
            _stop: stop,
            thread,
        })
    }
}

fn run(paths: &[PathBuf], stopped: &mpsc::Receiver<()>) {
    // Opened lazily: the WAL may not exist when the import starts. Any descriptor of a file starts the
    // writeback of its pages, whoever dirtied them.
    let mut open: Vec<Option<std::fs::File>> = paths.iter().map(|_| None).collect();
    // `recv_timeout` is the sleep: it returns `Disconnected` as soon as the owner drops its sender.
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
        for (path, file) in paths.iter().zip(open.iter_mut()) {
            if file.is_none() {
                *file = std::fs::File::open(path).ok();
            }
            if let Some(f) = file {
                start_writeback(f);
            }
        }
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)] // The workspace denies unsafe code; sync_file_range has no safe wrapper in std.
fn start_writeback(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call (borrowed from a live `File`), and the call only
    // reads its arguments. Offset 0 with length 0 means the whole file.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE);
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &std::fs::File) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_stops_when_dropped_and_a_missing_file_is_no_error() {
        let dir = std::env::temp_dir().join(format!("tooltune-writeback-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let db = dir.join("store.db");
        std::fs::write(&db, vec![7u8; 1 << 20]).expect("a dirty file");
        let Some(w) = Writeback::start(&db) else {
            return; // Not Linux: nothing to check.
        };
        std::thread::sleep(EVERY * 2);
        assert!(!w.thread.is_finished(), "it runs until dropped");
        let Writeback { _stop, thread } = w;
        drop(_stop);
        // The sleep is a receive, which the disconnect ends at once; a tick is ample.
        std::thread::sleep(EVERY);
        assert!(thread.is_finished(), "it stops when dropped");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }
}
