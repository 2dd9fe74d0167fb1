//! TLS on the client port, configured with etcd's flags (`--cert-file`,
//! `--key-file`, `--trusted-ca-file`, `--client-cert-auth`).
//!
//! cetera accepts the TLS connections itself (tokio-rustls, ring provider)
//! rather than letting tonic do it, because the `:authority` repair in
//! `authority.rs` has to see the decrypted HTTP/2 bytes: the order is TCP
//! accept, TLS handshake, then the repair. Handshakes run on their own tasks,
//! so a slow or silent client never holds up the accept loop. tonic's
//! `Connected` impl for the TLS stream puts the peer's certificate chain in
//! every request's extensions (`TlsConnectInfo`), for a later mapping of the
//! certificate's CN to a user as etcd does.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::authority::AuthorityRepair;
use crate::config::Config;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Finished handshakes waiting for the HTTP/2 server to pick them up.
const READY_CONNECTIONS: usize = 64;

/// The TLS settings of the client port, or `None` when it serves plain text.
pub fn server_config(config: &Config) -> anyhow::Result<Option<Arc<ServerConfig>>> {
    let (cert_file, key_file) = match (&config.cert_file, &config.key_file) {
        (Some(cert), Some(key)) => (cert, key),
        (None, None) => {
            if config.client_cert_auth || config.trusted_ca_file.is_some() {
                bail!("--client-cert-auth and --trusted-ca-file need --cert-file and --key-file");
            }
            return Ok(None);
        }
        _ => bail!("--cert-file and --key-file go together"),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    // As etcd: client certificates are asked for only with --client-cert-auth.
    let builder = if config.client_cert_auth {
        let Some(ca_file) = &config.trusted_ca_file else {
            bail!("--client-cert-auth needs --trusted-ca-file");
        };
        let mut roots = RootCertStore::empty();
        for cert in read_certs(ca_file)? {
            roots
                .add(cert)
                .with_context(|| format!("bad CA certificate in {}", ca_file.display()))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .context("client certificate verifier")?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let key = PrivateKeyDer::from_pem_file(key_file)
        .with_context(|| format!("cannot read a private key from {}", key_file.display()))?;
    let mut tls = builder
        .with_single_cert(read_certs(cert_file)?, key)
        .with_context(|| {
            format!(
                "{} and {} do not make a usable certificate",
                cert_file.display(),
                key_file.display()
            )
        })?;
    // gRPC speaks HTTP/2; the JSON gateway and the health checks are also
    // asked over HTTP/1.1, which a client may be the only one to offer.
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(Arc::new(tls)))
}

/// Every certificate in a PEM file; an error if there is none.
fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("cannot read certificates from {}", path.display()))?;
    if certs.is_empty() {
        bail!("no certificate in {}", path.display());
    }
    Ok(certs)
}

/// Client connections of `listener` after their TLS handshake, ready for the
/// HTTP/2 server. Stops accepting once the stream is dropped (at shutdown).
pub fn connections(
    listener: TcpListener,
    tls: Arc<ServerConfig>,
) -> ReceiverStream<io::Result<AuthorityRepair<TlsStream<TcpStream>>>> {
    let acceptor = TlsAcceptor::from(tls);
    let (ready, incoming) = mpsc::channel(READY_CONNECTIONS);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = ready.closed() => return,
            };
            let (socket, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!("cannot accept a client connection: {error}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // gRPC answers are small writes; Nagle's algorithm would hold them back.
            let _ = socket.set_nodelay(true);
            let acceptor = acceptor.clone();
            let ready = ready.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                    Ok(Ok(stream)) => {
                        let _ = ready.send(Ok(AuthorityRepair::new(stream))).await;
                    }
                    // etcd logs these too ("rejected connection"); they are how a
                    // wrong certificate shows up on the server side.
                    Ok(Err(error)) => {
                        tracing::warn!(%peer, "rejected connection: TLS handshake failed: {error}")
                    }
                    Err(_) => tracing::warn!(%peer, "rejected connection: TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(incoming)
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_stream::StreamExt;
    use tonic::transport::server::Connected;

    use super::*;

    /// The bytes an HTTP/2 client opens with.
    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    /// A certificate (PEM) for localhost signed by `issuer`, with its key.
    fn issue(issuer: &Issuer<'_, KeyPair>, usage: ExtendedKeyUsagePurpose) -> (String, KeyPair) {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        (params.signed_by(&key, issuer).unwrap().pem(), key)
    }

    /// A client certificate survives to the connection info that tonic
    /// hands to every request, and the bytes pass through decrypted.
    #[tokio::test]
    async fn client_certificate_reaches_the_connection_info() {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_pem = ca_params.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca_params, ca_key);
        let (server_pem, server_key) = issue(&issuer, ExtendedKeyUsagePurpose::ServerAuth);
        let (client_pem, client_key) = issue(&issuer, ExtendedKeyUsagePurpose::ClientAuth);
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let config = Config::parse_from([
            "cetera".to_string(),
            "--cert-file".to_string(),
            file("server.pem", &server_pem),
            "--key-file".to_string(),
            file("server-key.pem", &server_key.serialize_pem()),
            "--trusted-ca-file".to_string(),
            file("ca.pem", &ca_pem),
            "--client-cert-auth".to_string(),
        ]);
        let tls = server_config(&config).unwrap().expect("TLS is on");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let mut incoming = connections(listener, tls);

        let mut roots = RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(client_pem.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(client_key.serialize_pem().as_bytes()).unwrap(),
        )
        .unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
        let client = tokio::spawn(async move {
            let socket = TcpStream::connect(address).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut stream = connector.connect(name, socket).await.unwrap();
            stream.write_all(PREFACE).await.unwrap();
            stream.flush().await.unwrap();
            stream
        });

        let mut accepted = incoming.next().await.unwrap().unwrap();
        let info = accepted.connect_info();
        let certs = info.peer_certs().expect("the client's certificate chain");
        assert_eq!(
            certs[0].as_ref(),
            CertificateDer::from_pem_slice(client_pem.as_bytes())
                .unwrap()
                .as_ref()
        );
        assert_eq!(info.get_ref().local_addr(), Some(address));
        // The HTTP/2 server reads the decrypted bytes, through the repair.
        let mut received = [0u8; PREFACE.len()];
        accepted.read_exact(&mut received).await.unwrap();
        assert_eq!(&received, PREFACE);
        drop(client.await.unwrap());
    }
}
