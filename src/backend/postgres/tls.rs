//! TLS for Postgres connections: what libpq's `sslmode` and the TLS files
//! ask for, and the rustls connector (with its certificate verifiers) that
//! does it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values; tokio-postgres parses only three of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(value: &str) -> anyhow::Result<Self> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => bail!(
                "unknown sslmode {other:?}; expected disable, allow, prefer, require, \
                 verify-ca or verify-full"
            ),
        })
    }
}

/// What the URL and the TLS flags ask for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct SslRequest {
    /// `sslmode` from the URL, if given.
    pub(super) mode: Option<SslMode>,
    pub(super) ca: Option<PathBuf>,
    pub(super) cert: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
}

/// How much of the server's certificate is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verify {
    /// Encrypt only (libpq's `require` without a CA).
    Nothing,
    /// The chain must lead to a trusted CA; the name is not checked (`verify-ca`).
    Chain,
    /// Chain and host name (`verify-full`).
    Full,
}

/// The TLS connection to make, decided from an [`SslRequest`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TlsPlan {
    /// Fail rather than fall back to plain text when the server has no TLS.
    pub(super) required: bool,
    verify: Verify,
    /// CA bundle; the system's when `None`.
    ca: Option<PathBuf>,
    /// Client certificate and key.
    client: Option<(PathBuf, PathBuf)>,
}

impl SslRequest {
    /// `None` for a plain-text connection.
    ///
    /// Without TLS files and without `sslmode=require`/`verify-*` the
    /// connection is plain, as k3s users expect from their `?sslmode=disable`
    /// era. Files without an `sslmode` mean `verify-full`, as kine does;
    /// `require` with a CA checks the chain, as libpq does.
    pub(super) fn plan(&self) -> anyhow::Result<Option<TlsPlan>> {
        let has_files = self.ca.is_some() || self.cert.is_some() || self.key.is_some();
        let client = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            (Some(_), None) => {
                bail!("a client certificate needs its key (--datastore-keyfile or sslkey=)")
            }
            (None, Some(_)) => {
                bail!("a client key needs its certificate (--datastore-certfile or sslcert=)")
            }
        };
        let has_ca = self.ca.is_some();
        let (required, verify) = match self.mode {
            Some(SslMode::Disable) => {
                if has_files {
                    tracing::warn!("sslmode=disable: the datastore TLS files are not used");
                }
                return Ok(None);
            }
            None | Some(SslMode::Allow | SslMode::Prefer) if !has_files => return Ok(None),
            None => (true, Verify::Full),
            Some(SslMode::Allow | SslMode::Prefer) => (
                false,
                if has_ca {
                    Verify::Full
                } else {
                    Verify::Nothing
                },
            ),
            Some(SslMode::Require) => (
                true,
                if has_ca {
                    Verify::Chain
                } else {
                    Verify::Nothing
                },
            ),
            Some(SslMode::VerifyCa) => (true, Verify::Chain),
            Some(SslMode::VerifyFull) => (true, Verify::Full),
        };
        Ok(Some(TlsPlan {
            required,
            verify,
            ca: self.ca.clone(),
            client,
        }))
    }
}

/// The well-known places of the system's CA bundle (what OpenSSL and
/// rustls-native-certs look at on Linux and the BSDs).
const SYSTEM_CA_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

fn read_certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read certificates from {}", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

fn root_store(ca: Option<&Path>) -> anyhow::Result<RootCertStore> {
    let path = match ca {
        Some(path) => path.to_path_buf(),
        None => std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .or_else(|| {
                SYSTEM_CA_BUNDLES
                    .iter()
                    .map(PathBuf::from)
                    .find(|p| p.is_file())
            })
            .context(
                "verifying the server's certificate needs a CA: set --datastore-cafile or \
                 sslrootcert=, or install the system CA bundle",
            )?,
    };
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(read_certificates(&path)?);
    if added == 0 {
        bail!("{} holds no usable CA certificate", path.display());
    }
    Ok(roots)
}

/// Builds the rustls connector for `plan`.
pub(super) fn rustls_connector(plan: &TlsPlan) -> anyhow::Result<MakeRustlsConnect> {
    // An explicit provider: the process may link more than one rustls
    // backend, and then rustls has no default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("cannot set up TLS")?;
    let builder = match plan.verify {
        Verify::Full => builder.with_root_certificates(root_store(plan.ca.as_deref())?),
        Verify::Chain => {
            let chain = WebPkiServerVerifier::builder_with_provider(
                Arc::new(root_store(plan.ca.as_deref())?),
                provider.clone(),
            )
            .build()
            .context("cannot set up TLS certificate verification")?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Lenient {
                    chain: Some(chain),
                    provider,
                }))
        }
        Verify::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Lenient {
                chain: None,
                provider,
            })),
    };
    let mut config = match &plan.client {
        Some((cert, key)) => {
            let key = PrivateKeyDer::from_pem_file(key)
                .with_context(|| format!("cannot read the client key {}", key.display()))?;
            builder
                .with_client_auth_cert(read_certificates(cert)?, key)
                .context("the client certificate does not match its key")?
        }
        None => builder.with_no_client_auth(),
    };
    // Postgres 17 checks the ALPN name on direct TLS; older servers ignore it.
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(MakeRustlsConnect::new(config))
}

/// The verifier of the modes that check less than rustls would: `verify-ca`
/// (the chain must be trusted, the name may differ) and libpq's `require`
/// without a CA (encrypted, certificate not checked). The handshake
/// signatures are verified either way, so the session key is the server's.
#[derive(Debug)]
struct Lenient {
    /// The chain's verifier for `verify-ca`; `None` for `require`.
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    // As WebPkiServerVerifier checks them, with the same provider's algorithms.
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::datastore::DatastoreTls;
    use crate::backend::postgres::connect::Connector;
    use crate::backend::postgres::endpoint::Target;

    #[test]
    fn tls_follows_sslmode_and_the_files() {
        let plan = |url: &str, files: &DatastoreTls| Target::parse(url, files).unwrap().ssl.plan();
        let none = DatastoreTls::default();
        let ca = DatastoreTls {
            ca_file: Some("/ca.pem".into()),
            ..Default::default()
        };
        assert_eq!(plan("postgres://h/db", &none).unwrap(), None);
        assert_eq!(plan("postgres://h/db?sslmode=prefer", &none).unwrap(), None);
        let require = plan("postgres://h/db?sslmode=require", &none)
            .unwrap()
            .unwrap();
        assert_eq!((require.required, require.verify), (true, Verify::Nothing));
        let with_ca = plan("postgres://h/db?sslmode=require", &ca)
            .unwrap()
            .unwrap();
        assert_eq!(with_ca.verify, Verify::Chain);
        // Files and no sslmode: verify-full, as kine.
        let files_only = plan("postgres://h/db", &ca).unwrap().unwrap();
        assert_eq!(
            (files_only.required, files_only.verify),
            (true, Verify::Full)
        );
        assert_eq!(files_only.ca, Some("/ca.pem".into()));
        // The URL's files win over the flags.
        let url_ca = plan(
            "postgres://h/db?sslmode=verify-ca&sslrootcert=%2Fother.pem",
            &ca,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (url_ca.verify, url_ca.ca),
            (Verify::Chain, Some("/other.pem".into()))
        );
        assert_eq!(plan("postgres://h/db?sslmode=disable", &ca).unwrap(), None);
        let half = DatastoreTls {
            cert_file: Some("/c.pem".into()),
            ..Default::default()
        };
        assert!(plan("postgres://h/db", &half).is_err());
        // A CA file that is not there is reported by name.
        let error = Connector::new(Target::parse("postgres://h/db", &ca).unwrap())
            .err()
            .unwrap();
        assert!(format!("{error:#}").contains("/ca.pem"), "{error:#}");
    }
}
