//! MySQL endpoints in either spelling, mysql_async's URL or kine's Go DSN,
//! turned into connection options, the database name and the `tls=`
//! request; the password is hidden from messages.

use std::borrow::Cow;

use anyhow::{Context, bail};
use mysql_async::{Opts, OptsBuilder};

use super::DEFAULT_DATABASE;
use super::dsn::{Address, GoDsn, IGNORED_GO_PARAMS, KINE_DEFAULT_DSN, is_go_dsn};

/// Where and how to reach the server, parsed from an endpoint.
#[derive(Clone)]
pub(super) struct Endpoint {
    /// Address, credentials and connection options; no database.
    pub(super) opts: OptsBuilder,
    /// The database holding the store.
    pub(super) database: String,
    /// TLS as the endpoint asks for it (`tls=` parameter).
    pub(super) tls: TlsParam,
}

/// The `tls` parameter of an endpoint, as kine and the Go driver read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum TlsParam {
    /// Not given: TLS only if certificate files are given (or `require_ssl`).
    #[default]
    Unset,
    /// `tls=false`.
    Off,
    /// `tls=true`: TLS, verifying the server.
    Verify,
    /// `tls=skip-verify`: TLS without checking the server's certificate.
    SkipVerify,
    /// `tls=preferred`: TLS without verification if the server offers it.
    Preferred,
    /// `tls=custom`: TLS with the `--datastore-*file` files (kine adds this).
    Custom,
}

impl TlsParam {
    fn parse(value: &str) -> anyhow::Result<Self> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "true" | "1" => TlsParam::Verify,
            "false" | "0" => TlsParam::Off,
            "skip-verify" => TlsParam::SkipVerify,
            "preferred" => TlsParam::Preferred,
            "custom" => TlsParam::Custom,
            _ => {
                bail!("unknown tls={value}; expected true, false, skip-verify, preferred or custom")
            }
        })
    }
}

impl Endpoint {
    /// Parses a `mysql://` endpoint in either spelling:
    ///
    /// - URL: `mysql://user:pass@host:3306/db?options`, user and password
    ///   percent-encoded, options as mysql_async reads them (`socket=`,
    ///   `require_ssl=`, `pool_max=`...) plus `tls=`;
    /// - Go DSN, as kine takes it: `mysql://user:pass@tcp(host:3306)/db`,
    ///   `mysql://user@unix(/run/mysqld/mysqld.sock)/db`, `mysql://user@/db`
    ///   (127.0.0.1:3306), with `tls=true|false|skip-verify|preferred|custom`
    ///   and the Go driver's other parameters (ignored); plain `mysql://` is
    ///   kine's default, root over /var/run/mysqld/mysqld.sock.
    ///
    /// Without a database the store lives in `kubernetes`, as with kine.
    pub(super) fn parse(endpoint: &str) -> anyhow::Result<Self> {
        let endpoint = endpoint.trim();
        let Some(rest) = endpoint.strip_prefix("mysql://") else {
            bail!("not a MySQL endpoint (expected mysql://...)");
        };
        if is_go_dsn(rest) {
            let dsn = if rest.is_empty() {
                KINE_DEFAULT_DSN
            } else {
                rest
            };
            Self::from_go_dsn(dsn)
                .with_context(|| format!("invalid MySQL endpoint {}", redact(endpoint)))
        } else {
            Self::from_url(endpoint)
                .with_context(|| format!("invalid MySQL endpoint {}", redact(endpoint)))
        }
    }

    // The host (or `tcp(...)`) an endpoint names is the one connected to:
    // mysql_async's default `prefer_socket` asks the server for its socket
    // after connecting and moves there when the path exists here, which
    // bypasses host-based grants and TLS. Only `unix(...)`, `socket=` (or an
    // explicit `prefer_socket=true` in a URL) use a socket.
    fn from_go_dsn(dsn: &str) -> anyhow::Result<Self> {
        let dsn = GoDsn::parse(dsn)?;
        let mut opts = OptsBuilder::default().user(dsn.user).pass(dsn.pass);
        opts = match dsn.address {
            Address::Tcp(host, port) => opts
                .ip_or_hostname(host)
                .tcp_port(port)
                .prefer_socket(false),
            Address::Unix(path) => opts.socket(Some(path)),
        };
        let mut tls = TlsParam::Unset;
        for (name, value) in dsn.params {
            if name == "tls" {
                tls = TlsParam::parse(&value)?;
            } else if !IGNORED_GO_PARAMS.contains(&name.as_str()) {
                tracing::warn!("ignoring unknown MySQL endpoint parameter {name}");
            }
        }
        Ok(Endpoint {
            opts,
            database: dsn.database.unwrap_or_else(|| DEFAULT_DATABASE.to_string()),
            tls,
        })
    }

    fn from_url(url: &str) -> anyhow::Result<Self> {
        // mysql_async refuses parameters it does not know, so `tls` (kine's
        // spelling, also accepted here) is taken out first. The password is
        // percent-encoded in a URL, so the first '?' starts the query.
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut tls = TlsParam::Unset;
        let mut others = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("tls", value)) => {
                    tls = TlsParam::parse(
                        &percent_encoding::percent_decode_str(value).decode_utf8_lossy(),
                    )?;
                }
                _ => others.push(pair),
            }
        }
        let url = if others.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", others.join("&"))
        };
        let opts = Opts::from_url(&url)?;
        let database = opts
            .db_name()
            .map_or_else(|| DEFAULT_DATABASE.to_string(), str::to_string);
        let mut builder = OptsBuilder::from_opts(opts).db_name(None::<String>);
        if !others.iter().any(|pair| pair.starts_with("prefer_socket=")) {
            builder = builder.prefer_socket(false);
        }
        Ok(Endpoint {
            opts: builder,
            database,
            tls,
        })
    }

    /// The server and database, for messages (no password).
    pub(super) fn describe(&self) -> String {
        let opts = Opts::from(self.opts.clone());
        let user = opts.user().unwrap_or("(no user)");
        match opts.socket() {
            Some(socket) => format!("unix:{socket} as {user}, database {}", self.database),
            None => format!(
                "{}:{} as {user}, database {}",
                opts.ip_or_hostname(),
                opts.tcp_port(),
                self.database
            ),
        }
    }
}

// By hand: mysql_async's options would print the password.
impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("server", &self.describe())
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

/// `endpoint` with the password blanked out, for messages.
fn redact(endpoint: &str) -> Cow<'_, str> {
    let Some(rest) = endpoint.strip_prefix("mysql://") else {
        return Cow::Borrowed(endpoint);
    };
    let left = rest.rfind('/').map_or(rest, |slash| &rest[..slash]);
    match left
        .rfind('@')
        .and_then(|at| left[..at].find(':').map(|colon| (colon, at)))
    {
        Some((colon, at)) => Cow::Owned(format!("mysql://{}:***{}", &rest[..colon], &rest[at..])),
        None => Cow::Borrowed(endpoint),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(endpoint: &Endpoint) -> Opts {
        Opts::from(endpoint.opts.clone())
    }

    #[test]
    fn endpoints_in_go_form() {
        let e = Endpoint::parse("mysql://k3s:secret@tcp(mysql.local:3307)/kine?tls=skip-verify")
            .unwrap();
        let o = opts(&e);
        assert_eq!((o.ip_or_hostname(), o.tcp_port()), ("mysql.local", 3307));
        assert_eq!((o.user(), o.pass()), (Some("k3s"), Some("secret")));
        assert_eq!(
            o.db_name(),
            None,
            "the database is chosen after creating it"
        );
        assert_eq!(e.database, "kine");
        assert_eq!(e.tls, TlsParam::SkipVerify);
        assert!(!o.prefer_socket(), "tcp(...) stays on TCP");

        let e = Endpoint::parse("mysql://root@unix(/run/mysqld/mysqld.sock)/").unwrap();
        assert_eq!(opts(&e).socket(), Some("/run/mysqld/mysqld.sock"));
        assert_eq!(e.database, DEFAULT_DATABASE);

        let e = Endpoint::parse("mysql://").unwrap();
        assert_eq!(opts(&e).socket(), Some("/var/run/mysqld/mysqld.sock"));
        assert_eq!(opts(&e).user(), Some("root"));

        let e = Endpoint::parse("mysql://u@/db").unwrap();
        assert_eq!(opts(&e).ip_or_hostname(), "127.0.0.1");
        assert_eq!(e.database, "db");
    }

    #[test]
    fn endpoints_in_url_form() {
        let e = Endpoint::parse(
            "mysql://u:p%40ss@db.example:3308/store?pool_min=1&pool_max=5&tls=true",
        )
        .unwrap();
        let o = opts(&e);
        assert_eq!((o.ip_or_hostname(), o.tcp_port()), ("db.example", 3308));
        assert_eq!((o.user(), o.pass()), (Some("u"), Some("p@ss")));
        assert_eq!(o.pool_opts().constraints().max(), 5);
        assert_eq!(e.database, "store");
        assert_eq!(e.tls, TlsParam::Verify);
        assert!(!o.prefer_socket(), "a URL's host stays on TCP");
        let e = Endpoint::parse("mysql://root@localhost/db?prefer_socket=true").unwrap();
        assert!(opts(&e).prefer_socket(), "unless the URL asks otherwise");

        let e = Endpoint::parse("mysql://root@127.0.0.1:3306/").unwrap();
        assert_eq!(e.database, DEFAULT_DATABASE);
        assert_eq!(e.tls, TlsParam::Unset);
        let e = Endpoint::parse("mysql://root@localhost").unwrap();
        assert_eq!(e.database, DEFAULT_DATABASE);

        let e = Endpoint::parse("mysql://root@localhost/db?socket=%2Ftmp%2Fm.sock").unwrap();
        assert_eq!(opts(&e).socket(), Some("/tmp/m.sock"));

        let e = Endpoint::parse("mysql://root@localhost/db?require_ssl=true").unwrap();
        assert!(opts(&e).ssl_opts().is_some());
    }

    #[test]
    fn endpoint_errors_name_the_problem_without_the_password() {
        let error = |url: &str| format!("{:#}", Endpoint::parse(url).unwrap_err());
        let message = error("mysql://u:hunter2@host/db?bogus=1");
        assert!(message.contains("bogus"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let message = error("mysql://u:hunter2@tcp(host:x)/db");
        assert!(message.contains("invalid port"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        let message = error("mysql://u:hunter2@tcp(host:3306/db");
        assert!(message.contains("parentheses"), "{message}");
        assert!(!message.contains("hunter2"), "{message}");
        assert!(error("mysql://h/db?tls=maybe").contains("unknown tls=maybe"));
        assert!(error("postgres://h/db").contains("not a MySQL endpoint"));
    }
}
