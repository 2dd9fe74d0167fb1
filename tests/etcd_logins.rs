//! JWT tokens and client-certificate (CommonName) logins, against real etcd
//! 3.5.1 started with the same keys and certificates: the same answers,
//! tokens that one server issued accepted by the other, tokens that survive
//! a restart, and etcdctl working with both.

mod common;

use std::path::Path;

use cetera::proto::etcdserverpb::auth_client::AuthClient;
use cetera::proto::etcdserverpb::kv_client::KvClient;
use cetera::proto::etcdserverpb::{
    AuthUserAddRequest, AuthenticateRequest, PutRequest, RangeRequest,
};
use common::certs::Ca;
use common::{Cetera, ClientTls, Etcd};
use etcd_client::{Client, Permission};
use rcgen::ExtendedKeyUsagePurpose;
use tempfile::TempDir;
use tonic::Request;

fn write(dir: &TempDir, name: &str, text: &[u8]) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// An RSA key pair made by openssl (PKCS#8 private key, SPKI public key).
fn rsa_keys(dir: &TempDir) -> (String, String) {
    let private = dir.path().join("rsa.pem");
    let public = dir.path().join("rsa.pub.pem");
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    run(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        private.to_str().unwrap(),
    ]);
    run(&[
        "pkey",
        "-in",
        private.to_str().unwrap(),
        "-pubout",
        "-out",
        public.to_str().unwrap(),
    ]);
    (private.display().to_string(), public.display().to_string())
}

/// A P-256 ECDSA key pair (PKCS#8 private key, SPKI public key).
fn ec_keys(dir: &TempDir) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    (
        write(dir, "ec.pem", key.serialize_pem().as_bytes()),
        write(dir, "ec.pub.pem", key.public_key_pem().as_bytes()),
    )
}

/// root (root role) and alice (read on `foo`), `foo` set, auth enabled.
async fn set_up_users(endpoint: &str) {
    let mut client = Client::connect([endpoint], None).await.unwrap();
    client.put("foo", "bar", None).await.unwrap();
    client.user_add("root", "rootpw", None).await.unwrap();
    client.user_grant_role("root", "root").await.unwrap();
    client.user_add("alice", "alicepw", None).await.unwrap();
    client.role_add("reader").await.unwrap();
    client
        .role_grant_permission("reader", Permission::read("foo"))
        .await
        .unwrap();
    client.user_grant_role("alice", "reader").await.unwrap();
    client.auth_enable().await.unwrap();
}

async fn authenticate(endpoint: &str, name: &str, password: &str) -> Result<String, String> {
    let mut auth = AuthClient::new(common::channel(endpoint).await);
    auth.authenticate(AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    })
    .await
    .map(|r| r.into_inner().token)
    .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
}

fn with_token<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("token", token.parse().unwrap());
    request
}

fn outcome<T>(result: Result<tonic::Response<T>, tonic::Status>) -> String {
    match result {
        Ok(_) => "ok".to_string(),
        Err(status) => format!("{:?}: {}", status.code(), status.message()),
    }
}

/// What alice's `token` gets on `endpoint`: a read she may do, a write
/// she may not.
async fn alice_outcomes(endpoint: &str, token: &str) -> Vec<String> {
    let mut kv = KvClient::new(common::channel(endpoint).await);
    let range = RangeRequest {
        key: b"foo".to_vec(),
        ..Default::default()
    };
    let put = PutRequest {
        key: b"foo".to_vec(),
        value: b"x".to_vec(),
        ..Default::default()
    };
    vec![
        outcome(kv.range(with_token(range, token)).await),
        outcome(kv.put(with_token(put, token)).await),
    ]
}

/// The JWT claims of a token, unchecked.
fn claims(token: &str) -> serde_json::Value {
    let mut unchecked = jsonwebtoken::Validation::default();
    unchecked.insecure_disable_signature_validation();
    unchecked.required_spec_claims.clear();
    jsonwebtoken::decode::<serde_json::Value>(
        token,
        &jsonwebtoken::DecodingKey::from_secret(b""),
        &unchecked,
    )
    .expect("JWT claims are JSON")
    .claims
}

fn etcdctl_out(etcdctl: &Path, endpoint: &str, args: &[&str]) -> String {
    let out = common::run_etcdctl(etcdctl, endpoint, args);
    common::normalize_etcdctl(&format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// One JWT sign method: the same answers from etcd and cetera, each
/// accepting the other's tokens, cetera's tokens valid across a restart,
/// and the auth revision check after a change, as etcd makes it.
async fn jwt_behaves_as_etcd(auth_token: &str) {
    let auth_flag = ["--auth-token", auth_token];
    let Some(etcd) = Etcd::start_with(&auth_flag).await else {
        return;
    };
    let mut cetera = Cetera::start_with(&auth_flag).await;
    for endpoint in [etcd.endpoint(), cetera.endpoint()] {
        set_up_users(&endpoint).await;
    }
    let from_etcd = authenticate(&etcd.endpoint(), "alice", "alicepw")
        .await
        .unwrap();
    let from_cetera = authenticate(&cetera.endpoint(), "alice", "alicepw")
        .await
        .unwrap();
    // etcd's claims, with the same auth revision on both.
    let (c, e) = (claims(&from_cetera), claims(&from_etcd));
    assert_eq!(c["username"], "alice");
    assert_eq!(c["revision"], e["revision"], "cetera {c} etcd {e}");
    let mut claim_names: Vec<_> = c.as_object().unwrap().keys().cloned().collect();
    claim_names.sort();
    assert_eq!(claim_names, ["exp", "revision", "username"]);
    let expected = vec![
        "ok".to_string(),
        "PermissionDenied: etcdserver: permission denied".to_string(),
    ];
    for (server, endpoint) in [("etcd", etcd.endpoint()), ("cetera", cetera.endpoint())] {
        for (issuer, token) in [("etcd", &from_etcd), ("cetera", &from_cetera)] {
            assert_eq!(
                alice_outcomes(&endpoint, token).await,
                expected,
                "{issuer}'s token on {server}"
            );
        }
    }
    // A token is not kept anywhere: it outlives the server that issued it.
    cetera.restart().await;
    assert_eq!(
        alice_outcomes(&cetera.endpoint(), &from_cetera).await,
        expected
    );
    // A damaged token is refused alike.
    let damaged = format!("{from_etcd}x");
    assert_eq!(
        alice_outcomes(&cetera.endpoint(), &damaged).await,
        alice_outcomes(&etcd.endpoint(), &damaged).await
    );
    // An auth change makes earlier tokens too old for keys, on both.
    for endpoint in [etcd.endpoint(), cetera.endpoint()] {
        let root = authenticate(&endpoint, "root", "rootpw").await.unwrap();
        let mut auth = AuthClient::new(common::channel(&endpoint).await);
        auth.user_add(with_token(
            AuthUserAddRequest {
                name: "bob".into(),
                password: "bobpw".into(),
                ..Default::default()
            },
            &root,
        ))
        .await
        .unwrap();
    }
    let after_etcd = alice_outcomes(&etcd.endpoint(), &from_etcd).await;
    let after_cetera = alice_outcomes(&cetera.endpoint(), &from_cetera).await;
    assert_eq!(after_cetera, after_etcd);
    assert_ne!(after_etcd, expected, "etcd kept accepting an old revision");
    // etcdctl logs in with a password and gets the same answers.
    if let Some(etcdctl) = common::etcdctl_35() {
        for args in [
            &["--user", "alice:alicepw", "get", "foo"][..],
            &["--user", "alice:alicepw", "put", "foo", "y"][..],
            &["--user", "root:rootpw", "put", "foo", "z"][..],
            &["--user", "root:rootpw", "get", "foo", "--print-value-only"][..],
        ] {
            assert_eq!(
                etcdctl_out(&etcdctl, &cetera.endpoint(), args),
                etcdctl_out(&etcdctl, &etcd.endpoint(), args),
                "etcdctl {args:?}"
            );
        }
    }
}

#[tokio::test]
async fn jwt_rs256_tokens_behave_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = rsa_keys(&dir);
    jwt_behaves_as_etcd(&format!(
        "jwt,pub-key={public},priv-key={private},sign-method=RS256,ttl=10m"
    ))
    .await;
}

#[tokio::test]
async fn jwt_es256_tokens_behave_as_etcds() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = ec_keys(&dir);
    jwt_behaves_as_etcd(&format!(
        "jwt,pub-key={public},priv-key={private},sign-method=ES256"
    ))
    .await;
}

/// With only the public key a server verifies tokens but cannot issue
/// them, as etcd; a bad option stops it at start.
#[tokio::test]
async fn jwt_verify_only_and_bad_options() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = rsa_keys(&dir);
    let signer = format!("jwt,pub-key={public},priv-key={private},sign-method=RS256");
    let verifier = format!("jwt,pub-key={public},sign-method=RS256");
    let Some(etcd) = Etcd::start_with(&["--auth-token", &verifier]).await else {
        return;
    };
    let cetera = Cetera::start_with(&["--auth-token", &verifier]).await;
    let signing = Cetera::start_with(&["--auth-token", &signer]).await;
    for endpoint in [etcd.endpoint(), cetera.endpoint(), signing.endpoint()] {
        set_up_users(&endpoint).await;
    }
    let on_etcd = authenticate(&etcd.endpoint(), "alice", "alicepw").await;
    let on_cetera = authenticate(&cetera.endpoint(), "alice", "alicepw").await;
    assert_eq!(on_cetera, on_etcd);
    assert!(on_etcd.is_err());
    // A token signed with the private key is good on both verifiers.
    let token = authenticate(&signing.endpoint(), "alice", "alicepw")
        .await
        .unwrap();
    assert_eq!(
        alice_outcomes(&cetera.endpoint(), &token).await,
        alice_outcomes(&etcd.endpoint(), &token).await
    );
    assert_eq!(alice_outcomes(&etcd.endpoint(), &token).await[0], "ok");

    for (options, message) in [
        ("jwt,sign-method=RS256", "auth: missing key data"),
        (
            "jwt,priv-key=/no/such/file,sign-method=RS256",
            "auth: invalid auth options",
        ),
        (
            &*format!("jwt,priv-key={private},sign-method=XX1"),
            "auth: invalid auth signature method",
        ),
        ("jwt,sign-method", "auth: invalid auth options"),
        ("nosuchkind", "auth: invalid auth options"),
    ] {
        let (status, output) = Cetera::refused_with(&["--auth-token", options]).await;
        assert!(!status.success(), "{options}");
        assert!(output.contains(message), "{options}: {output}");
    }
}

/// Token options etcd refuses are refused with etcd's message, before the
/// datastore is opened: no data file is created (etcd creates its data dir
/// first).
#[tokio::test]
async fn bad_token_options_stop_the_server_before_the_datastore_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let (private, public) = rsa_keys(&dir);
    let (ec_private, ec_public) = ec_keys(&dir);
    let other_dir = tempfile::tempdir_in(dir.path()).unwrap();
    let (_, other_public) = rsa_keys(&other_dir);
    let empty = write(&dir, "empty.pem", b"");
    let garbage = write(&dir, "garbage.pem", b"not a key\n");
    let cases = [
        format!("jwt,pub-key={empty},priv-key={empty},sign-method=RS256"),
        format!("jwt,priv-key={empty},sign-method=HS256"),
        format!("jwt,pub-key={empty},sign-method=ES256"),
        format!("jwt,priv-key={garbage},sign-method=RS256"),
        format!("jwt,pub-key={garbage},sign-method=RS256"),
        format!("jwt,pub-key={garbage},priv-key={private},sign-method=RS256"),
        format!("jwt,priv-key={garbage},sign-method=ES256"),
        format!("jwt,pub-key={public},priv-key={ec_private},sign-method=RS256"),
        format!("jwt,pub-key={ec_public},priv-key={private},sign-method=RS256"),
        format!("jwt,pub-key={public},sign-method=ES256"),
        "jwt,sign-method=PS384".to_string(),
        "jwt,priv-key=/no/such/file,sign-method=HS256".to_string(),
    ];
    for options in &cases {
        let Some((etcd_output, _)) = Etcd::refused_with(&["--auth-token", options]).await else {
            return;
        };
        // etcd's fatal line: `"level":"fatal",... "error":"<message>"`.
        let message = etcd_output
            .lines()
            .find(|line| line.contains("\"level\":\"fatal\""))
            .and_then(|line| line.split("\"error\":\"").nth(1))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{options}: no error from etcd:\n{etcd_output}"));
        let data = tempfile::tempdir().unwrap();
        let endpoint = data.path().join("state.db").display().to_string();
        let (status, output) = Cetera::refused_on_with(&endpoint, &["--auth-token", options]).await;
        assert!(!status.success(), "{options}");
        // etcd 3.5's jwt-go capitalises its key errors; 3.6 on do not.
        assert!(
            output.to_lowercase().contains(&message.to_lowercase()),
            "{options}: etcd says {message:?}; cetera:\n{output}"
        );
        let created: Vec<_> = std::fs::read_dir(data.path()).unwrap().collect();
        assert!(created.is_empty(), "{options}: created {created:?}");
    }
    // Keys that are not a pair: etcd 3.6 on refuse them so (3.5.1 compares
    // with `&&` and lets them through, so it is not asked here).
    let data = tempfile::tempdir().unwrap();
    let endpoint = data.path().join("state.db").display().to_string();
    let mismatched = format!("jwt,pub-key={other_public},priv-key={private},sign-method=RS256");
    let (_, output) = Cetera::refused_on_with(&endpoint, &["--auth-token", &mismatched]).await;
    assert!(
        output.contains("auth: public and private keys don't match"),
        "{output}"
    );
    assert!(std::fs::read_dir(data.path()).unwrap().next().is_none());
}

/// The files of a client-certificate test: a CA, the server's certificate,
/// and clients whose CommonNames are root and alice.
struct Pki {
    dir: TempDir,
    ca_pem: String,
    root: (String, String),
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new("cetera test CA");
        let server = ca.issue("server", ExtendedKeyUsagePurpose::ServerAuth);
        let root = ca.issue("root", ExtendedKeyUsagePurpose::ClientAuth);
        let alice = ca.issue("alice", ExtendedKeyUsagePurpose::ClientAuth);
        let nobody = ca.issue("nobody", ExtendedKeyUsagePurpose::ClientAuth);
        for (name, text) in [
            ("ca.pem", &ca.pem),
            ("server.pem", &server.0),
            ("server-key.pem", &server.1),
            ("root.pem", &root.0),
            ("root-key.pem", &root.1),
            ("alice.pem", &alice.0),
            ("alice-key.pem", &alice.1),
            ("nobody.pem", &nobody.0),
            ("nobody-key.pem", &nobody.1),
        ] {
            write(&dir, name, text.as_bytes());
        }
        Pki {
            ca_pem: ca.pem,
            root,
            dir,
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn server_flags(&self) -> Vec<String> {
        vec![
            format!("--cert-file={}", self.path("server.pem")),
            format!("--key-file={}", self.path("server-key.pem")),
            format!("--trusted-ca-file={}", self.path("ca.pem")),
            "--client-cert-auth".to_string(),
        ]
    }

    fn probe(&self) -> ClientTls {
        ClientTls {
            ca_pem: self.ca_pem.clone(),
            identity: Some(self.root.clone()),
        }
    }

    /// etcdctl's flags for the client certificate of `user`.
    fn etcdctl_flags(&self, user: &str) -> Vec<String> {
        vec![
            format!("--cacert={}", self.path("ca.pem")),
            format!("--cert={}", self.path(&format!("{user}.pem"))),
            format!("--key={}", self.path(&format!("{user}-key.pem"))),
        ]
    }
}

/// etcdctl over TLS with a client certificate and no password: the
/// certificate's CommonName is the user, on cetera as on etcd; a token, when
/// there is one, wins; a request marked as the gRPC gateway's is not logged
/// in by certificate.
#[tokio::test]
async fn client_certificate_common_name_is_the_user_as_in_etcd() {
    let Some(etcdctl) = common::etcdctl_35() else {
        return;
    };
    let pki = Pki::new();
    let flags = pki.server_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let Some(etcd) = Etcd::start_tls(&flags, pki.probe()).await else {
        return;
    };
    let cetera = Cetera::start_tls(&flags, pki.probe()).await;
    let https = |port: u16| format!("https://127.0.0.1:{port}");
    let steps: Vec<(&str, Vec<&str>)> = vec![
        ("root", vec!["put", "foo", "bar"]),
        ("root", vec!["user", "add", "root:rootpw"]),
        ("root", vec!["user", "grant-role", "root", "root"]),
        ("root", vec!["user", "add", "alice:alicepw"]),
        ("root", vec!["role", "add", "reader"]),
        (
            "root",
            vec!["role", "grant-permission", "reader", "read", "foo"],
        ),
        ("root", vec!["user", "grant-role", "alice", "reader"]),
        ("root", vec!["auth", "enable"]),
        // From here on the certificate logs in.
        ("alice", vec!["get", "foo"]),
        ("alice", vec!["put", "foo", "x"]),
        ("alice", vec!["user", "list"]),
        ("root", vec!["put", "foo", "y"]),
        ("root", vec!["get", "foo", "--print-value-only"]),
        ("root", vec!["user", "list"]),
        ("root", vec!["auth", "status"]),
        // A user the certificate names that does not exist.
        ("nobody", vec!["get", "foo"]),
        ("nobody", vec!["user", "list"]),
        // A password login wins over the certificate.
        ("alice", vec!["--user", "root:rootpw", "put", "foo", "z"]),
        ("root", vec!["--user", "alice:alicepw", "put", "foo", "w"]),
        ("root", vec!["get", "foo", "--print-value-only"]),
    ];
    for (user, args) in &steps {
        let mut full = pki.etcdctl_flags(user);
        full.extend(args.iter().map(|a| a.to_string()));
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        let on_etcd = etcdctl_out(&etcdctl, &https(etcd.port()), &full);
        let on_cetera = etcdctl_out(&etcdctl, &https(cetera.port()), &full);
        assert_eq!(on_cetera, on_etcd, "as {user}: etcdctl {args:?}");
    }
    // gRPC with the gateway's mark: the certificate is not a login.
    let alice = (
        std::fs::read_to_string(pki.path("alice.pem")).unwrap(),
        std::fs::read_to_string(pki.path("alice-key.pem")).unwrap(),
    );
    let tls = ClientTls {
        ca_pem: pki.ca_pem.clone(),
        identity: Some(alice),
    };
    let mut seen = Vec::new();
    for port in [etcd.port(), cetera.port()] {
        let channel = tonic::transport::Channel::from_shared(https(port))
            .unwrap()
            .tls_config(tls.tonic_config())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut kv = KvClient::new(channel);
        let mut request = Request::new(RangeRequest {
            key: b"foo".to_vec(),
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("grpcgateway-accept", "application/json".parse().unwrap());
        let marked = outcome(kv.range(request).await);
        let plain = outcome(
            kv.range(Request::new(RangeRequest {
                key: b"foo".to_vec(),
                ..Default::default()
            }))
            .await,
        );
        seen.push((marked, plain));
    }
    assert_eq!(seen[1], seen[0], "cetera (left) and etcd (right) differ");
    assert_eq!(seen[0].1, "ok");
}
