//! Connections to the server: the `Connector` that opens them (plain or
//! TLS) and drives each on a task of its own, the retries at startup,
//! creating the database, and the migrations.

use std::fmt::Write as _;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use deadpool_postgres::{Manager, ManagerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinHandle;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Notification};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::endpoint::Target;
use super::sessions::lock_key;
use super::tls::rustls_connector;
use super::{CHANNEL, DEFAULT_DATABASE, db_error, describe};
use crate::backend::changes::Notifications;

mod embedded {
    refinery::embed_migrations!("migrations/postgres");
}

#[derive(Clone)]
enum Tls {
    Off,
    Rustls(MakeRustlsConnect),
}

/// Opens connections to the configured database: the pool's and the
/// dedicated ones (LISTEN, advisory locks, migrations).
#[derive(Clone)]
pub(super) struct Connector {
    config: Config,
    tls: Tls,
}

impl Connector {
    pub(super) fn new(target: Target) -> anyhow::Result<Self> {
        let Target { mut config, ssl } = target;
        // Postgres has no TLS on Unix sockets (libpq skips it there too).
        #[cfg(unix)]
        let plan = if config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)))
            && config.get_hostaddrs().is_empty()
        {
            None
        } else {
            ssl.plan()?
        };
        #[cfg(not(unix))]
        let plan = ssl.plan()?;
        let tls = match plan {
            None => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                Tls::Off
            }
            Some(plan) => {
                config.ssl_mode(if plan.required {
                    tokio_postgres::config::SslMode::Require
                } else {
                    tokio_postgres::config::SslMode::Prefer
                });
                Tls::Rustls(rustls_connector(&plan)?)
            }
        };
        Ok(Connector { config, tls })
    }

    fn database(&self) -> &str {
        self.config.get_dbname().unwrap_or(DEFAULT_DATABASE)
    }

    /// Where this connects to, for messages: hosts, database, user.
    pub(super) fn describe(&self) -> String {
        let ports = self.config.get_ports();
        let mut hosts = Vec::new();
        let names = self.config.get_hosts();
        let count = names.len().max(self.config.get_hostaddrs().len());
        for i in 0..count {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            let host = match (names.get(i), self.config.get_hostaddrs().get(i)) {
                (_, Some(addr)) => format!("{addr}:{port}"),
                (Some(tokio_postgres::config::Host::Tcp(name)), None) => format!("{name}:{port}"),
                #[cfg(unix)]
                (Some(tokio_postgres::config::Host::Unix(dir)), None) => {
                    format!("{} (Unix socket, port {port})", dir.display())
                }
                (None, None) => continue,
            };
            hosts.push(host);
        }
        let mut text = format!("{}, database {:?}", hosts.join(", "), self.database());
        if let Some(user) = self.config.get_user() {
            let _ = write!(text, ", user {user:?}");
        }
        if matches!(self.tls, Tls::Rustls(_)) {
            text.push_str(", TLS");
        }
        text
    }

    /// Opens one connection and drives it on its own task, which passes
    /// its notifications to `notify` and ends when the client is dropped.
    pub(super) async fn connect(
        &self,
        notify: Option<NotifyTarget>,
    ) -> Result<(Client, JoinHandle<()>), tokio_postgres::Error> {
        match &self.tls {
            Tls::Off => {
                let (client, connection) = self.config.connect(NoTls).await?;
                Ok((client, spawn_driver(connection, notify)))
            }
            Tls::Rustls(tls) => {
                let (client, connection) = self.config.connect(tls.clone()).await?;
                Ok((client, spawn_driver(connection, notify)))
            }
        }
    }

    pub(super) fn manager(&self, config: ManagerConfig) -> Manager {
        match &self.tls {
            Tls::Off => Manager::from_config(self.config.clone(), NoTls, config),
            Tls::Rustls(tls) => Manager::from_config(self.config.clone(), tls.clone(), config),
        }
    }

    /// The first connection: waits up to `patience` for the server to
    /// accept connections and creates the database if it does not exist.
    pub(super) async fn connect_at_startup(&self, patience: Duration) -> anyhow::Result<Client> {
        let started = Instant::now();
        let deadline = started + patience;
        let mut delay = Duration::from_millis(250);
        let mut created = false;
        loop {
            let error = match self.connect(None).await {
                Ok((client, _driver)) => return Ok(client),
                Err(error) => error,
            };
            if error.code() == Some(&SqlState::INVALID_CATALOG_NAME) && !created {
                self.create_database().await?;
                created = true;
                continue;
            }
            if !is_transient(&error) {
                bail!(
                    "cannot connect to {}: {}",
                    self.describe(),
                    describe(&error)
                );
            }
            let now = Instant::now();
            if now >= deadline {
                bail!(
                    "cannot connect to {} ({}): {}",
                    self.describe(),
                    crate::backend::gave_up_after_text(started.elapsed()),
                    describe(&error)
                );
            }
            // The last wait is cut short so that one more attempt falls at the deadline.
            let delay_now = delay.min(deadline - now);
            tracing::warn!(
                "cannot connect to {}, retrying in {delay_now:?}: {}",
                self.describe(),
                describe(&error)
            );
            tokio::time::sleep(delay_now).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    /// Creates the database from the `postgres` maintenance database (or
    /// `template1` where there is none). Another instance creating it at the
    /// same moment is fine.
    async fn create_database(&self) -> anyhow::Result<()> {
        let name = self.database().to_string();
        let mut last_error = None;
        for admin in ["postgres", "template1"] {
            let mut connector = self.clone();
            connector.config.dbname(admin);
            let client = match connector.connect(None).await {
                Ok((client, _driver)) => client,
                Err(error) if error.code() == Some(&SqlState::INVALID_CATALOG_NAME) => {
                    last_error = Some(error);
                    continue;
                }
                Err(error) => {
                    bail!(
                        "database {name:?} does not exist, and cannot connect to {} to create \
                         it: {}",
                        connector.describe(),
                        describe(&error)
                    )
                }
            };
            tracing::info!("creating Postgres database {name:?}");
            let sql = format!("CREATE DATABASE {}", quote_identifier(&name));
            return match client.batch_execute(&sql).await {
                Ok(()) => Ok(()),
                // A concurrent creator won: 42P04, or 23505 from pg_database's index.
                Err(error)
                    if matches!(
                        error.code(),
                        Some(&SqlState::DUPLICATE_DATABASE | &SqlState::UNIQUE_VIOLATION)
                    ) =>
                {
                    Ok(())
                }
                Err(error) => {
                    let hint = if error.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
                        " (create it, or grant the user CREATEDB)"
                    } else {
                        ""
                    };
                    bail!(
                        "database {name:?} does not exist and cannot be created{hint}: {}",
                        describe(&error)
                    )
                }
            };
        }
        let detail = last_error.map(|e| describe(&e)).unwrap_or_default();
        bail!(
            "database {name:?} does not exist, and there is no postgres or template1 database \
             to create it from: {detail}"
        )
    }
}

/// Where a LISTEN connection's notifications go.
#[derive(Clone)]
pub(super) struct NotifyTarget {
    /// Counts the commits of other instances.
    pub(super) changes: Arc<Notifications>,
    /// The payload of this instance's own NOTIFYs: its writer has published
    /// those commits already, and waking its followers for them would cost a
    /// read transaction each (issue 30). One it could not publish (the
    /// answer to its COMMIT lost) waits for the poll interval's bound.
    pub(super) own_payload: Arc<str>,
}

impl NotifyTarget {
    /// Counts `note` unless this instance sent it.
    fn deliver(&self, note: &Notification) {
        if note.channel() == CHANNEL && note.payload() != &*self.own_payload {
            self.changes.notify();
        }
    }
}

/// Drives `connection` on its own task; see [`Connector::connect`].
fn spawn_driver<S, T>(
    mut connection: tokio_postgres::Connection<S, T>,
    notify: Option<NotifyTarget>,
) -> JoinHandle<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(note))) => {
                    if let Some(notify) = &notify {
                        notify.deliver(&note);
                    }
                }
                Some(Ok(AsyncMessage::Notice(notice))) => {
                    tracing::debug!("Postgres: {}: {}", notice.severity(), notice.message());
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => {
                    tracing::debug!("Postgres connection ended: {}", describe(&error));
                    return;
                }
                None => return,
            }
        }
    })
}

/// Errors worth retrying: the server is not there (yet), not ready, or the
/// connection to it broke. Authentication and configuration errors are not.
pub(super) fn is_transient(error: &tokio_postgres::Error) -> bool {
    match error.code() {
        Some(code) => {
            [
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::TOO_MANY_CONNECTIONS,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
            ]
            .contains(code)
                // Class 08: connection exceptions.
                || code.code().starts_with("08")
        }
        // tokio-postgres exposes the error kind only through its message.
        None => matches!(
            error.to_string().as_str(),
            "error connecting to server"
                | "timeout waiting for server"
                | "error communicating with the server"
                | "connection closed"
        ),
    }
}

pub(super) fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Applies the embedded migrations, one instance at a time: refinery
/// itself does not guard against two instances starting together.
pub(super) async fn migrate(client: &mut Client) -> anyhow::Result<()> {
    let key = lock_key("migrations");
    client
        .batch_execute(&format!("SELECT pg_advisory_lock({key})"))
        .await
        .map_err(|e| db_error(&e))?;
    let report = embedded::migrations::runner().run_async(client).await;
    // The lock would go with the session anyway; release it for clarity.
    let _ = client
        .batch_execute(&format!("SELECT pg_advisory_unlock({key})"))
        .await;
    for migration in report?.applied_migrations() {
        tracing::info!("applied Postgres migration {migration}");
    }
    Ok(())
}
