//! The two dedicated connections beside the pool: the LISTEN connection,
//! which turns other instances' NOTIFYs into wake-ups (skipping this
//! instance's own), and the session that holds the advisory locks.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::anyhow;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, SimpleQueryMessage};

use super::connect::{Connector, NotifyTarget};
use super::{CHANNEL, db_error, describe};

/// How often the LISTEN connection checks that the server still answers: a
/// connection that died silently would otherwise lose notifications unnoticed.
const LISTEN_HEALTH_INTERVAL: Duration = Duration::from_secs(30);
/// How long a health check or lock query may take before its connection is
/// given up as dead.
const SESSION_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// A stable 64-bit key for an advisory lock name: the same on every
/// instance and every build (FNV-1a), prefixed so as not to meet other
/// applications' locks on the same database.
pub(super) fn lock_key(name: &str) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"cetera:".iter().chain(name.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash as i64
}

/// Aborts a task when dropped.
pub(super) struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The LISTEN connection: keeps one open, reconnecting when it dies.
pub(super) struct Listener;

impl Listener {
    /// LISTENs before returning, so no commit after `connect` goes unseen,
    /// then keeps the connection alive on a task.
    pub(super) async fn start(
        connector: Connector,
        target: NotifyTarget,
    ) -> anyhow::Result<AbortOnDrop> {
        let session = Self::listen(&connector, &target)
            .await
            .map_err(|e| anyhow!(describe(&e)))?;
        Ok(AbortOnDrop(tokio::spawn(Self::run(
            connector, target, session,
        ))))
    }

    async fn listen(
        connector: &Connector,
        target: &NotifyTarget,
    ) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        let (client, driver) = connector.connect(Some(target.clone())).await?;
        client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
        Ok((client, driver))
    }

    async fn run(connector: Connector, target: NotifyTarget, first: (Client, JoinHandle<()>)) {
        let mut session = Some(first);
        let mut delay = Duration::from_millis(250);
        loop {
            let (client, mut driver) = match session.take() {
                Some(session) => session,
                None => match Self::listen(&connector, &target).await {
                    Ok(session) => {
                        tracing::info!("LISTEN connection to {} restored", connector.describe());
                        // Notifications sent while it was down are lost.
                        target.changes.notify();
                        delay = Duration::from_millis(250);
                        session
                    }
                    Err(error) => {
                        tracing::warn!(
                            "cannot LISTEN on {}, retrying in {delay:?}: {}",
                            connector.describe(),
                            describe(&error)
                        );
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(10));
                        continue;
                    }
                },
            };
            let mut health = tokio::time::interval(LISTEN_HEALTH_INTERVAL);
            health.tick().await;
            loop {
                tokio::select! {
                    _ = &mut driver => {
                        tracing::warn!("LISTEN connection to {} lost", connector.describe());
                        break;
                    }
                    _ = health.tick() => {
                        let check = tokio::time::timeout(
                            SESSION_QUERY_TIMEOUT,
                            client.simple_query("SELECT 1"),
                        );
                        if !matches!(check.await, Ok(Ok(_))) {
                            tracing::warn!(
                                "LISTEN connection to {} stopped answering",
                                connector.describe()
                            );
                            break;
                        }
                    }
                }
            }
            driver.abort();
        }
    }
}

/// The dedicated connection for advisory locks: a session-level lock lives
/// exactly as long as the session that took it.
#[derive(Default)]
pub(super) struct LockSession {
    pub(super) client: Option<Client>,
    pub(super) held: HashSet<i64>,
}

impl LockSession {
    pub(super) fn lost(&mut self) {
        if !self.held.is_empty() {
            tracing::warn!("the advisory lock connection died: its locks are released");
        }
        self.client = None;
        self.held.clear();
    }
}

/// Runs one statement that returns a single value, on a dedicated connection.
pub(super) async fn simple_value(client: &Client, sql: &str) -> anyhow::Result<Option<String>> {
    let messages = tokio::time::timeout(SESSION_QUERY_TIMEOUT, client.simple_query(sql))
        .await
        .map_err(|_| anyhow!("Postgres did not answer within {SESSION_QUERY_TIMEOUT:?}"))?
        .map_err(|e| db_error(&e))?;
    Ok(messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
        _ => None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_stable() {
        assert_eq!(lock_key("expiry"), lock_key("expiry"));
        assert_ne!(lock_key("expiry"), lock_key("compaction"));
        // FNV-1a of "cetera:" alone, fixed forever: instances of different
        // versions must agree on every key.
        assert_eq!(lock_key(""), 0x879c_9279_c629_e1dbu64 as i64);
    }
}
