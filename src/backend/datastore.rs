//! Which datastore an `--endpoint` names, and the TLS files for reaching a
//! database server: what the backends are opened with.

use std::path::PathBuf;

use anyhow::bail;

/// A parsed `--endpoint`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Datastore {
    /// An SQLite database file.
    Sqlite(PathBuf),
    /// A PostgreSQL URL (`postgres://` or `postgresql://`), as given.
    Postgres(String),
    /// A MySQL/MariaDB URL (`mysql://`, URL or Go DSN form), as given.
    Mysql(String),
}

/// TLS files for the connection to the database server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatastoreTls {
    /// CA certificate (PEM) the server's certificate must chain to.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM).
    pub cert_file: Option<PathBuf>,
    /// Client key (PEM).
    pub key_file: Option<PathBuf>,
}

impl Datastore {
    /// Parses an endpoint string.
    pub fn parse(endpoint: &str) -> anyhow::Result<Self> {
        let endpoint = endpoint.trim();
        if let Some(rest) = endpoint.strip_prefix("sqlite://") {
            // kine accepts SQLite options after '?'; the path ends there.
            let path = rest.split('?').next().unwrap_or_default();
            if path.is_empty() {
                bail!("endpoint {endpoint:?} names no SQLite file");
            }
            return Ok(Datastore::Sqlite(PathBuf::from(path)));
        }
        if let Some((scheme, _)) = endpoint.split_once("://") {
            return match scheme {
                "postgres" | "postgresql" => Ok(Datastore::Postgres(endpoint.to_string())),
                "mysql" => Ok(Datastore::Mysql(endpoint.to_string())),
                _ => bail!(
                    "unknown endpoint scheme {scheme}://; expected sqlite://PATH, a file path, \
                     postgres://... or mysql://..."
                ),
            };
        }
        if endpoint.is_empty() {
            bail!("empty endpoint; expected sqlite://PATH or a file path");
        }
        Ok(Datastore::Sqlite(PathBuf::from(endpoint)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let sqlite = |p: &str| Datastore::Sqlite(PathBuf::from(p));
        assert_eq!(
            Datastore::parse("sqlite://./db/state.db").unwrap(),
            sqlite("./db/state.db")
        );
        assert_eq!(
            Datastore::parse("sqlite:///var/lib/x.db").unwrap(),
            sqlite("/var/lib/x.db")
        );
        assert_eq!(
            Datastore::parse("sqlite://db/state.db?_journal=WAL&cache=shared").unwrap(),
            sqlite("db/state.db")
        );
        assert_eq!(
            Datastore::parse("/tmp/state.db").unwrap(),
            sqlite("/tmp/state.db")
        );
        assert!(Datastore::parse("sqlite://").is_err());
        assert!(Datastore::parse("redis://x").is_err());
        assert!(Datastore::parse("").is_err());
    }
}
