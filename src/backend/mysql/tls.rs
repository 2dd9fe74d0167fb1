//! TLS for MySQL connections: the endpoint's `tls=` request combined with
//! the `--datastore-cafile`, `--datastore-certfile` and `--datastore-keyfile`
//! files.

use std::path::Path;

use anyhow::{Context, bail};
use mysql_async::{ClientIdentity, Opts, SslOpts};

use super::endpoint::{Endpoint, TlsParam};
use crate::backend::datastore::DatastoreTls;

/// TLS options for the connection and whether the server may refuse TLS.
#[derive(Clone, Debug)]
pub(super) struct Ssl {
    pub(super) opts: SslOpts,
    /// `tls=preferred`: fall back to plain text if the server has no TLS.
    pub(super) optional: bool,
}

/// Combines the endpoint's TLS request with the `--datastore-*file` files.
pub(super) fn ssl_opts(endpoint: &Endpoint, files: &DatastoreTls) -> anyhow::Result<Option<Ssl>> {
    let have_files =
        files.ca_file.is_some() || files.cert_file.is_some() || files.key_file.is_some();
    let from_url = Opts::from(endpoint.opts.clone()).ssl_opts().cloned();
    let mut ssl = match endpoint.tls {
        TlsParam::Off if have_files => {
            bail!("the MySQL endpoint says tls=false but TLS certificate files are given")
        }
        TlsParam::Off => return Ok(None),
        TlsParam::Unset if !have_files && from_url.is_none() => return Ok(None),
        TlsParam::Custom if !have_files => bail!(
            "the MySQL endpoint says tls=custom but no --datastore-cafile, \
             --datastore-certfile or --datastore-keyfile is given"
        ),
        TlsParam::SkipVerify | TlsParam::Preferred => from_url
            .unwrap_or_default()
            .with_danger_accept_invalid_certs(true)
            .with_danger_skip_domain_validation(true),
        _ => from_url.unwrap_or_default(),
    };
    if let Some(ca) = &files.ca_file {
        check_readable(ca, "--datastore-cafile")?;
        // Like the Go driver with a custom CA: trust only that CA.
        ssl = ssl
            .with_root_certs(vec![ca.clone().into()])
            .with_disable_built_in_roots(true);
    }
    match (&files.cert_file, &files.key_file) {
        (Some(cert), Some(key)) => {
            check_readable(cert, "--datastore-certfile")?;
            check_readable(key, "--datastore-keyfile")?;
            ssl = ssl.with_client_identity(Some(ClientIdentity::new(
                cert.clone().into(),
                key.clone().into(),
            )));
        }
        (None, None) => {}
        _ => bail!("a client certificate needs both --datastore-certfile and --datastore-keyfile"),
    }
    Ok(Some(Ssl {
        opts: ssl,
        optional: endpoint.tls == TlsParam::Preferred && !have_files,
    }))
}

/// Fails early, naming the flag, rather than at every connection attempt.
fn check_readable(path: &Path, flag: &str) -> anyhow::Result<()> {
    std::fs::File::open(path)
        .map(|_| ())
        .with_context(|| format!("cannot read {flag} {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_comes_from_files_or_the_endpoint() {
        let none = DatastoreTls::default();
        let plain = Endpoint::parse("mysql://root@tcp(h)/").unwrap();
        assert!(ssl_opts(&plain, &none).unwrap().is_none());
        let verify = Endpoint::parse("mysql://root@tcp(h)/?tls=true").unwrap();
        let ssl = ssl_opts(&verify, &none).unwrap().unwrap();
        assert!(!ssl.opts.accept_invalid_certs() && !ssl.optional);
        let preferred = Endpoint::parse("mysql://root@tcp(h)/?tls=preferred").unwrap();
        let ssl = ssl_opts(&preferred, &none).unwrap().unwrap();
        assert!(ssl.opts.accept_invalid_certs() && ssl.optional);

        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "").unwrap();
        let files = DatastoreTls {
            ca_file: Some(ca.clone()),
            ..Default::default()
        };
        let ssl = ssl_opts(&plain, &files).unwrap().unwrap();
        assert_eq!(ssl.opts.root_certs(), &[ca.clone().into()]);
        assert!(ssl.opts.disable_built_in_roots());

        let off = Endpoint::parse("mysql://root@tcp(h)/?tls=false").unwrap();
        assert!(ssl_opts(&off, &files).is_err());
        let custom = Endpoint::parse("mysql://root@tcp(h)/?tls=custom").unwrap();
        assert!(ssl_opts(&custom, &none).is_err());
        let half = DatastoreTls {
            cert_file: Some(ca),
            ..Default::default()
        };
        assert!(ssl_opts(&plain, &half).is_err());
        let missing = DatastoreTls {
            ca_file: Some(dir.path().join("nope.pem")),
            ..Default::default()
        };
        let message = format!("{:#}", ssl_opts(&plain, &missing).unwrap_err());
        assert!(message.contains("--datastore-cafile"), "{message}");
    }
}
