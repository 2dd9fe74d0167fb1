//! Applies the record log's batch on a thread of its own when the writer is
//! idle: under load the writer applies it itself after a commit (see
//! `journal`), but the last commits before a pause would otherwise wait in
//! memory and in the record log until the next write.

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};

use rusqlite::Connection;

use super::checkpointer::Checkpointer;
use super::journal::{APPLY_INTERVAL, Journal};

/// The applier thread; it stops when this is dropped.
pub struct Applier {
    /// Dropped to stop the thread.
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Applier {
    /// Starts the thread, which looks at the batch's age a few times an
    /// interval and applies it when it is due and the writer is free. A
    /// writer that is busy applies the batch itself.
    pub fn start(
        writer: Arc<tokio::sync::Mutex<Connection>>,
        journal: Arc<Journal>,
        checkpointer: Arc<Checkpointer>,
    ) -> anyhow::Result<Applier> {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("sqlite-apply".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(APPLY_INTERVAL / 4)
                {
                    if !journal.apply_due() {
                        continue;
                    }
                    if let Ok(conn) = writer.try_lock() {
                        journal.apply(&conn, &checkpointer);
                    }
                }
            })?;
        Ok(Applier {
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(&mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::warn!("the record log's apply thread panicked");
        }
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        self.stop();
    }
}
