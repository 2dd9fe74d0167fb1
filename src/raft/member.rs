//! A cluster member as Raft's membership records it: the URLs other members
//! and clients reach it at.

use serde::{Deserialize, Serialize};

/// A member's addresses, as MemberList reports them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The member's --name.
    pub name: String,
    /// Where other members reach its peer service.
    pub peer_url: String,
    /// Where clients reach its etcd API.
    pub client_urls: Vec<String>,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.peer_url)
    }
}
