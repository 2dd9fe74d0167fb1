//! etcd's simple tokens: `<16 random letters>.<index>`, kept in memory on the
//! instance that issued them, each valid until it goes unused for the token
//! TTL (`--auth-token-ttl`), as etcd's simpleTokenTTLKeeper does.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;

const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
const PREFIX_LENGTH: usize = 16;

struct Token {
    user: String,
    expires: Instant,
}

/// The tokens this instance issued.
pub struct TokenStore {
    ttl: Duration,
    tokens: Mutex<HashMap<String, Token>>,
    /// The number after the dot; etcd uses its raft index there.
    index: AtomicU64,
}

impl TokenStore {
    /// An empty table whose tokens live `ttl` past their last use.
    pub fn new(ttl: Duration) -> Self {
        TokenStore {
            ttl,
            tokens: Mutex::new(HashMap::new()),
            index: AtomicU64::new(1),
        }
    }

    /// Issues a new token for `user`.
    pub fn assign(&self, user: &str) -> String {
        let mut rng = rand::rng();
        let prefix: String = (0..PREFIX_LENGTH)
            .map(|_| LETTERS[rng.random_range(0..LETTERS.len())] as char)
            .collect();
        let index = self.index.fetch_add(1, Ordering::Relaxed);
        let token = format!("{prefix}.{index}");
        let now = Instant::now();
        let mut tokens = self.tokens.lock().expect("token table poisoned");
        tokens.retain(|_, t| t.expires > now);
        tokens.insert(
            token.clone(),
            Token {
                user: user.to_string(),
                expires: now + self.ttl,
            },
        );
        token
    }

    /// The user of a valid token, whose lifetime starts over.
    pub fn user(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        let mut tokens = self.tokens.lock().expect("token table poisoned");
        let entry = tokens.get_mut(token)?;
        if entry.expires <= now {
            tokens.remove(token);
            return None;
        }
        entry.expires = now + self.ttl;
        Some(entry.user.clone())
    }

    /// Drops every token of `user` (deleted, or its password changed).
    pub fn invalidate_user(&self, user: &str) {
        self.tokens
            .lock()
            .expect("token table poisoned")
            .retain(|_, t| t.user != user);
    }

    /// Drops every token (auth disabled).
    pub fn clear(&self) {
        self.tokens.lock().expect("token table poisoned").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_have_etcds_simple_form_and_can_be_revoked() {
        let store = TokenStore::new(Duration::from_secs(300));
        let token = store.assign("alice");
        let (prefix, index) = token.split_once('.').unwrap();
        assert_eq!(prefix.len(), 16);
        assert!(prefix.bytes().all(|b| b.is_ascii_alphabetic()));
        assert!(index.parse::<u64>().is_ok());
        assert_eq!(store.user(&token).as_deref(), Some("alice"));
        store.invalidate_user("alice");
        assert_eq!(store.user(&token), None);
    }

    #[test]
    fn unused_tokens_expire() {
        let store = TokenStore::new(Duration::ZERO);
        let token = store.assign("bob");
        assert_eq!(store.user(&token), None);
    }
}
