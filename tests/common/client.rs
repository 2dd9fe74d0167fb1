//! Client connections to a test server: a plain gRPC channel, and the TLS
//! settings of a client of a server that serves TLS.

use std::time::Duration;

/// TLS settings of a client of a server that serves TLS: the CA its
/// certificate chains to, and the client's own certificate and key if any.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// PEM of the CA that signed the server's certificate.
    pub ca_pem: String,
    /// PEM certificate and key the client presents.
    pub identity: Option<(String, String)>,
}

impl ClientTls {
    /// tonic's client TLS settings; the server certificate must name `localhost`.
    pub fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem))
            .domain_name("localhost");
        if let Some((cert, key)) = &self.identity {
            config = config.identity(tonic::transport::Identity::from_pem(cert, key));
        }
        config
    }
}

/// `127.0.0.1:PORT`, the address a local test server listens on (the form etcdctl's
/// `--endpoints` takes).
pub fn local_addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// `http://127.0.0.1:PORT`, the gRPC endpoint URL of a local test server.
pub fn local_url(port: u16) -> String {
    format!("http://{}", local_addr(port))
}

/// A gRPC channel to `endpoint`, without a per-call timeout (it would also cut
/// long-lived watch streams); tests bound their own waits.
pub async fn channel(endpoint: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .expect("endpoint URL")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect {endpoint}: {e}"))
}
