//! Opening any datastore named by an endpoint and running generic code on it,
//! so that serving and the one-off commands (`cetera restore`, `cetera
//! migrate`) are written once for every backend rather than once per backend.

use std::time::Duration;

use crate::backend::Backend;
use crate::backend::datastore::{Datastore, DatastoreTls};
use crate::backend::mysql::Mysql;
use crate::backend::postgres::Postgres;
use crate::backend::sqlite::Sqlite;

/// Work to do on an opened backend, whatever its type (a closure cannot be
/// generic over the backend, a trait method can).
pub trait BackendJob {
    /// What the job returns.
    type Output;
    /// Runs the job on `backend`.
    fn run<B: Backend>(self, backend: B) -> impl Future<Output = anyhow::Result<Self::Output>>;
}

/// How a datastore is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenFor {
    /// Read from: an SQLite file must already exist (opening would create it).
    Reading,
    /// Loaded in bulk: SQLite gets a large page cache.
    BulkLoad,
    /// Served: an instance sharing its database with others looks for
    /// their writes every `poll_interval` (at the latest).
    Serving {
        /// `--poll-interval`.
        poll_interval: Duration,
        /// As a member of a replicated cluster (SQLite only).
        replica: bool,
    },
}

/// Opens the datastore at `endpoint` (creating its schema if needed, as
/// serving does) and runs `job` on it.
pub async fn with_datastore<J: BackendJob>(
    endpoint: &str,
    tls: &DatastoreTls,
    open_for: OpenFor,
    job: J,
) -> anyhow::Result<J::Output> {
    match Datastore::parse(endpoint)? {
        Datastore::Sqlite(path) => {
            if open_for == OpenFor::Reading && !path.is_file() {
                anyhow::bail!("SQLite database {} does not exist", path.display());
            }
            let backend = match open_for {
                OpenFor::Serving { replica: true, .. } => Sqlite::open_replica(&path)?,
                _ => Sqlite::open(&path)?,
            };
            if open_for == OpenFor::BulkLoad {
                backend.prepare_bulk_load(false).await?;
            }
            tracing::info!(path = %path.display(), "opened SQLite datastore");
            job.run(backend).await
        }
        Datastore::Postgres(url) => {
            let mut backend = Postgres::connect(&url, tls).await?;
            if let OpenFor::Serving { poll_interval, .. } = open_for {
                backend.set_poll_interval(poll_interval);
            }
            tracing::info!("connected to PostgreSQL");
            job.run(backend).await
        }
        Datastore::Mysql(url) => {
            let mut backend = Mysql::connect(&url, tls).await?;
            if let OpenFor::Serving { poll_interval, .. } = open_for {
                backend.set_poll_interval(poll_interval);
            }
            tracing::info!("connected to MySQL");
            job.run(backend).await
        }
    }
}
