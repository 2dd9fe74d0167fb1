//! Postgres URLs: the libpq TLS options taken out, kine's defaults filled
//! in, the password hidden from messages.

use std::time::Duration;

use anyhow::{anyhow, bail};
use tokio_postgres::Config;

use super::tls::{SslMode, SslRequest};
use super::{DEFAULT_DATABASE, describe};
use crate::backend::datastore::DatastoreTls;

/// Connect timeout when the URL sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A parsed URL: the driver's settings and the TLS request.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) config: Config,
    pub(super) ssl: SslRequest,
}

impl Target {
    /// Parses `url`, taking out the libpq TLS options tokio-postgres does not
    /// know and passing every other option through as written.
    pub(super) fn parse(url: &str, files: &DatastoreTls) -> anyhow::Result<Self> {
        let url = url.trim();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            bail!(
                "invalid Postgres URL {}: expected postgres://... or postgresql://...",
                redact(url)
            );
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let invalid = |message: String| anyhow!("invalid Postgres URL {}: {message}", redact(url));
        let mut ssl = SslRequest::default();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = || {
                percent_encoding::percent_decode_str(value)
                    .decode_utf8()
                    .map(|v| v.into_owned())
                    .map_err(|_| invalid(format!("option {key} is not UTF-8")))
            };
            match key {
                "sslmode" => {
                    ssl.mode = Some(SslMode::parse(&value()?).map_err(|e| invalid(e.to_string()))?)
                }
                "sslrootcert" => ssl.ca = Some(value()?.into()),
                "sslcert" => ssl.cert = Some(value()?.into()),
                "sslkey" => ssl.key = Some(value()?.into()),
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let mut config: Config = rest.parse().map_err(|e| invalid(describe(&e)))?;

        // Files named in the URL win over the flags, as in kine.
        ssl.ca = ssl.ca.or_else(|| files.ca_file.clone());
        ssl.cert = ssl.cert.or_else(|| files.cert_file.clone());
        ssl.key = ssl.key.or_else(|| files.key_file.clone());

        if config.get_dbname().is_none_or(str::is_empty) {
            config.dbname(DEFAULT_DATABASE);
        }
        // libpq would try a Unix socket, Go's lib/pq (kine) localhost.
        if config.get_hosts().is_empty() && config.get_hostaddrs().is_empty() {
            config.host("localhost");
        }
        if config.get_application_name().is_none() {
            config.application_name("cetera");
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        Ok(Target { config, ssl })
    }
}

/// `url` with its password hidden, for messages.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_default_to_the_kubernetes_database_and_keep_their_options() {
        let none = DatastoreTls::default();
        let target = Target::parse("postgres://u:secret@db.example:6432", &none).unwrap();
        assert_eq!(target.config.get_dbname(), Some(DEFAULT_DATABASE));
        assert_eq!(target.config.get_user(), Some("u"));
        assert_eq!(target.config.get_ports(), &[6432]);
        let target = Target::parse("postgres://db.example/", &none).unwrap();
        assert_eq!(target.config.get_dbname(), Some(DEFAULT_DATABASE));

        let target = Target::parse(
            "postgresql://u@db.example/k3s?sslmode=disable&connect_timeout=5&application_name=x",
            &none,
        )
        .unwrap();
        assert_eq!(target.config.get_dbname(), Some("k3s"));
        assert_eq!(
            target.config.get_connect_timeout(),
            Some(&Duration::from_secs(5))
        );
        assert_eq!(target.config.get_application_name(), Some("x"));
        assert_eq!(target.ssl.mode, Some(SslMode::Disable));
        assert_eq!(target.ssl.plan().unwrap(), None);

        let target = Target::parse("postgres:///k3s?host=/var/run/postgresql", &none).unwrap();
        assert_eq!(
            target.config.get_hosts(),
            &[tokio_postgres::config::Host::Unix(
                "/var/run/postgresql".into()
            )]
        );
        let target = Target::parse("postgres://%2Ftmp/k3s", &none).unwrap();
        assert_eq!(
            target.config.get_hosts(),
            &[tokio_postgres::config::Host::Unix("/tmp".into())]
        );
        // No host at all: localhost, as kine.
        let target = Target::parse("postgres:///k3s", &none).unwrap();
        assert_eq!(
            target.config.get_hosts(),
            &[tokio_postgres::config::Host::Tcp("localhost".into())]
        );
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        let none = DatastoreTls::default();
        let error = Target::parse("postgres://u:hunter2@h/db?bogus=1", &none)
            .unwrap_err()
            .to_string();
        assert!(error.contains("bogus"), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
        assert!(error.contains("u:***@h/db"), "{error}");
        let error = Target::parse("postgres://h/db?sslmode=sometimes", &none)
            .unwrap_err()
            .to_string();
        assert!(error.contains("sometimes"), "{error}");
        assert!(Target::parse("mysql://h/db", &none).is_err());
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("postgres://u:p@ss@h?x=1"), "postgres://u:***@h?x=1");
    }
}
