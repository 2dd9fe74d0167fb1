//! Wires a store to the gRPC services and serves them until shutdown.

mod authority;
mod founding;
mod grpc_metrics;
mod listeners;
mod metrics_server;
mod tls;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;

use crate::api::auth::AuthService;
use crate::api::cluster::ClusterService;
use crate::api::cluster::{SHARED_DATABASE, SingleServer};
use crate::api::election::ElectionService;
use crate::api::kv::KvService;
use crate::api::lease::LeaseService;
use crate::api::lock::LockService;
use crate::api::maintenance::MaintenanceService;
use crate::api::require_leader::RequireLeaderLayer;
use crate::api::watch::WatchService;
use crate::api::{ClusterSlot, ServerInfo, cluster_slot};
use crate::auth::{Auth, AuthOptions, TokenProvider};
use crate::backend::Backend;
use crate::backend::datastore::Datastore;
use crate::backend::open::{BackendJob, OpenFor, with_datastore};
use crate::config::Config;
use crate::gateway::{Gateway, RenderMetrics, Services};
use crate::proto::etcdserverpb::auth_server::AuthServer;
use crate::proto::etcdserverpb::cluster_server::ClusterServer;
use crate::proto::etcdserverpb::kv_server::KvServer;
use crate::proto::etcdserverpb::lease_server::LeaseServer;
use crate::proto::etcdserverpb::maintenance_server::MaintenanceServer;
use crate::proto::v3electionpb::election_server::ElectionServer;
use crate::proto::v3lockpb::lock_server::LockServer;
use crate::raft::{Cluster, ClusterOptions, JoinMode, Member, PeerTls};
use crate::store::{Identity, Store, StoreOptions};
use crate::watch::session::SessionOptions;

/// gRPC accepts this much more than --max-request-bytes, as etcd does, so the
/// size check can answer with etcd's own error.
const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// Opens the datastore named by `config` and serves until `shutdown` resolves.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send) -> anyhow::Result<()> {
    // Refuse a bad retention or token option before connecting to the
    // database (or creating its file).
    config.auto_compaction()?;
    let tokens = TokenProvider::new(
        &config.auth_token,
        std::time::Duration::from_secs(config.auth_token_ttl),
    )?;
    for (gate, on) in config.feature_gates() {
        tracing::info!("feature gate {gate}={on} is etcd's; cetera has no such switch");
    }
    let datastore = Datastore::parse(&config.endpoint)?;
    if config.replicated() && !matches!(datastore, Datastore::Sqlite(_)) {
        anyhow::bail!(
            "a replicated cluster keeps its data in SQLite: --endpoint must name an SQLite file"
        );
    }
    let tls = tls::server_config(&config)?;
    // Up before the datastore, so that /healthz answers and /readyz says
    // "not ready" while the database is still being reached.
    let readiness = match config.metrics_address {
        Some(address) => Some(metrics_server::start(address).await?),
        None => None,
    };
    let serving = Serving {
        tls,
        readiness,
        tokens,
    };
    let open_for = OpenFor::Serving {
        poll_interval: config.poll_interval,
        replica: config.replicated(),
    };
    let (endpoint, tls) = (config.endpoint.clone(), config.datastore_tls());
    let job = ServeJob {
        config,
        serving,
        shutdown,
    };
    with_datastore(&endpoint, &tls, open_for, job).await
}

/// Serving, as a job on whichever backend the endpoint names.
struct ServeJob<S> {
    config: Config,
    serving: Serving,
    shutdown: S,
}

impl<S: Future<Output = ()> + Send> BackendJob for ServeJob<S> {
    type Output = ();
    async fn run<B: Backend>(self, backend: B) -> anyhow::Result<()> {
        serve(self.config, backend, self.serving, self.shutdown).await
    }
}

/// The replicated-mode settings: when --cluster-init or --join is given, or
/// when the datastore founded a cluster on a MemberAdd (`founding`).
fn cluster_options(config: &Config) -> anyhow::Result<Option<ClusterOptions>> {
    let mode = match (&config.join, config.cluster_init) {
        (Some(url), _) => JoinMode::Join { url: url.clone() },
        (None, true) => JoinMode::Init,
        (None, false) => match Datastore::parse(&config.endpoint)? {
            Datastore::Sqlite(path) if founding::marker_path(&path).exists() => {
                tracing::info!(
                    marker = %founding::marker_path(&path).display(),
                    "this datastore founded a cluster on member add: starting as its member"
                );
                JoinMode::Init
            }
            _ => return Ok(None),
        },
    };
    member_options(config, mode).map(Some)
}

/// The settings of this server as a cluster member that comes in by `mode`.
fn member_options(config: &Config, mode: JoinMode) -> anyhow::Result<ClusterOptions> {
    let Datastore::Sqlite(path) = Datastore::parse(&config.endpoint)? else {
        anyhow::bail!(
            "a replicated cluster keeps its data in SQLite: --endpoint must name an SQLite file"
        );
    };
    let beside = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        std::path::PathBuf::from(name)
    };
    Ok(ClusterOptions {
        mode,
        token: config.token.clone(),
        peer_listen_address: config.peer_listen_address,
        member: Member {
            name: config.name.clone(),
            peer_url: config.peer_url(),
            client_urls: config.client_urls(),
        },
        log_dir: beside(".raft-wal"),
        old_log_path: beside(".raft-log"),
        token_path: beside(".token"),
        scratch: beside(".snapshots"),
        tls: peer_tls(config)?,
    })
}

/// How this server, while it is not a cluster member, takes a MemberAdd:
/// on SQLite it founds a cluster with its store first; on a shared
/// database it refuses (the database replicates the data).
fn single_server<B: Backend>(
    config: &Config,
    store: &Arc<Store<B>>,
    slot: &ClusterSlot,
) -> anyhow::Result<SingleServer> {
    let Datastore::Sqlite(path) = Datastore::parse(&config.endpoint)? else {
        return Ok(SingleServer::Refuses(SHARED_DATABASE));
    };
    let founding = founding::Founding::new(
        member_options(config, JoinMode::Init)?,
        store.clone(),
        slot.clone(),
        founding::marker_path(&path),
    );
    Ok(SingleServer::Founds(Arc::new(founding)))
}

/// The peer TLS files, read; all three or none.
fn peer_tls(config: &Config) -> anyhow::Result<Option<PeerTls>> {
    let read = |path: &std::path::Path| {
        std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
    };
    match (
        &config.peer_cert_file,
        &config.peer_key_file,
        &config.peer_trusted_ca_file,
    ) {
        (None, None, None) => Ok(None),
        (Some(cert), Some(key), Some(ca)) => Ok(Some(PeerTls {
            cert: read(cert)?,
            key: read(key)?,
            ca: read(ca)?,
        })),
        _ => anyhow::bail!(
            "--peer-cert-file, --peer-key-file and --peer-trusted-ca-file go together: \
             members verify each other's certificates"
        ),
    }
}

/// What `run` prepares before the datastore is open: client TLS, the
/// metrics server's readiness, which learns of the store once it is open,
/// and the auth token provider.
struct Serving {
    tls: Option<Arc<rustls::ServerConfig>>,
    readiness: Option<Arc<metrics_server::Readiness>>,
    tokens: TokenProvider,
}

async fn serve<B: Backend>(
    config: Config,
    backend: B,
    serving: Serving,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    let cluster_options = cluster_options(&config)?;
    let options = StoreOptions {
        quota_backend_bytes: config.quota_backend_bytes,
        auto_compaction: config.auto_compaction()?,
        keep_alives_in_memory: cluster_options.is_none(),
        txn_checks: config.txn_checks(),
        compaction_hashes: crate::config::major_minor(&config.emulated_etcd_version) >= (3, 6),
    };
    let store = Arc::new(Store::open_with(backend, options).await?);
    let cluster = match cluster_options {
        Some(options) => Some(Cluster::start(options, store.clone()).await?),
        None => None,
    };
    let identity = Identity {
        cluster_id: cluster
            .as_ref()
            .map_or(store.identity().cluster_id, |c| c.cluster_id()),
        member_id: store.identity().member_id,
    };
    let cluster = cluster_slot(cluster);
    if let Some(readiness) = &serving.readiness {
        readiness.store_opened(store.clone());
    }
    let auth = Arc::new(
        Auth::open(
            &store,
            serving.tokens,
            AuthOptions {
                bcrypt_cost: config.bcrypt_cost,
                client_cert_auth: config.client_cert_auth,
                old_revision_as_grpc_error: crate::config::major_minor(
                    &config.emulated_etcd_version,
                ) >= (3, 6),
            },
        )
        .await?,
    );
    let auth_follower = Auth::follow(&auth, store.clone(), store.auth_changes());
    let info = Arc::new(ServerInfo {
        identity,
        max_request_bytes: config.max_request_bytes,
        max_txn_ops: config.max_txn_ops,
        version: config.emulated_etcd_version.clone(),
        quota_backend_bytes: config.quota_backend_bytes,
        name: config.name.clone(),
        client_urls: config.client_urls(),
        peer_url: config.peer_url(),
        auth,
        cluster: cluster.clone(),
    });
    let max_message = config.max_request_bytes + GRPC_OVERHEAD_BYTES;
    // Streams never end by themselves: shutdown ends them so that the
    // graceful drain can finish.
    let (stopping, stop_streams) = tokio::sync::watch::channel(false);
    let stopping = Arc::new(stopping);
    let shutdown = {
        let stopping = stopping.clone();
        async move {
            shutdown.await;
            let _ = stopping.send(true);
        }
    };
    let watch_options = SessionOptions {
        progress_interval: config.watch_progress_notify_interval,
        max_response_bytes: config.max_request_bytes,
        refuse_negative_start: config.watch_refuses_negative_start(),
        progress_without_watchers: crate::config::major_minor(&config.emulated_etcd_version)
            < (3, 6),
    };

    let listeners = listeners::bind(&config, serving.tls.as_ref()).await?;
    for listener in &listeners {
        tracing::info!(
            address = %listener,
            revision = store.revisions().current,
            member_id = format_args!("{:x}", info.identity.member_id),
            "serving the etcd API (gRPC and HTTP)"
        );
    }

    let kv = Arc::new(KvService::new(store.clone(), info.clone()));
    let watch = Arc::new(WatchService::new(
        store.clone(),
        info.clone(),
        watch_options,
        stop_streams.clone(),
    ));
    let lease = Arc::new(LeaseService::new(store.clone(), info.clone()));
    let maintenance = Arc::new(MaintenanceService::new(store.clone(), info.clone()));
    let cluster_service = Arc::new(ClusterService::new(
        info.clone(),
        single_server(&config, &store, &cluster)?,
    ));
    let auth_service = Arc::new(AuthService::new(store.clone(), info.clone()));
    let lock = Arc::new(LockService::new(
        store.clone(),
        info.clone(),
        stop_streams.clone(),
    ));
    let election = Arc::new(ElectionService::new(
        store.clone(),
        info.clone(),
        stop_streams.clone(),
    ));
    let mut routes = tonic::service::Routes::builder();
    routes
        .add_service(KvServer::from_arc(kv.clone()).max_decoding_message_size(max_message))
        .add_service(watch.clone().into_route(
            max_message,
            crate::api::watch::GoDecoder::of_etcd(&config.emulated_etcd_version),
        ))
        .add_service(LeaseServer::from_arc(lease.clone()).max_decoding_message_size(max_message))
        .add_service(
            MaintenanceServer::from_arc(maintenance.clone()).max_decoding_message_size(max_message),
        )
        .add_service(
            ClusterServer::from_arc(cluster_service.clone()).max_decoding_message_size(max_message),
        )
        .add_service(
            AuthServer::from_arc(auth_service.clone()).max_decoding_message_size(max_message),
        )
        .add_service(LockServer::from_arc(lock.clone()).max_decoding_message_size(max_message))
        .add_service(
            ElectionServer::from_arc(election.clone()).max_decoding_message_size(max_message),
        );
    let probe: Arc<dyn metrics_server::StoreProbe> = store.clone();
    let render_metrics: RenderMetrics = Arc::new(move || {
        let probe = probe.clone();
        Box::pin(async move { metrics_server::scrape(&*probe).await })
    });
    let gateway = Gateway::new(
        Services {
            kv,
            watch,
            lease,
            cluster: cluster_service,
            maintenance,
            auth: auth_service,
            lock,
            election,
        },
        store.clone(),
        info.clone(),
        render_metrics,
        max_message,
    );
    // gRPC calls go by path to their service; everything else is HTTP.
    let routes = tonic::service::Routes::from(
        routes
            .routes()
            .into_axum_router()
            .fallback_service(gateway.clone()),
    );
    let metrics_listeners = listeners::serve_metrics(
        &config,
        serving.tls.as_ref(),
        gateway.metrics_only(),
        stop_streams.clone(),
    )
    .await?;

    let require_leader = RequireLeaderLayer::new(cluster.clone());
    let mut servers = tokio::task::JoinSet::new();
    for listener in listeners {
        let stopped = stop_streams.clone();
        servers.spawn(
            listener.serve(routes.clone(), require_leader.clone(), async move {
                let mut stopped = stopped;
                let _ = stopped.wait_for(|stop| *stop).await;
            }),
        );
    }
    let mut shutdown = std::pin::pin!(shutdown);
    let mut failure = None;
    loop {
        tokio::select! {
            () = &mut shutdown, if !*stop_streams.borrow() => {}
            joined = servers.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(error))) => {
                    failure.get_or_insert(error);
                    let _ = stopping.send(true);
                }
                Some(Err(error)) => {
                    failure.get_or_insert(anyhow::anyhow!("a listener's task failed: {error}"));
                    let _ = stopping.send(true);
                }
            },
        }
    }
    // Sent already unless every client listener ended by itself; the
    // metrics listeners end on it.
    let _ = stopping.send(true);
    for task in metrics_listeners {
        let _ = task.await;
    }
    // The services hold the store; `shutdown` below needs it alone.
    drop(routes);
    drop(gateway);
    if let Some(readiness) = &serving.readiness {
        readiness.stopping();
    }

    auth_follower.abort();
    // It holds the backend, which is closed (and an SQLite file unlocked)
    // only once nothing does.
    let _ = auth_follower.await;
    drop(info);
    if let Some(cluster) = cluster.get() {
        cluster.shutdown().await;
    }
    drop(cluster);
    tracing::info!("stopped serving; finishing queued writes");
    match Arc::try_unwrap(store) {
        Ok(store) => store.shutdown().await,
        Err(_) => tracing::warn!("store still in use at shutdown"),
    }
    match failure {
        Some(error) => Err(error.context("a client listener failed")),
        None => Ok(()),
    }
}
