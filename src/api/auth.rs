//! The Auth service: enable/disable/status, Authenticate, and user and role
//! management. The rules live in `crate::auth`; this layer reads the token
//! from the request metadata and fills response headers.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::ServerInfo;
use crate::auth::Auth;
use crate::backend::Backend;
use crate::proto::etcdserverpb::auth_server::Auth as AuthRpc;
use crate::proto::etcdserverpb::*;
use crate::store::Store;

/// The Auth service on a store.
pub struct AuthService<B: Backend> {
    store: Arc<Store<B>>,
    info: Arc<ServerInfo>,
}

impl<B: Backend> AuthService<B> {
    /// The service managing the users and roles of `store`.
    pub fn new(store: Arc<Store<B>>, info: Arc<ServerInfo>) -> Self {
        AuthService { store, info }
    }

    fn auth(&self) -> &Auth {
        &self.info.auth
    }

    fn header(&self) -> Option<ResponseHeader> {
        self.info.header(self.store.revisions().current)
    }
}

#[tonic::async_trait]
impl<B: Backend> AuthRpc for AuthService<B> {
    async fn auth_enable(
        &self,
        request: Request<AuthEnableRequest>,
    ) -> Result<Response<AuthEnableResponse>, Status> {
        self.auth()
            .enable(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
            )
            .await?;
        Ok(Response::new(AuthEnableResponse {
            header: self.header(),
        }))
    }

    async fn auth_disable(
        &self,
        request: Request<AuthDisableRequest>,
    ) -> Result<Response<AuthDisableResponse>, Status> {
        self.auth()
            .disable(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
            )
            .await?;
        Ok(Response::new(AuthDisableResponse {
            header: self.header(),
        }))
    }

    async fn auth_status(
        &self,
        request: Request<AuthStatusRequest>,
    ) -> Result<Response<AuthStatusResponse>, Status> {
        let (enabled, auth_revision) = self
            .auth()
            .auth_status(&self.info.caller(request.metadata(), request.extensions())?)?;
        Ok(Response::new(AuthStatusResponse {
            header: self.header(),
            enabled,
            auth_revision,
        }))
    }

    async fn authenticate(
        &self,
        request: Request<AuthenticateRequest>,
    ) -> Result<Response<AuthenticateResponse>, Status> {
        let req = request.into_inner();
        let token = self.auth().authenticate(&req.name, &req.password).await?;
        Ok(Response::new(AuthenticateResponse {
            header: self.header(),
            token,
        }))
    }

    async fn user_add(
        &self,
        request: Request<AuthUserAddRequest>,
    ) -> Result<Response<AuthUserAddResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        self.auth()
            .user_add(
                &self.store,
                &self.info.caller(&metadata, &extensions)?,
                req.name,
                req.password,
                req.options,
            )
            .await?;
        Ok(Response::new(AuthUserAddResponse {
            header: self.header(),
        }))
    }

    async fn user_get(
        &self,
        request: Request<AuthUserGetRequest>,
    ) -> Result<Response<AuthUserGetResponse>, Status> {
        let roles = self.auth().user_get(
            &self.info.caller(request.metadata(), request.extensions())?,
            &request.get_ref().name,
        )?;
        Ok(Response::new(AuthUserGetResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn user_list(
        &self,
        request: Request<AuthUserListRequest>,
    ) -> Result<Response<AuthUserListResponse>, Status> {
        let users = self
            .auth()
            .user_list(&self.info.caller(request.metadata(), request.extensions())?)?;
        Ok(Response::new(AuthUserListResponse {
            header: self.header(),
            users,
        }))
    }

    async fn user_delete(
        &self,
        request: Request<AuthUserDeleteRequest>,
    ) -> Result<Response<AuthUserDeleteResponse>, Status> {
        self.auth()
            .user_delete(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
                &request.get_ref().name,
            )
            .await?;
        Ok(Response::new(AuthUserDeleteResponse {
            header: self.header(),
        }))
    }

    async fn user_change_password(
        &self,
        request: Request<AuthUserChangePasswordRequest>,
    ) -> Result<Response<AuthUserChangePasswordResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        self.auth()
            .user_change_password(
                &self.store,
                &self.info.caller(&metadata, &extensions)?,
                &req.name,
                req.password,
            )
            .await?;
        Ok(Response::new(AuthUserChangePasswordResponse {
            header: self.header(),
        }))
    }

    async fn user_grant_role(
        &self,
        request: Request<AuthUserGrantRoleRequest>,
    ) -> Result<Response<AuthUserGrantRoleResponse>, Status> {
        let req = request.get_ref();
        self.auth()
            .user_grant_role(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
                &req.user,
                &req.role,
            )
            .await?;
        Ok(Response::new(AuthUserGrantRoleResponse {
            header: self.header(),
        }))
    }

    async fn user_revoke_role(
        &self,
        request: Request<AuthUserRevokeRoleRequest>,
    ) -> Result<Response<AuthUserRevokeRoleResponse>, Status> {
        let req = request.get_ref();
        self.auth()
            .user_revoke_role(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
                &req.name,
                &req.role,
            )
            .await?;
        Ok(Response::new(AuthUserRevokeRoleResponse {
            header: self.header(),
        }))
    }

    async fn role_add(
        &self,
        request: Request<AuthRoleAddRequest>,
    ) -> Result<Response<AuthRoleAddResponse>, Status> {
        self.auth()
            .role_add(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
                &request.get_ref().name,
            )
            .await?;
        Ok(Response::new(AuthRoleAddResponse {
            header: self.header(),
        }))
    }

    async fn role_get(
        &self,
        request: Request<AuthRoleGetRequest>,
    ) -> Result<Response<AuthRoleGetResponse>, Status> {
        let perm = self.auth().role_get(
            &self.info.caller(request.metadata(), request.extensions())?,
            &request.get_ref().role,
        )?;
        Ok(Response::new(AuthRoleGetResponse {
            header: self.header(),
            perm,
        }))
    }

    async fn role_list(
        &self,
        request: Request<AuthRoleListRequest>,
    ) -> Result<Response<AuthRoleListResponse>, Status> {
        let roles = self
            .auth()
            .role_list(&self.info.caller(request.metadata(), request.extensions())?)?;
        Ok(Response::new(AuthRoleListResponse {
            header: self.header(),
            roles,
        }))
    }

    async fn role_delete(
        &self,
        request: Request<AuthRoleDeleteRequest>,
    ) -> Result<Response<AuthRoleDeleteResponse>, Status> {
        self.auth()
            .role_delete(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
                &request.get_ref().role,
            )
            .await?;
        Ok(Response::new(AuthRoleDeleteResponse {
            header: self.header(),
        }))
    }

    async fn role_grant_permission(
        &self,
        request: Request<AuthRoleGrantPermissionRequest>,
    ) -> Result<Response<AuthRoleGrantPermissionResponse>, Status> {
        let (metadata, extensions, req) = request.into_parts();
        self.auth()
            .role_grant_permission(
                &self.store,
                &self.info.caller(&metadata, &extensions)?,
                &req.name,
                req.perm,
            )
            .await?;
        Ok(Response::new(AuthRoleGrantPermissionResponse {
            header: self.header(),
        }))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<AuthRoleRevokePermissionRequest>,
    ) -> Result<Response<AuthRoleRevokePermissionResponse>, Status> {
        let req = request.get_ref();
        self.auth()
            .role_revoke_permission(
                &self.store,
                &self.info.caller(request.metadata(), request.extensions())?,
                &req.role,
                &req.key,
                &req.range_end,
            )
            .await?;
        Ok(Response::new(AuthRoleRevokePermissionResponse {
            header: self.header(),
        }))
    }
}
