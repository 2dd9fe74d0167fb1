//! TLS on the client port, set up with etcd's flags, against real etcd 3.5.1
//! started with the same certificates: every client case (etcdctl 3.5 and
//! 3.4 with and without certificates, a certificate from another CA, a
//! plain-text client) must succeed or fail on cetera exactly as on etcd.
//!
//! The CA, server and client certificates are made in the test with rcgen.

mod common;

use std::path::{Path, PathBuf};

use cetera::proto::etcdserverpb::{PutRequest, kv_client::KvClient};
use common::certs::Ca;
use common::{Cetera, ClientTls, Etcd};
use rcgen::ExtendedKeyUsagePurpose;
use tempfile::TempDir;

/// The files of one test: a CA, a server certificate, a client certificate,
/// and a client certificate from another CA.
struct Pki {
    dir: TempDir,
    ca_pem: String,
    client: (String, String),
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("cetera-tls-")
            .tempdir()
            .unwrap();
        let ca = Ca::new("cetera test CA");
        let other = Ca::new("some other CA");
        let server = ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
        let client = ca.issue("root", ExtendedKeyUsagePurpose::ClientAuth);
        let stranger = other.issue("root", ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", &ca.pem);
        write("server.pem", &server.0);
        write("server-key.pem", &server.1);
        write("client.pem", &client.0);
        write("client-key.pem", &client.1);
        write("stranger.pem", &stranger.0);
        write("stranger-key.pem", &stranger.1);
        Pki {
            ca_pem: ca.pem,
            client,
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// Server flags, the same for cetera and etcd.
    fn server_flags(&self, client_cert_auth: bool) -> Vec<String> {
        let mut flags = vec![
            "--cert-file".to_string(),
            self.path("server.pem"),
            "--key-file".to_string(),
            self.path("server-key.pem"),
        ];
        if client_cert_auth {
            flags.extend([
                "--trusted-ca-file".to_string(),
                self.path("ca.pem"),
                "--client-cert-auth".to_string(),
            ]);
        }
        flags
    }

    /// How the harness's readiness probe connects: with the client
    /// certificate, which every server configuration here accepts.
    fn probe(&self) -> ClientTls {
        ClientTls {
            ca_pem: self.ca_pem.clone(),
            identity: Some(self.client.clone()),
        }
    }
}

/// One way of connecting with etcdctl.
struct Case {
    name: &'static str,
    https: bool,
    args: Vec<String>,
}

fn cases(pki: &Pki) -> Vec<Case> {
    let cacert = format!("--cacert={}", pki.path("ca.pem"));
    let identity = |cert: &str, key: &str| {
        vec![
            cacert.clone(),
            format!("--cert={}", pki.path(cert)),
            format!("--key={}", pki.path(key)),
        ]
    };
    vec![
        Case {
            name: "CA only, no client certificate",
            https: true,
            args: vec![cacert.clone()],
        },
        Case {
            name: "client certificate from the CA",
            https: true,
            args: identity("client.pem", "client-key.pem"),
        },
        Case {
            name: "client certificate from another CA",
            https: true,
            args: identity("stranger.pem", "stranger-key.pem"),
        },
        Case {
            name: "plain text to the TLS port",
            https: false,
            args: Vec::new(),
        },
    ]
}

/// Runs every case with `etcdctl` against the server on `port`: a put, a get
/// that must return it, and `endpoint status` (a Maintenance call, whose
/// `:authority` etcdctl 3.4 mangles). True where all three worked.
fn outcomes(etcdctl: &Path, port: u16, pki: &Pki) -> Vec<(&'static str, bool)> {
    cases(pki)
        .into_iter()
        .map(|case| {
            let scheme = if case.https { "https" } else { "http" };
            let endpoint = format!("{scheme}://127.0.0.1:{port}");
            let run = |command: &[&str]| {
                let mut args: Vec<&str> = case.args.iter().map(String::as_str).collect();
                args.extend(["--dial-timeout=2s", "--command-timeout=3s"]);
                args.extend(command);
                common::run_etcdctl(etcdctl, &endpoint, &args)
            };
            let put = run(&["put", "tls-key", case.name]);
            let ok = put.status.success() && {
                let get = run(&["get", "tls-key", "--print-value-only"]);
                let status = run(&["endpoint", "status"]);
                get.status.success()
                    && String::from_utf8_lossy(&get.stdout).trim() == case.name
                    && status.status.success()
            };
            (case.name, ok)
        })
        .collect()
}

/// The etcdctl binaries that are installed, with their names.
fn etcdctls() -> Vec<(&'static str, PathBuf)> {
    let mut found = Vec::new();
    if let Some(path) = common::etcdctl_35() {
        found.push(("etcdctl 3.5", path));
    }
    if let Some(path) = common::etcdctl_34() {
        found.push(("etcdctl 3.4", path));
    }
    found
}

/// Starts cetera and etcd with the same TLS flags and checks that every
/// client case gets the same outcome from both, and the expected one.
async fn same_outcomes_as_etcd(client_cert_auth: bool, expected: &[(&str, bool)]) {
    let pki = Pki::new();
    let flags = pki.server_flags(client_cert_auth);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let Some(etcd) = Etcd::start_tls(&flags, pki.probe()).await else {
        return;
    };
    let cetera = Cetera::start_tls(&flags, pki.probe()).await;
    for (label, etcdctl) in etcdctls() {
        let on_etcd = outcomes(&etcdctl, etcd.port(), &pki);
        let on_cetera = outcomes(&etcdctl, cetera.port(), &pki);
        assert_eq!(
            on_cetera, on_etcd,
            "{label}, --client-cert-auth={client_cert_auth}: cetera (left) and etcd (right) differ"
        );
        assert_eq!(on_cetera, expected, "{label}: unexpected outcomes");
    }
}

#[tokio::test]
async fn server_tls_behaves_as_etcd() {
    same_outcomes_as_etcd(
        false,
        &[
            ("CA only, no client certificate", true),
            ("client certificate from the CA", true),
            // Without --client-cert-auth no client certificate is asked for.
            ("client certificate from another CA", true),
            ("plain text to the TLS port", false),
        ],
    )
    .await;
}

#[tokio::test]
async fn client_cert_auth_behaves_as_etcd() {
    same_outcomes_as_etcd(
        true,
        &[
            ("CA only, no client certificate", false),
            ("client certificate from the CA", true),
            ("client certificate from another CA", false),
            ("plain text to the TLS port", false),
        ],
    )
    .await;
}

#[tokio::test]
async fn rust_client_over_tls_and_https_member_urls() {
    let pki = Pki::new();
    let flags = pki.server_flags(true);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cetera = Cetera::start_tls(&flags, pki.probe()).await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{}", cetera.port()))
            .unwrap()
            .tls_config(pki.probe().tonic_config())
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut kv = KvClient::new(channel);
    let put = kv
        .put(PutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let got = common::kv_fixtures::get(&mut kv, "k").await;
    assert_eq!(got.kvs[0].value, b"v");
    assert_eq!(got.kvs[0].mod_revision, put.header.unwrap().revision);

    // MemberList advertises https:// when the client port serves TLS.
    let Some(etcdctl) = common::etcdctl_35() else {
        return;
    };
    let list = common::run_etcdctl(
        &etcdctl,
        &format!("https://127.0.0.1:{}", cetera.port()),
        &[
            &format!("--cacert={}", pki.path("ca.pem")),
            &format!("--cert={}", pki.path("client.pem")),
            &format!("--key={}", pki.path("client-key.pem")),
            "member",
            "list",
        ],
    );
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "member list failed: {list:?}");
    assert!(
        text.contains(&format!("https://127.0.0.1:{}", cetera.port())),
        "member list: {text}"
    );
}

#[tokio::test]
async fn bad_tls_flags_fail_at_start() {
    let pki = Pki::new();
    let bin = env!("CARGO_BIN_EXE_cetera");
    let db = pki.path("state.db");
    for (args, message) in [
        (
            vec!["--cert-file", "server.pem"],
            "--cert-file and --key-file go together",
        ),
        (
            vec!["--client-cert-auth"],
            "--client-cert-auth and --trusted-ca-file need --cert-file and --key-file",
        ),
        (
            vec![
                "--cert-file",
                "server.pem",
                "--key-file",
                "server-key.pem",
                "--client-cert-auth",
            ],
            "--client-cert-auth needs --trusted-ca-file",
        ),
        (
            vec!["--cert-file", "missing.pem", "--key-file", "server-key.pem"],
            "cannot read certificates from",
        ),
    ] {
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if a.ends_with(".pem") {
                    pki.path(a)
                } else {
                    a.to_string()
                }
            })
            .collect();
        let out = std::process::Command::new(bin)
            .args(["--listen-address", "127.0.0.1:0", "--endpoint", &db])
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} started");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}
