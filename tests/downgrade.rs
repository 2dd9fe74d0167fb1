//! The Downgrade RPC: etcd 3.5's answers checked against real etcd 3.5.1,
//! and etcd 3.6's (VALIDATE, ENABLE, CANCEL and what Status, HashKV and
//! Snapshot show meanwhile) against what etcd 3.6's source does.

mod common;

use cetera::proto::etcdserverpb::downgrade_request::DowngradeAction;
use cetera::proto::etcdserverpb::maintenance_client::MaintenanceClient;
use cetera::proto::etcdserverpb::{
    DowngradeInfo, DowngradeRequest, HashKvRequest, SnapshotRequest, StatusRequest,
};
use common::cetera_server::cluster_mode;
use common::kv_fixtures::put_request;
use common::{Cetera, channel, differential, outcome};
use tonic::transport::Channel;

type Maintenance = MaintenanceClient<Channel>;

fn request(action: i32, version: &str) -> DowngradeRequest {
    DowngradeRequest {
        action,
        version: version.to_string(),
    }
}

/// One Downgrade call's outcome: the version answered, or the error.
async fn downgrade(client: &mut Maintenance, action: DowngradeAction, version: &str) -> String {
    let result = client.downgrade(request(action as i32, version)).await;
    outcome(result, |r| {
        assert!(r.header.is_some(), "etcd answers with a header");
        format!("version {:?}", r.version)
    })
}

/// Status's storage version and downgrade info.
async fn status(client: &mut Maintenance) -> (String, String, Option<DowngradeInfo>) {
    let resp = client.status(StatusRequest {}).await.unwrap().into_inner();
    (resp.version, resp.storage_version, resp.downgrade_info)
}

fn info(enabled: bool, target: &str) -> Option<DowngradeInfo> {
    Some(DowngradeInfo {
        enabled,
        target_version: target.to_string(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_answers_match_etcd_35() {
    if cluster_mode() {
        // Followers of a replicated cluster do not serve Downgrade (see below).
        return;
    }
    use DowngradeAction::{Cancel, Enable, Validate};
    differential(&[], &[], async |side| {
        let mut client = MaintenanceClient::new(side.channel.clone());
        let steps: &[(DowngradeAction, &str)] = &[
            (Cancel, ""),
            (Validate, "3.4"),
            (Validate, "3.4.9"),
            (Validate, "3.4.0-rc.1"),
            (Validate, "3.5"),
            (Validate, "3.3"),
            (Validate, "4.4"),
            (Validate, "v3.4"),
            (Validate, "3.4.0.0"),
            (Validate, ""),
            (Enable, "3.3"),
            (Enable, "three"),
            (Enable, "3.4"),
            (Validate, "3.4"),
            (Validate, "3.3"),
            (Enable, "3.4"),
            (Cancel, "ignored"),
            (Cancel, ""),
            (Enable, "3.4.1"),
            (Cancel, ""),
        ];
        for (action, version) in steps {
            let shown = downgrade(&mut client, *action, version).await;
            side.note(format!("{action:?} {version:?}"), shown);
        }
        let shown = outcome(client.downgrade(request(7, "3.4")).await, |r| {
            format!("version {:?}", r.version)
        });
        side.note("action 7", shown);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_36_downgrade_stays_in_flight_until_cancelled() {
    let server = Cetera::start_with(&["--emulated-etcd-version", "3.6.11"]).await;
    let channel = channel(&server.endpoint()).await;
    let mut client = MaintenanceClient::new(channel.clone());
    if cluster_mode() {
        let refused = client
            .downgrade(request(DowngradeAction::Validate as i32, "3.5"))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unimplemented);
        return;
    }
    let mut kv = cetera::proto::etcdserverpb::kv_client::KvClient::new(channel);
    kv.put(put_request("k", "v", 0)).await.unwrap();
    use DowngradeAction::{Cancel, Enable, Validate};
    let invalid = "ERR InvalidArgument: etcdserver: invalid downgrade target version";
    let in_progress = "ERR FailedPrecondition: etcdserver: cluster has a downgrade job in progress";

    assert_eq!(
        status(&mut client).await,
        ("3.6.11".into(), "3.6.0".into(), info(false, ""))
    );
    // etcd 3.6 answers an idle CANCEL as a success.
    assert_eq!(downgrade(&mut client, Cancel, "").await, "version \"3.6\"");
    assert_eq!(
        downgrade(&mut client, Validate, "3.5").await,
        "version \"3.6\""
    );
    assert_eq!(downgrade(&mut client, Validate, "3.4").await, invalid);
    assert_eq!(downgrade(&mut client, Validate, "3.6").await, invalid);
    assert_eq!(
        downgrade(&mut client, Validate, "3.x").await,
        "ERR InvalidArgument: etcdserver: wrong downgrade target version format"
    );
    assert_eq!(
        status(&mut client).await.2,
        info(false, ""),
        "VALIDATE changes nothing"
    );

    assert_eq!(
        downgrade(&mut client, Enable, "3.5.2").await,
        "version \"3.6\""
    );
    // The cluster and storage versions go to the target; the server's own
    // version stays.
    assert_eq!(
        status(&mut client).await,
        ("3.6.11".into(), "3.5.0".into(), info(true, "3.5.0"))
    );
    // One minor below the cluster version is now 3.4, which finds the job.
    assert_eq!(downgrade(&mut client, Enable, "3.5").await, invalid);
    assert_eq!(downgrade(&mut client, Validate, "3.4").await, in_progress);
    let hashed = client
        .hash_kv(HashKvRequest { revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hashed.hash_revision, 2);
    let mut snapshot = client
        .snapshot(SnapshotRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = snapshot.message().await.unwrap().unwrap();
    assert_eq!(first.version, "3.5.0");
    drop(snapshot);

    assert_eq!(downgrade(&mut client, Cancel, "").await, "version \"3.5\"");
    assert_eq!(
        status(&mut client).await,
        ("3.6.11".into(), "3.6.0".into(), info(false, ""))
    );
    assert_eq!(downgrade(&mut client, Cancel, "").await, "version \"3.6\"");
    let hashed = client
        .hash_kv(HashKvRequest { revision: 1 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hashed.hash_revision, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_35_sends_no_36_fields() {
    let server = Cetera::start_with(&["--emulated-etcd-version", "3.5.13"]).await;
    let channel = channel(&server.endpoint()).await;
    let mut client = MaintenanceClient::new(channel.clone());
    let mut kv = cetera::proto::etcdserverpb::kv_client::KvClient::new(channel);
    kv.put(put_request("k", "v", 0)).await.unwrap();
    let hashed = client
        .hash_kv(HashKvRequest { revision: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (hashed.header.unwrap().revision, hashed.hash_revision),
        (2, 0)
    );
    let mut snapshot = client
        .snapshot(SnapshotRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(snapshot.message().await.unwrap().unwrap().version, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_in_flight_outlasts_a_restart() {
    if cluster_mode() {
        return;
    }
    let mut server = Cetera::start_with(&["--emulated-etcd-version", "3.7.1"]).await;
    let mut client = MaintenanceClient::new(channel(&server.endpoint()).await);
    assert_eq!(
        downgrade(&mut client, DowngradeAction::Enable, "3.6").await,
        "version \"3.7\""
    );
    server.restart().await;
    let mut client = MaintenanceClient::new(channel(&server.endpoint()).await);
    assert_eq!(
        status(&mut client).await,
        ("3.7.1".into(), "3.6.0".into(), info(true, "3.6.0"))
    );
    assert_eq!(
        downgrade(&mut client, DowngradeAction::Cancel, "").await,
        "version \"3.6\""
    );
    server.restart().await;
    let mut client = MaintenanceClient::new(channel(&server.endpoint()).await);
    assert_eq!(status(&mut client).await.2, info(false, ""));
}

/// Users root (root role) and alice (no role), auth on; their tokens.
async fn enable_auth(channel: Channel) -> (String, String) {
    use cetera::proto::etcdserverpb::auth_client::AuthClient;
    use cetera::proto::etcdserverpb::{
        AuthEnableRequest, AuthUserAddRequest, AuthUserGrantRoleRequest, AuthenticateRequest,
    };
    let mut auth = AuthClient::new(channel);
    for name in ["root", "alice"] {
        let add = AuthUserAddRequest {
            name: name.into(),
            password: format!("{name}pw"),
            ..Default::default()
        };
        auth.user_add(add).await.unwrap();
    }
    let grant = AuthUserGrantRoleRequest {
        user: "root".into(),
        role: "root".into(),
    };
    auth.user_grant_role(grant).await.unwrap();
    auth.auth_enable(AuthEnableRequest {}).await.unwrap();
    let mut tokens = Vec::new();
    for name in ["root", "alice"] {
        let login = AuthenticateRequest {
            name: name.into(),
            password: format!("{name}pw"),
        };
        tokens.push(auth.authenticate(login).await.unwrap().into_inner().token);
    }
    (tokens[0].clone(), tokens[1].clone())
}

fn with_token(message: DowngradeRequest, token: Option<&str>) -> tonic::Request<DowngradeRequest> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("token", token.parse().unwrap());
    }
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_only_root_may_downgrade() {
    if cluster_mode() {
        return;
    }
    // etcd 3.6, and 3.5 from 3.5.28, check for an admin.
    for version in ["3.6.11", "3.5.13"] {
        let server = Cetera::start_with(&["--emulated-etcd-version", version]).await;
        let channel = channel(&server.endpoint()).await;
        let (root, alice) = enable_auth(channel.clone()).await;
        let mut client = MaintenanceClient::new(channel);
        let validate = || request(DowngradeAction::Validate as i32, "3.5");
        let code = |result: Result<tonic::Response<_>, tonic::Status>| {
            result.err().map(|status| status.code())
        };
        // 3.5 is a valid target for 3.6 only: root gets an answer there and
        // the invalid-target error from 3.5.
        let allowed = if version.starts_with("3.6") {
            None
        } else {
            Some(tonic::Code::InvalidArgument)
        };
        let as_root = client.downgrade(with_token(validate(), Some(&root))).await;
        assert_eq!(code(as_root), allowed, "{version} root");
        let as_alice = client.downgrade(with_token(validate(), Some(&alice))).await;
        assert_eq!(
            code(as_alice),
            Some(tonic::Code::PermissionDenied),
            "{version} alice"
        );
        let anonymous = client.downgrade(with_token(validate(), None)).await;
        assert_eq!(
            code(anonymous),
            Some(tonic::Code::InvalidArgument),
            "{version}: etcd's user name is empty"
        );
    }
}
