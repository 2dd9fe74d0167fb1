//! A single server on SQLite that becomes the founding member of a cluster
//! on its first MemberAdd, as etcd's one-member cluster takes a second
//! member: the operator's runbook ("add a member, start it, promote it")
//! works without restarting the first server with `--cluster-init`.
//!
//! The switch, in process and while serving: writes on their way straight
//! to the store are let finish and later ones wait (`Store::
//! pause_direct_writes`), the cluster is founded on the store as
//! `--cluster-init` founds it (every key, revision and lease kept; the
//! founding snapshot holds them for the members that join), and the waiting
//! writes then go through the log. No write is applied around the log once
//! it took over, none is sent twice, and linearizable reads wait for the new
//! leader (or fail with etcd's `no leader`, which clients retry).
//!
//! The server then writes `PATH.cluster-member` beside the datastore: started
//! again with the same flags (no `--cluster-init`), it finds the file and
//! starts as the founding member, so a restart never splits it from the
//! cluster it founded, nor serves alone what the log holds and its store
//! may not yet.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::api::ClusterSlot;
use crate::api::cluster::Founder;
use crate::backend::Backend;
use crate::raft::{Cluster, ClusterOptions};
use crate::store::{BoxFuture, Store};

/// The file that makes a datastore start as a cluster member without
/// `--cluster-init`: the cluster was founded on a MemberAdd.
pub(super) fn marker_path(datastore: &Path) -> PathBuf {
    let mut name = datastore.as_os_str().to_owned();
    name.push(".cluster-member");
    PathBuf::from(name)
}

/// Founds a cluster with a single server's store, once.
pub(super) struct Founding<B: Backend> {
    /// How the founding member starts (`JoinMode::Init`).
    options: ClusterOptions,
    store: Arc<Store<B>>,
    /// Where the services look for the cluster.
    slot: ClusterSlot,
    /// `marker_path` of the datastore.
    marker: PathBuf,
    /// One founding at a time; a second MemberAdd waits and finds it done.
    once: tokio::sync::Mutex<()>,
}

impl<B: Backend> Founding<B> {
    /// Founds, when asked, the cluster `options` describe on `store`, and
    /// puts it in `slot`.
    pub(super) fn new(
        options: ClusterOptions,
        store: Arc<Store<B>>,
        slot: ClusterSlot,
        marker: PathBuf,
    ) -> Self {
        Founding {
            options,
            store,
            slot,
            marker,
            once: tokio::sync::Mutex::new(()),
        }
    }

    async fn found_once(&self) -> anyhow::Result<Arc<Cluster>> {
        let _once = self.once.lock().await;
        if let Some(cluster) = self.slot.get() {
            return Ok(cluster.clone());
        }
        tracing::info!(
            peer_url = %self.options.member.peer_url,
            "member add on a single server: founding a cluster with this store's data"
        );
        let paused = self.store.pause_direct_writes().await?;
        let started = Cluster::start(self.options.clone(), self.store.clone()).await;
        let cluster = match started {
            Ok(cluster) => cluster,
            // Refused before the log took the store's writes (the peer
            // address in use, say): the server serves alone as before.
            Err(error) if !self.store.is_replicated() => return Err(error),
            Err(error) => {
                // The log has the store's writes: from now on this
                // datastore starts as a member, and applies what its log
                // holds again.
                write_marker(&self.marker)?;
                tracing::error!("the cluster founded on member add did not start: {error:#}");
                return Err(error.context(
                    "the founding member did not start; restart this server (it starts again \
                     as the cluster's member)",
                ));
            }
        };
        write_marker(&self.marker)?;
        let _ = self.slot.set(cluster.clone());
        drop(paused);
        tracing::info!(
            marker = %self.marker.display(),
            "founded a cluster with this store's data; this server starts as its member from now on"
        );
        Ok(cluster)
    }
}

impl<B: Backend> Founder for Founding<B> {
    fn found(&self) -> BoxFuture<'_, anyhow::Result<Arc<Cluster>>> {
        Box::pin(self.found_once())
    }
}

/// Writes the marker, durably: a restart must find it.
fn write_marker(path: &Path) -> anyhow::Result<()> {
    let text = "This datastore founded a cetera cluster on `member add`: cetera starts it \
                as that cluster's member even without --cluster-init. Remove this file only \
                to serve the datastore alone again.\n";
    std::fs::write(path, text)
        .and_then(|()| std::fs::File::open(path)?.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(())
}
