//! etcd's authentication and role-based access control: users, roles, key
//! permissions, simple tokens, and the permission checks every service makes.
//!
//! Users and roles live in the database (table `auth`, etcd's authpb
//! encoding) with `auth_enabled` and `auth_revision` in `settings`, so every
//! instance on a shared database enforces the same rules. Each instance keeps
//! a copy in memory (`AuthState`), which the checks read without touching the
//! database. A change made here replaces the copy at once; a change made by
//! another instance is noticed when the backend signals other instances'
//! commits (Postgres NOTIFY, the MySQL poll): the instance then re-reads the
//! auth revision and enabled flag, and reloads everything if either moved.
//!
//! Simple tokens are kept per instance, as each etcd member keeps its own
//! token table: a token from one cetera instance is not valid on another
//! (clients re-authenticate on `invalid auth token`, as clientv3 does).
//! JWT tokens (`--auth-token jwt,...`) are signed and carry their user and
//! auth revision: every instance given the same keys accepts them. With
//! `--client-cert-auth`, a request without a token is the user its client
//! certificate's CommonName names, as in etcd.

mod error;
mod jwt;
mod manage;

pub mod perms;
mod tokens;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

pub use self::error::AuthError;
use self::jwt::JwtTokens;
pub use self::jwt::TokenOptionsError;
pub use self::jwt::decompose as decompose_token_options;
use self::perms::{Access, MergedPermissions};
use self::tokens::TokenStore;
use crate::backend::Backend;
use crate::proto::authpb::{Role, User};
use crate::proto::etcdserverpb::request_op::Request as Op;
use crate::proto::etcdserverpb::{
    DeleteRangeRequest, LeaseTimeToLiveRequest, PutRequest, RangeRequest, TxnRequest,
};
use crate::store::Store;

/// The user every rule about administration is about.
pub const ROOT_USER: &str = "root";
/// The role that grants everything, including administration.
pub const ROOT_ROLE: &str = "root";

/// Longest time another instance's auth change can go unnoticed.
const REFRESH_FALLBACK: Duration = Duration::from_secs(2);

/// etcd's default bcrypt cost (`--bcrypt-cost`).
pub const BCRYPT_COST: u32 = 10;

/// The auth settings from the command line.
#[derive(Clone, Debug)]
pub struct AuthOptions {
    /// bcrypt cost for new password hashes.
    pub bcrypt_cost: u32,
    /// etcd's `--client-cert-auth`: a request without a token is the user
    /// its client certificate names.
    pub client_cert_auth: bool,
    /// Answer a token of an old auth revision as etcd 3.6 and later do
    /// (InvalidArgument) rather than as 3.5 (Unknown).
    pub old_revision_as_grpc_error: bool,
}

/// How this instance issues and reads tokens (etcd's TokenProvider): made
/// from `--auth-token` before the datastore is opened, so that bad options
/// stop the server before anything is created.
pub enum TokenProvider {
    /// Random strings kept in this instance's memory.
    Simple(TokenStore),
    /// Signed, self-contained tokens.
    Jwt(JwtTokens),
}

impl TokenProvider {
    /// etcd's NewTokenProvider, from `--auth-token` and how long an unused
    /// simple token lasts.
    pub fn new(text: &str, simple_ttl: Duration) -> anyhow::Result<Self> {
        TokenProvider::from_options(text, simple_ttl)
            .map_err(|e| anyhow::anyhow!("failed to create token provider: {e}"))
    }

    fn from_options(text: &str, simple_ttl: Duration) -> Result<Self, TokenOptionsError> {
        let (kind, options) = jwt::decompose(text)?;
        match kind.as_str() {
            "simple" => {
                tracing::warn!("simple token is not cryptographically signed");
                Ok(TokenProvider::Simple(TokenStore::new(simple_ttl)))
            }
            "jwt" => Ok(TokenProvider::Jwt(JwtTokens::new(&options)?)),
            _ => Err(TokenOptionsError::InvalidOptions),
        }
    }

    fn invalidate_user(&self, user: &str) {
        if let TokenProvider::Simple(tokens) = self {
            tokens.invalidate_user(user);
        }
    }

    fn clear(&self) {
        if let TokenProvider::Simple(tokens) = self {
            tokens.clear();
        }
    }
}

/// Everything the permission checks need, as of one auth revision.
#[derive(Clone, Debug, Default)]
pub(crate) struct AuthState {
    pub(crate) enabled: bool,
    pub(crate) revision: u64,
    pub(crate) users: BTreeMap<String, User>,
    pub(crate) roles: BTreeMap<String, Role>,
    merged: HashMap<String, MergedPermissions>,
}

impl AuthState {
    /// Builds the state, merging each user's permissions as etcd's cache does.
    pub(crate) fn new(
        enabled: bool,
        revision: u64,
        users: BTreeMap<String, User>,
        roles: BTreeMap<String, Role>,
    ) -> Self {
        let merged = users
            .iter()
            .map(|(name, user)| {
                let perms = user
                    .roles
                    .iter()
                    .filter_map(|r| roles.get(r))
                    .flat_map(|r| r.key_permission.iter());
                (name.clone(), MergedPermissions::merge(perms))
            })
            .collect();
        AuthState {
            enabled,
            revision,
            users,
            roles,
            merged,
        }
    }

    fn has_root_role(&self, user: &str) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.roles.iter().any(|r| r == ROOT_ROLE))
    }

    /// etcd's isOpPermitted.
    fn op_permitted(
        &self,
        caller: &Caller,
        access: Access,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let Some(user) = caller.user() else {
            return Err(AuthError::UserEmpty);
        };
        // A JWT token's revision: issued before the last auth change, it
        // no longer opens keys (simple tokens and certificates are always
        // of the current revision).
        match caller.revision {
            Some(0) => return Err(AuthError::UserEmpty),
            Some(revision) if revision < self.revision => {
                tracing::warn!(
                    current = self.revision,
                    request = revision,
                    "request auth revision is less than current node auth revision"
                );
                return Err(AuthError::OldRevision);
            }
            _ => {}
        }
        if !self.users.contains_key(user) {
            return Err(AuthError::PermissionDenied);
        }
        if self.has_root_role(user) {
            return Ok(());
        }
        match self.merged.get(user) {
            Some(perms) if perms.allows(access, key, range_end) => Ok(()),
            _ => Err(AuthError::PermissionDenied),
        }
    }

    /// etcd's IsAdminPermitted.
    fn admin_permitted(&self, user: Option<&str>) -> Result<(), AuthError> {
        if !self.enabled {
            return Ok(());
        }
        let Some(user) = user.filter(|u| !u.is_empty()) else {
            return Err(AuthError::UserEmpty);
        };
        if !self.users.contains_key(user) {
            return Err(AuthError::UserNotFound);
        }
        if !self.has_root_role(user) {
            return Err(AuthError::PermissionDenied);
        }
        Ok(())
    }
}

/// The caller of one request: the user its token or client certificate
/// names, or nobody.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    user: Option<String>,
    /// The auth revision a JWT token was issued at; `None`: the current one.
    revision: Option<u64>,
}

impl Caller {
    /// The user name, if the request carried a valid token.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }
}

/// The auth store of one instance: the in-memory copy of users and roles,
/// the token table, and the checks.
pub struct Auth {
    state: RwLock<Arc<AuthState>>,
    tokens: TokenProvider,
    options: AuthOptions,
    /// Serializes this instance's changes and reloads, so the copy in
    /// memory never goes back to an older revision.
    changing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("Auth")
            .field("enabled", &state.enabled)
            .field("revision", &state.revision)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// Loads the auth state from `store`; tokens are issued and read by
    /// `tokens`.
    pub async fn open<B: Backend>(
        store: &Store<B>,
        tokens: TokenProvider,
        options: AuthOptions,
    ) -> anyhow::Result<Self> {
        let state = manage::load_state(store).await?;
        Ok(Auth {
            state: RwLock::new(Arc::new(state)),
            tokens,
            options,
            changing: tokio::sync::Mutex::new(()),
        })
    }

    /// A copy of the state as of now.
    pub(crate) fn state(&self) -> Arc<AuthState> {
        self.state.read().expect("auth state poisoned").clone()
    }

    /// Installs a newer state; tokens of users that are gone, or whose
    /// password changed, stop working, and disabling auth drops every token.
    fn install(&self, new: AuthState) {
        let mut slot = self.state.write().expect("auth state poisoned");
        if !new.enabled {
            self.tokens.clear();
        } else {
            for (name, old_user) in &slot.users {
                match new.users.get(name) {
                    Some(user) if user.password == old_user.password => {}
                    _ => self.tokens.invalidate_user(name),
                }
            }
        }
        *slot = Arc::new(new);
    }

    /// Whether auth is enabled, and the auth revision.
    pub fn status(&self) -> (bool, u64) {
        let state = self.state();
        (state.enabled, state.revision)
    }

    /// Re-reads the state from the database if another instance changed it.
    pub async fn refresh<B: Backend>(&self, store: &Store<B>) -> anyhow::Result<()> {
        let _changing = self.changing.lock().await;
        let (enabled, revision) = store.auth_flags().await?;
        let current = self.state();
        if enabled == current.enabled && revision == current.revision {
            return Ok(());
        }
        let state = manage::load_state(store).await?;
        tracing::info!(
            enabled = state.enabled,
            revision = state.revision,
            "auth changed on another instance"
        );
        self.install(state);
        Ok(())
    }

    /// Follows auth changes made elsewhere for as long as `auth` lives:
    /// those other instances sharing the database commit, and those
    /// `applied` counts (a cluster's, which this member's writer applies).
    pub fn follow<B: Backend>(
        auth: &Arc<Self>,
        store: Arc<Store<B>>,
        mut applied: tokio::sync::watch::Receiver<u64>,
    ) -> tokio::task::JoinHandle<()> {
        let auth = Arc::downgrade(auth);
        tokio::spawn(async move {
            // This follower's own feed: a wake-up is never taken by another.
            let mut changes = store.change_feed();
            loop {
                // And every few seconds regardless: a bound on any change
                // that no signal reached.
                let applied_changed = async {
                    if applied.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                };
                tokio::select! {
                    _ = changes.next() => {}
                    _ = applied_changed => {}
                    _ = tokio::time::sleep(REFRESH_FALLBACK) => {}
                }
                let Some(auth) = auth.upgrade() else { return };
                if let Err(error) = auth.refresh(&store).await {
                    tracing::warn!("cannot re-read the auth state: {error:#}");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        })
    }

    /// The caller a request's token names, or without one (`None`) and
    /// with `--client-cert-auth` the user its client certificate names
    /// (`certificate_user`, asked only then). With auth disabled every
    /// request is anonymous and tokens are ignored, as in etcd 3.5.
    pub fn caller(
        &self,
        token: Option<&str>,
        certificate_user: impl FnOnce() -> Option<String>,
    ) -> Result<Caller, AuthError> {
        if !self.state().enabled {
            return Ok(Caller::default());
        }
        let Some(token) = token else {
            if self.options.client_cert_auth {
                return Ok(Caller {
                    user: certificate_user(),
                    revision: None,
                });
            }
            return Ok(Caller::default());
        };
        let found = match &self.tokens {
            TokenProvider::Simple(tokens) => tokens.user(token).map(|user| (user, None)),
            TokenProvider::Jwt(tokens) => tokens
                .info(token)
                .map(|info| (info.username, Some(info.revision))),
        };
        match found {
            Some((user, revision)) => Ok(Caller {
                user: Some(user),
                revision,
            }),
            None => {
                tracing::warn!("invalid auth token");
                Err(AuthError::InvalidAuthToken)
            }
        }
    }

    /// A new token for `user`, as of the current auth revision.
    fn assign_token(&self, user: &str) -> Result<String, AuthError> {
        match &self.tokens {
            TokenProvider::Simple(tokens) => Ok(tokens.assign(user)),
            TokenProvider::Jwt(tokens) => match tokens.assign(user, self.state().revision) {
                Some(signed) => signed.map_err(AuthError::Password),
                None => Err(AuthError::VerifyOnly),
            },
        }
    }

    /// etcd's requireAuthInfo: with auth enabled, a request must carry a
    /// valid token.
    pub fn require_user(&self, caller: &Caller) -> Result<(), AuthError> {
        if self.state().enabled && caller.user.is_none() {
            return Err(AuthError::UserEmpty);
        }
        Ok(())
    }

    /// Admin (root role) permission: Compaction, Defragment, Snapshot, Hash,
    /// HashKV, MoveLeader, and the auth management calls.
    pub fn require_admin(&self, caller: &Caller) -> Result<(), AuthError> {
        self.state().admin_permitted(caller.user())
    }

    fn permitted(
        &self,
        caller: &Caller,
        access: Access,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        self.as_emulated(self.state().op_permitted(caller, access, key, range_end))
    }

    /// A permission answer as the emulated etcd release words it.
    fn as_emulated(&self, answer: Result<(), AuthError>) -> Result<(), AuthError> {
        match answer {
            Err(AuthError::OldRevision) if self.options.old_revision_as_grpc_error => {
                Err(AuthError::OldRevisionGrpc)
            }
            answer => answer,
        }
    }

    /// Range needs read on its range.
    pub fn authorize_range(&self, caller: &Caller, req: &RangeRequest) -> Result<(), AuthError> {
        self.permitted(caller, Access::Read, &req.key, &req.range_end)
    }

    /// A watch needs read on its range, checked as the client sent it
    /// ("\0" means every key from `key` on).
    pub fn authorize_watch(
        &self,
        caller: &Caller,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        self.permitted(caller, Access::Read, key, range_end)
    }

    /// `accesses` on the keys in `[key, range_end)`: Lock and Election act on
    /// their queue's keys for the caller (etcd runs them through an in-process
    /// client that carries the caller's token).
    pub fn authorize_keys(
        &self,
        caller: &Caller,
        key: &[u8],
        range_end: &[u8],
        accesses: &[Access],
    ) -> Result<(), AuthError> {
        for &access in accesses {
            self.permitted(caller, access, key, range_end)?;
        }
        Ok(())
    }

    /// Put needs write on its key, read too with prev_kv, and write on the
    /// keys already attached to its lease.
    pub async fn authorize_put<B: Backend>(
        &self,
        caller: &Caller,
        req: &PutRequest,
        store: &Store<B>,
    ) -> Result<(), AuthError> {
        self.check_put(caller, req, store).await
    }

    /// DeleteRange needs write on its range, read too with prev_kv.
    pub fn authorize_delete(
        &self,
        caller: &Caller,
        req: &DeleteRangeRequest,
    ) -> Result<(), AuthError> {
        self.check_delete(caller, req)
    }

    /// Txn needs read on every compare and what each op needs, in nested
    /// txns too (as etcd 3.5 checks since its nested-txn fix).
    pub async fn authorize_txn<B: Backend>(
        &self,
        caller: &Caller,
        req: &TxnRequest,
        store: &Store<B>,
    ) -> Result<(), AuthError> {
        if !self.state().enabled {
            return Ok(());
        }
        self.check_txn(caller, req, store).await
    }

    fn check_delete(&self, caller: &Caller, req: &DeleteRangeRequest) -> Result<(), AuthError> {
        self.permitted(caller, Access::Write, &req.key, &req.range_end)?;
        if req.prev_kv {
            self.permitted(caller, Access::Read, &req.key, &req.range_end)?;
        }
        Ok(())
    }

    async fn check_put<B: Backend>(
        &self,
        caller: &Caller,
        req: &PutRequest,
        store: &Store<B>,
    ) -> Result<(), AuthError> {
        self.permitted(caller, Access::Write, &req.key, b"")?;
        self.check_lease_keys(caller, req.lease, Access::Write, store)
            .await?;
        if req.prev_kv {
            self.permitted(caller, Access::Read, &req.key, b"")?;
        }
        Ok(())
    }

    fn check_txn<'a, B: Backend>(
        &'a self,
        caller: &'a Caller,
        req: &'a TxnRequest,
        store: &'a Store<B>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), AuthError>> + Send + 'a>>
    {
        Box::pin(async move {
            for compare in &req.compare {
                self.permitted(caller, Access::Read, &compare.key, &compare.range_end)?;
            }
            for op in req.success.iter().chain(&req.failure) {
                match &op.request {
                    Some(Op::RequestRange(r)) => {
                        self.permitted(caller, Access::Read, &r.key, &r.range_end)?
                    }
                    Some(Op::RequestPut(p)) => self.check_put(caller, p, store).await?,
                    Some(Op::RequestDeleteRange(d)) => self.check_delete(caller, d)?,
                    Some(Op::RequestTxn(t)) => self.check_txn(caller, t, store).await?,
                    None => {}
                }
            }
            Ok(())
        })
    }

    /// etcd's checkLeasePuts / checkLeaseTimeToLive: every key attached to
    /// lease `id` needs `access`, unless the caller is an admin.
    async fn check_lease_keys<B: Backend>(
        &self,
        caller: &Caller,
        id: i64,
        access: Access,
        store: &Store<B>,
    ) -> Result<(), AuthError> {
        let state = self.state();
        if id == 0 || state.admin_permitted(caller.user()).is_ok() {
            return Ok(());
        }
        let lease = store
            .lease_time_to_live(&LeaseTimeToLiveRequest { id, keys: true })
            .await?;
        for key in lease.keys {
            self.as_emulated(state.op_permitted(caller, access, &key, b""))?;
        }
        Ok(())
    }

    /// LeaseRevoke needs a user and write on the lease's keys.
    pub async fn authorize_lease_revoke<B: Backend>(
        &self,
        caller: &Caller,
        id: i64,
        store: &Store<B>,
    ) -> Result<(), AuthError> {
        self.require_user(caller)?;
        self.check_lease_keys(caller, id, Access::Write, store)
            .await
    }

    /// LeaseTimeToLive needs a user, and read on the lease's keys when it
    /// asks for them.
    pub async fn authorize_lease_time_to_live<B: Backend>(
        &self,
        caller: &Caller,
        id: i64,
        keys: bool,
        store: &Store<B>,
    ) -> Result<(), AuthError> {
        self.require_user(caller)?;
        if keys {
            self.check_lease_keys(caller, id, Access::Read, store)
                .await?;
        }
        Ok(())
    }

    /// LeaseLeases needs a user, and read on the keys of every lease unless
    /// the caller is an admin (etcd 3.5's checkLeaseLeases).
    pub async fn authorize_lease_leases<B: Backend>(
        &self,
        caller: &Caller,
        store: &Store<B>,
    ) -> Result<(), AuthError> {
        self.require_user(caller)?;
        let state = self.state();
        if state.admin_permitted(caller.user()).is_ok() {
            return Ok(());
        }
        for lease in store.leases().await?.leases {
            self.check_lease_keys(caller, lease.id, Access::Read, store)
                .await?;
        }
        Ok(())
    }
}
