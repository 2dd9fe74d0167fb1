//! Replicated mode: three or more cetera members keep copies of one SQLite
//! store in step through Raft (openraft).
//!
//! Writes become `Proposal`s in a replicated log (`log_store`, fsynced before
//! a member acknowledges an append); the leader puts the proposals that come
//! while its last entries are in flight into one entry (`proposer`). Once a quorum holds an entry, every
//! member applies it through its ordinary local writer (`state_machine`),
//! which stores the entry's position (its `Mark`) in the same SQLite commit:
//! entries apply exactly once, with the same revisions everywhere, and the
//! store itself is the state machine's snapshot. Members talk over cetera's
//! own peer service (`peer`), and a `Cluster` ties it together: it proposes
//! this member's writes (forwarding them to the leader when it follows),
//! answers linearizable reads after a read index, and reports membership,
//! leader and term to the etcd API. Membership changes (`membership`) and
//! leadership handovers (`leadership`) are the leader's to make.

mod cluster;
mod election;
mod forwarder;
mod leader_call;
mod leadership;
mod leases;
mod log_store;
mod member;
mod membership;
mod network;
mod node;
mod openraft_reports;
mod openraft_types;
mod peer;
mod peer_error;
mod prober;
mod proposal;
mod proposer;
mod reachability;
mod refusal;
mod state_machine;

pub use self::cluster::{Cluster, ClusterOptions, JoinMode, PeerTls};
pub use self::leadership::HandoverError;
pub use self::member::Member;
pub use self::membership::MembershipChange;
pub use self::openraft_reports::is_per_call_report;
pub use self::refusal::MembershipError;
