//! kine's endpoint spelling: the DSN of Go's MySQL driver
//! (`[user[:password]@][net[(addr)]]/database[?params]`), taken apart as that
//! driver does.

use anyhow::{Context, anyhow, bail};

/// A Go-driver DSN taken apart (`[user[:pass]@][net[(addr)]]/db[?params]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GoDsn {
    pub(super) user: Option<String>,
    pub(super) pass: Option<String>,
    pub(super) address: Address,
    pub(super) database: Option<String>,
    pub(super) params: Vec<(String, String)>,
}

/// A server address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Address {
    /// Host name or IP address, and port.
    Tcp(String, u16),
    /// Path of a unix socket.
    Unix(String),
}

/// kine's endpoint when none is given: root over the usual socket.
pub(super) const KINE_DEFAULT_DSN: &str = "root@unix(/var/run/mysqld/mysqld.sock)/";

/// Go DSN parameters that change nothing here (the Go driver's own
/// settings, which kine users tend to carry along).
pub(super) const IGNORED_GO_PARAMS: &[&str] = &[
    "allowAllFiles",
    "allowCleartextPasswords",
    "allowNativePasswords",
    "allowOldPasswords",
    "charset",
    "checkConnLiveness",
    "clientFoundRows",
    "collation",
    "columnsWithAlias",
    "connectionAttributes",
    "interpolateParams",
    "loc",
    "maxAllowedPacket",
    "multiStatements",
    "parseTime",
    "readTimeout",
    "rejectReadOnly",
    "serverPubKey",
    "timeout",
    "writeTimeout",
];

impl GoDsn {
    /// Parses a DSN the way go-sql-driver/mysql's `ParseDSN` does: the
    /// database follows the last '/', the credentials end at the last '@'
    /// before it, the password starts at the first ':' (so it may hold '@',
    /// ':' and '/'); the password is taken verbatim, the database and the
    /// parameter values are percent-decoded.
    pub(super) fn parse(dsn: &str) -> anyhow::Result<Self> {
        let slash = dsn.rfind('/').ok_or_else(|| {
            anyhow!("no '/' before the database name (expected [user[:password]@]tcp(host:port)/database)")
        })?;
        let (left, right) = (&dsn[..slash], &dsn[slash + 1..]);
        let (credentials, server) = match left.rfind('@') {
            Some(at) => (Some(&left[..at]), &left[at + 1..]),
            None => (None, left),
        };
        let (user, pass) = match credentials {
            None => (None, None),
            Some(c) => match c.split_once(':') {
                Some((user, pass)) => (Some(user.to_string()), Some(pass.to_string())),
                None => (Some(c.to_string()), None),
            },
        };
        let (net, addr) = match server.find('(') {
            Some(open) => {
                let Some(addr) = server[open + 1..].strip_suffix(')') else {
                    bail!(
                        "the address in {server:?} must be enclosed in parentheses: tcp(host:port)"
                    );
                };
                (&server[..open], addr)
            }
            None => (server, ""),
        };
        let address = match net {
            "" | "tcp" | "tcp4" | "tcp6" if addr.is_empty() => {
                Address::Tcp("127.0.0.1".to_string(), 3306)
            }
            "" | "tcp" | "tcp4" | "tcp6" => parse_host_port(addr)?,
            "unix" if addr.is_empty() => Address::Unix("/tmp/mysql.sock".to_string()),
            "unix" => Address::Unix(addr.to_string()),
            other => bail!("unsupported network {other:?}; expected tcp(host:port) or unix(/path)"),
        };
        let (database, query) = match right.split_once('?') {
            Some((database, query)) => (database, Some(query)),
            None => (right, None),
        };
        let database = percent_encoding::percent_decode_str(database)
            .decode_utf8()
            .context("the database name is not valid UTF-8")?;
        let mut params = Vec::new();
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8()
                .with_context(|| format!("the value of {name} is not valid UTF-8"))?
                .into_owned();
            params.push((name.to_string(), value));
        }
        Ok(GoDsn {
            user: user.filter(|u| !u.is_empty()),
            pass,
            address,
            database: Some(database.into_owned()).filter(|d| !d.is_empty()),
            params,
        })
    }
}

/// `host:port`, `host`, `[v6]:port` or `[v6]`.
fn parse_host_port(addr: &str) -> anyhow::Result<Address> {
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| anyhow!("unclosed '[' in address {addr:?}"))?;
        (host, after.strip_prefix(':'))
    } else {
        match addr.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (addr, None),
        }
    };
    let port = match port {
        None => 3306,
        Some(port) => port
            .parse()
            .map_err(|_| anyhow!("invalid port {port:?} in address {addr:?}"))?,
    };
    if host.is_empty() {
        bail!("no host in address {addr:?}");
    }
    Ok(Address::Tcp(host.to_string(), port))
}

/// True if what follows `mysql://` is a Go DSN rather than a URL: the part
/// before the database is empty, ends with the credentials' '@', or names
/// the server as `net(addr)` (a URL's host cannot hold a '(').
pub(super) fn is_go_dsn(rest: &str) -> bool {
    let left = rest.rfind('/').map_or(rest, |slash| &rest[..slash]);
    let server = left.rfind('@').map_or(left, |at| &left[at + 1..]);
    rest.is_empty() || left.is_empty() || server.is_empty() || server.contains('(')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Address {
        Address::Tcp(host.to_string(), port)
    }

    #[test]
    fn go_dsn_parts() {
        let dsn =
            GoDsn::parse("user:pass@tcp(db.example:3307)/k8s?tls=true&parseTime=true").unwrap();
        assert_eq!(
            dsn,
            GoDsn {
                user: Some("user".into()),
                pass: Some("pass".into()),
                address: tcp("db.example", 3307),
                database: Some("k8s".into()),
                params: vec![
                    ("tls".into(), "true".into()),
                    ("parseTime".into(), "true".into())
                ],
            }
        );
        // The password runs from the first ':' to the last '@' before the last '/'.
        let dsn = GoDsn::parse("me:p@ss:w/rd@tcp(10.0.0.1)/db").unwrap();
        assert_eq!(dsn.user.as_deref(), Some("me"));
        assert_eq!(dsn.pass.as_deref(), Some("p@ss:w/rd"));
        assert_eq!(dsn.address, tcp("10.0.0.1", 3306));
        let dsn = GoDsn::parse("root@unix(/run/mysqld/mysqld.sock)/").unwrap();
        assert_eq!(dsn.address, Address::Unix("/run/mysqld/mysqld.sock".into()));
        assert_eq!(dsn.database, None);
        assert_eq!(dsn.pass, None);
        let dsn = GoDsn::parse("tcp([::1]:3310)/my%2Fdb").unwrap();
        assert_eq!(dsn.address, tcp("::1", 3310));
        assert_eq!(dsn.user, None);
        assert_eq!(dsn.database.as_deref(), Some("my/db"));
        let dsn = GoDsn::parse("u@/db").unwrap();
        assert_eq!(dsn.address, tcp("127.0.0.1", 3306));
        let dsn = GoDsn::parse("/").unwrap();
        assert_eq!((dsn.user, dsn.database), (None, None));
    }

    #[test]
    fn go_dsn_errors() {
        let error = |dsn: &str| format!("{:#}", GoDsn::parse(dsn).unwrap_err());
        assert!(error("root@tcp(host:3306)").contains("no '/'"));
        assert!(error("root@tcp(host:3306/db").contains("parentheses"));
        assert!(error("root@udp(host)/db").contains("unsupported network"));
        assert!(error("root@tcp(host:port)/db").contains("invalid port"));
        assert!(error("root@tcp(:3306)/db").contains("no host"));
    }
}
