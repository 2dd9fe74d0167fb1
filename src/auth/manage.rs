//! The auth management calls (etcd's authStore): each reads the records,
//! applies etcd's rules, has the store's writer store what changed and the
//! new auth revision (through the replicated log in a cluster), and then
//! installs the result in memory. The writer applies a change only if the
//! auth state is still the one it was computed from, so changes made by
//! every instance or member are ordered and the auth revision counts them
//! all.

use std::collections::BTreeMap;

use prost::Message;

use super::perms::is_valid_permission_range;
use super::{Auth, AuthError, AuthState, Caller, ROOT_ROLE, ROOT_USER};
use crate::backend::{AuthKind, Backend};
use crate::proto::authpb::{Permission, Role, User, UserAddOptions};
use crate::store::request::AuthWrite;
use crate::store::{Store, StoreError};

/// Times a change is computed again when the state moved meanwhile.
const CHANGE_ATTEMPTS: usize = 5;

fn database_error(error: anyhow::Error) -> AuthError {
    StoreError::Backend(error).into()
}

fn decode_records<M: Message + Default>(
    rows: Vec<(Vec<u8>, Vec<u8>)>,
) -> anyhow::Result<BTreeMap<String, M>> {
    rows.into_iter()
        .map(|(name, record)| {
            Ok((
                String::from_utf8_lossy(&name).into_owned(),
                M::decode(&*record)?,
            ))
        })
        .collect()
}

/// Reads the whole auth state.
pub(super) async fn load_state<B: Backend>(store: &Store<B>) -> anyhow::Result<AuthState> {
    let records = store.auth_records().await?;
    let users = decode_records(records.users)?;
    let roles = decode_records(records.roles)?;
    Ok(AuthState::new(
        records.enabled,
        records.revision,
        users,
        roles,
    ))
}

/// The records a change works on.
struct Records {
    enabled: bool,
    users: BTreeMap<String, User>,
    roles: BTreeMap<String, Role>,
}

/// What a change did: whether it counts as a new auth revision (etcd's
/// commitRevision), or changed nothing at all.
#[derive(PartialEq, Eq)]
enum Outcome {
    Unchanged,
    SameRevision,
    NewRevision,
}

/// The bcrypt hash of `password`, computed off the async threads. Like etcd
/// 3.5's server, this always hashes `password`: a client's hashedPassword is
/// replaced, never trusted.
async fn hash_password(password: String, cost: u32) -> Result<Vec<u8>, AuthError> {
    tokio::task::spawn_blocking(move || bcrypt::hash(password, cost))
        .await
        .map_err(|e| AuthError::Password(e.to_string()))?
        .map(String::into_bytes)
        .map_err(|e| AuthError::Password(e.to_string()))
}

impl Auth {
    /// Runs `f` on the stored records and has the store's writer store what
    /// it changed (through the replicated log in a cluster), then installs
    /// the new state here. The writer refuses a change computed from a state
    /// that moved meanwhile (another instance or member changed auth), and
    /// `f` runs again on the new one.
    async fn change<B: Backend>(
        &self,
        store: &Store<B>,
        mut f: impl FnMut(&mut Records) -> Result<Outcome, AuthError>,
    ) -> Result<(), AuthError> {
        let _changing = self.changing.lock().await;
        for _ in 0..CHANGE_ATTEMPTS {
            let before = load_state(store).await.map_err(database_error)?;
            let mut records = Records {
                enabled: before.enabled,
                users: before.users.clone(),
                roles: before.roles.clone(),
            };
            let revision = match f(&mut records)? {
                Outcome::Unchanged => return Ok(()),
                Outcome::NewRevision => before.revision + 1,
                Outcome::SameRevision => before.revision,
            };
            let mut changed = record_changes(AuthKind::User, &before.users, &records.users);
            changed.extend(record_changes(
                AuthKind::Role,
                &before.roles,
                &records.roles,
            ));
            let change = AuthWrite {
                read: (before.enabled, before.revision),
                enabled: records.enabled,
                revision,
                records: changed,
            };
            match store.change_auth(change).await {
                Ok(()) => {
                    self.install(AuthState::new(
                        records.enabled,
                        revision,
                        records.users,
                        records.roles,
                    ));
                    return Ok(());
                }
                Err(StoreError::AuthChanged) => continue,
                Err(error) => return Err(error.into()),
            }
        }
        Err(StoreError::AuthChanged.into())
    }

    /// AuthEnable: needs a root user holding the root role.
    pub async fn enable<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        self.change(store, |r| {
            if r.enabled {
                return Ok(Outcome::Unchanged);
            }
            let root = r.users.get(ROOT_USER).ok_or(AuthError::RootUserNotExist)?;
            if !root.roles.iter().any(|role| role == ROOT_ROLE) {
                return Err(AuthError::RootRoleNotExist);
            }
            r.enabled = true;
            Ok(Outcome::SameRevision)
        })
        .await
    }

    /// AuthDisable.
    pub async fn disable<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        self.change(store, |r| {
            if !r.enabled {
                return Ok(Outcome::Unchanged);
            }
            r.enabled = false;
            Ok(Outcome::NewRevision)
        })
        .await
    }

    /// AuthStatus: enabled and the auth revision.
    pub fn auth_status(&self, caller: &Caller) -> Result<(bool, u64), AuthError> {
        self.require_admin(caller)?;
        Ok(self.status())
    }

    /// Authenticate: checks the password (bcrypt, off the async threads)
    /// and issues a simple token.
    pub async fn authenticate(&self, name: &str, password: &str) -> Result<String, AuthError> {
        let state = self.state();
        if !state.enabled {
            return Err(AuthError::AuthNotEnabled);
        }
        let user = state.users.get(name).ok_or(AuthError::AuthFailed)?;
        if user.options.as_ref().is_some_and(|o| o.no_password) {
            return Err(AuthError::NoPasswordUser);
        }
        let hash = String::from_utf8_lossy(&user.password).into_owned();
        let password = password.to_string();
        let matches = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash))
            .await
            .map_err(|e| AuthError::Password(e.to_string()))?
            .unwrap_or(false);
        if !matches {
            tracing::info!(user = name, "invalid password");
            return Err(AuthError::AuthFailed);
        }
        // The user may have been deleted or changed while bcrypt ran.
        let now = self.state();
        if !now.enabled || now.users.get(name).map(|u| &u.password) != Some(&user.password) {
            return Err(AuthError::AuthFailed);
        }
        Ok(self.tokens.assign(name))
    }

    /// UserAdd.
    pub async fn user_add<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: String,
        password: String,
        options: Option<UserAddOptions>,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        if name.is_empty() {
            return Err(AuthError::UserEmpty);
        }
        let options = options.unwrap_or_default();
        let password = if options.no_password {
            Vec::new()
        } else {
            hash_password(password, self.options.bcrypt_cost).await?
        };
        self.change(store, |r| {
            if r.users.contains_key(&name) {
                return Err(AuthError::UserAlreadyExist);
            }
            r.users.insert(
                name.clone(),
                User {
                    name: name.clone().into_bytes(),
                    password: password.clone(),
                    roles: Vec::new(),
                    options: Some(options),
                },
            );
            Ok(Outcome::NewRevision)
        })
        .await
    }

    /// UserGet: an admin, or the user asking about itself.
    pub fn user_get(&self, caller: &Caller, name: &str) -> Result<Vec<String>, AuthError> {
        let state = self.state();
        if let Err(error) = state.admin_permitted(caller.user())
            && caller.user() != Some(name)
        {
            return Err(error);
        }
        let user = state.users.get(name).ok_or(AuthError::UserNotFound)?;
        Ok(user.roles.clone())
    }

    /// UserList.
    pub fn user_list(&self, caller: &Caller) -> Result<Vec<String>, AuthError> {
        self.require_admin(caller)?;
        Ok(self.state().users.keys().cloned().collect())
    }

    /// UserDelete: root cannot be deleted while auth is enabled.
    pub async fn user_delete<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: &str,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        self.change(store, |r| {
            if r.enabled && name == ROOT_USER {
                return Err(AuthError::InvalidAuthMgmt);
            }
            r.users.remove(name).ok_or(AuthError::UserNotFound)?;
            Ok(Outcome::NewRevision)
        })
        .await?;
        self.tokens.invalidate_user(name);
        Ok(())
    }

    /// UserChangePassword: a no-password user keeps having none.
    pub async fn user_change_password<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: &str,
        password: String,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        // Hashed before the user is looked up, as etcd's server does.
        let hash = hash_password(password, self.options.bcrypt_cost).await?;
        self.change(store, |r| {
            let user = r.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
            if !user.options.as_ref().is_some_and(|o| o.no_password) {
                user.password = hash.clone();
            }
            Ok(Outcome::NewRevision)
        })
        .await?;
        self.tokens.invalidate_user(name);
        Ok(())
    }

    /// UserGrantRole: the root role need not exist as a role; granting a
    /// role twice changes nothing.
    pub async fn user_grant_role<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        user: &str,
        role: &str,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        self.change(store, |r| {
            if !r.users.contains_key(user) {
                return Err(AuthError::UserNotFound);
            }
            if role != ROOT_ROLE && !r.roles.contains_key(role) {
                return Err(AuthError::RoleNotFound);
            }
            let user = r.users.get_mut(user).expect("checked above");
            match user.roles.binary_search_by(|r| r.as_str().cmp(role)) {
                Ok(_) => Ok(Outcome::Unchanged),
                Err(at) => {
                    user.roles.insert(at, role.to_string());
                    Ok(Outcome::NewRevision)
                }
            }
        })
        .await
    }

    /// UserRevokeRole: root keeps the root role while auth is enabled.
    pub async fn user_revoke_role<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: &str,
        role: &str,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        self.change(store, |r| {
            if r.enabled && name == ROOT_USER && role == ROOT_ROLE {
                return Err(AuthError::InvalidAuthMgmt);
            }
            let user = r.users.get_mut(name).ok_or(AuthError::UserNotFound)?;
            let before = user.roles.len();
            user.roles.retain(|r| r != role);
            if user.roles.len() == before {
                return Err(AuthError::RoleNotGranted);
            }
            Ok(Outcome::NewRevision)
        })
        .await
    }

    /// RoleAdd.
    pub async fn role_add<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: &str,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        if name.is_empty() {
            return Err(AuthError::RoleEmpty);
        }
        self.change(store, |r| {
            if r.roles.contains_key(name) {
                return Err(AuthError::RoleAlreadyExist);
            }
            r.roles.insert(
                name.to_string(),
                Role {
                    name: name.as_bytes().to_vec(),
                    key_permission: Vec::new(),
                },
            );
            Ok(Outcome::NewRevision)
        })
        .await
    }

    /// RoleGet: an admin, or a user holding the role.
    pub fn role_get(&self, caller: &Caller, name: &str) -> Result<Vec<Permission>, AuthError> {
        let state = self.state();
        if let Err(error) = state.admin_permitted(caller.user()) {
            let holds = caller
                .user()
                .and_then(|u| state.users.get(u))
                .is_some_and(|u| u.roles.iter().any(|r| r == name));
            if !holds {
                return Err(error);
            }
        }
        let role = state.roles.get(name).ok_or(AuthError::RoleNotFound)?;
        Ok(role.key_permission.clone())
    }

    /// RoleList.
    pub fn role_list(&self, caller: &Caller) -> Result<Vec<String>, AuthError> {
        self.require_admin(caller)?;
        Ok(self.state().roles.keys().cloned().collect())
    }

    /// RoleDelete: also revokes the role from every user; the root role
    /// stays while auth is enabled.
    pub async fn role_delete<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: &str,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        self.change(store, |r| {
            if r.enabled && name == ROOT_ROLE {
                return Err(AuthError::InvalidAuthMgmt);
            }
            r.roles.remove(name).ok_or(AuthError::RoleNotFound)?;
            for user in r.users.values_mut() {
                user.roles.retain(|role| role != name);
            }
            Ok(Outcome::NewRevision)
        })
        .await
    }

    /// RoleGrantPermission: adds a permission, or changes the type of the
    /// one on the same key and range end; permissions stay sorted by key.
    pub async fn role_grant_permission<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: &str,
        perm: Option<Permission>,
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        let perm = perm.ok_or(AuthError::PermissionNotGiven)?;
        if !is_valid_permission_range(&perm.key, &perm.range_end) {
            return Err(AuthError::InvalidAuthMgmt);
        }
        self.change(store, |r| {
            let role = r.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
            let perms = &mut role.key_permission;
            let at = perms.partition_point(|p| p.key < perm.key);
            if at < perms.len()
                && perms[at].key == perm.key
                && perms[at].range_end == perm.range_end
            {
                perms[at].perm_type = perm.perm_type;
            } else {
                perms.push(perm.clone());
                perms.sort_by(|a, b| a.key.cmp(&b.key));
            }
            Ok(Outcome::NewRevision)
        })
        .await
    }

    /// RoleRevokePermission: removes the permission on exactly that key and range end.
    pub async fn role_revoke_permission<B: Backend>(
        &self,
        store: &Store<B>,
        caller: &Caller,
        name: &str,
        key: &[u8],
        range_end: &[u8],
    ) -> Result<(), AuthError> {
        self.require_admin(caller)?;
        self.change(store, |r| {
            let role = r.roles.get_mut(name).ok_or(AuthError::RoleNotFound)?;
            let before = role.key_permission.len();
            role.key_permission
                .retain(|p| p.key != key || p.range_end != range_end);
            if role.key_permission.len() == before {
                return Err(AuthError::PermissionNotGranted);
            }
            Ok(Outcome::NewRevision)
        })
        .await
    }
}

/// The records to store or remove to go from `before` to `after`.
fn record_changes<M: Message + PartialEq>(
    kind: AuthKind,
    before: &BTreeMap<String, M>,
    after: &BTreeMap<String, M>,
) -> Vec<(AuthKind, Vec<u8>, Option<Vec<u8>>)> {
    let removed = before
        .keys()
        .filter(|name| !after.contains_key(*name))
        .map(|name| (kind, name.as_bytes().to_vec(), None));
    let stored = after
        .iter()
        .filter(|(name, record)| before.get(*name) != Some(*record))
        .map(|(name, record)| (kind, name.as_bytes().to_vec(), Some(record.encode_to_vec())));
    removed.chain(stored).collect()
}
