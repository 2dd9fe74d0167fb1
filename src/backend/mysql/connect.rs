//! Reaching the server: connection attempts with retries while it starts,
//! which failures are worth retrying, the migrations, and identifier quoting
//! for the statements that create the database.

use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, DriverError, IoError, Opts, OptsBuilder, Pool, SslOpts};

use super::tls::Ssl;
use super::{db_error, lock_name};

mod migrations {
    refinery::embed_migrations!("migrations/mysql");
}

/// One connection attempt may take this long (mysql_async has no connect
/// timeout of its own, and a black-holed address would hang for minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Connects to the server, retrying connection failures until `retry_for`
/// has passed. Returns the connection and the TLS options that worked (a
/// `tls=preferred` endpoint drops TLS if the server has none).
pub(super) async fn connect_server(
    opts: OptsBuilder,
    mut ssl: Option<Ssl>,
    where_: &str,
    retry_for: Duration,
) -> anyhow::Result<(Conn, Option<SslOpts>)> {
    let started = Instant::now();
    let mut delay = Duration::from_millis(250);
    loop {
        let attempt = tokio::time::timeout(
            CONNECT_TIMEOUT,
            Conn::new(opts.clone().ssl_opts(ssl.clone().map(|s| s.opts))),
        )
        .await;
        let error = match attempt {
            Ok(Ok(conn)) => return Ok((conn, ssl.map(|s| s.opts))),
            Ok(Err(mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer)))
                if ssl.as_ref().is_some_and(|s| s.optional) =>
            {
                tracing::info!("{where_} offers no TLS; tls=preferred connects without it");
                ssl = None;
                continue;
            }
            Ok(Err(error)) if !retryable(&error) => {
                return Err(db_error(error).context(format!("cannot connect to MySQL at {where_}")));
            }
            Ok(Err(error)) => db_error(error),
            Err(_) => anyhow!("no answer within {CONNECT_TIMEOUT:?}"),
        };
        let elapsed = started.elapsed();
        if elapsed >= retry_for {
            return Err(error.context(format!(
                "cannot connect to MySQL at {where_} ({})",
                crate::backend::gave_up_after_text(elapsed)
            )));
        }
        // The last wait is cut short so that one more attempt falls at the deadline.
        let delay_now = delay.min(retry_for - elapsed);
        tracing::warn!("cannot connect to MySQL at {where_}, retrying in {delay_now:?}: {error:#}");
        tokio::time::sleep(delay_now).await;
        delay = (delay * 2).min(Duration::from_secs(4));
    }
}

/// True for failures that may go away: the server is down, starting,
/// restarting, not yet resolvable or full. Wrong credentials, TLS or URL
/// problems are final.
fn retryable(error: &mysql_async::Error) -> bool {
    use std::io::ErrorKind;
    match error {
        // rustls reports a certificate it refuses as invalid data.
        mysql_async::Error::Io(IoError::Io(e)) => !matches!(
            e.kind(),
            ErrorKind::InvalidData
                | ErrorKind::InvalidInput
                | ErrorKind::PermissionDenied
                | ErrorKind::Unsupported
        ),
        mysql_async::Error::Driver(DriverError::ConnectionClosed) => true,
        // Too many connections, server shutdown in progress.
        mysql_async::Error::Server(e) => matches!(e.code, 1040 | 1053),
        _ => false,
    }
}

/// Applies the migrations, one instance at a time.
pub(super) async fn migrate(pool: &Pool, opts: &Opts, database: &str) -> anyhow::Result<()> {
    // Instances starting together on a new database would race to create the
    // same tables; a named lock (released when this connection closes) makes
    // the others wait and then find the schema in place.
    let mut guard = Conn::new(opts.clone()).await.map_err(db_error)?;
    let name = lock_name(database, "migrations");
    let got: Option<Option<i64>> = guard
        .exec_first("SELECT GET_LOCK(?, 120)", (name.as_str(),))
        .await
        .map_err(db_error)?;
    if got.flatten() != Some(1) {
        bail!("another instance held the migration lock {name} for 2 minutes");
    }
    let mut pool = pool.clone();
    let report = migrations::migrations::runner().run_async(&mut pool).await;
    let _ = guard.disconnect().await;
    let report = report.context("cannot apply MySQL migrations")?;
    for migration in report.applied_migrations() {
        tracing::info!(database, "applied migration {migration}");
    }
    Ok(())
}

/// `name` as a quoted MySQL identifier.
pub(super) fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}
