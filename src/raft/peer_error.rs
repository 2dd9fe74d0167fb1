//! A failed call to another member, and what it says of the call: whether
//! the peer may have taken it (`TimedOut`) or surely did not
//! (`Unreachable`), which decides whether it may be sent again.

/// A failed peer call.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PeerError {
    /// The peer could not be reached: nothing was delivered.
    #[error("cannot reach {url}: {message}")]
    Unreachable {
        /// The peer.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The peer did not answer in time: the call may or may not have
    /// taken effect.
    #[error("{url} did not answer in time: {message}")]
    TimedOut {
        /// The peer.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The peer answered with an error status.
    #[error("{url} refused: {status}")]
    Refused {
        /// The peer.
        url: String,
        /// Its answer.
        status: tonic::Status,
    },
    /// The answer did not decode.
    #[error("{url} answered something unreadable: {message}")]
    Garbled {
        /// The peer.
        url: String,
        /// What went wrong.
        message: String,
    },
}
