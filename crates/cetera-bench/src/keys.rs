//! Key and value generation: `prefix` + zero-padded index, random or sequential picks.

use rand::{Rng, SeedableRng, rngs::StdRng};

use crate::Common;

/// The prefix of the put, range, txn-cas and populate scenarios.
pub const DEFAULT_PREFIX: &str = "bench/";

/// Builds keys of `--key-size` bytes and values of `--val-size` bytes.
#[derive(Clone)]
pub struct Keys {
    pub prefix: String,
    width: usize,
    pub space: u64,
    pub seq: bool,
    value: Vec<u8>,
}

impl Keys {
    pub fn new(common: &Common, prefix: String) -> Keys {
        let digits = common.key_space.max(1).to_string().len();
        let width = common.key_size.saturating_sub(prefix.len()).max(digits);
        let mut rng = StdRng::seed_from_u64(common.seed ^ 0x5eed);
        let value = (0..common.val_size)
            .map(|_| rng.random_range(b'a'..=b'z'))
            .collect();
        Keys {
            prefix,
            width,
            space: common.key_space.max(1),
            seq: common.seq,
            value,
        }
    }

    /// The key with index `index`: prefix + index padded with zeros to the key size.
    pub fn key(&self, index: u64) -> Vec<u8> {
        format!("{}{index:0width$}", self.prefix, width = self.width).into_bytes()
    }

    /// The index for operation `op`: `op` modulo the key space with `--seq`, else random.
    pub fn pick(&self, op: u64, rng: &mut StdRng) -> u64 {
        if self.seq {
            op % self.space
        } else {
            rng.random_range(0..self.space)
        }
    }

    /// A value of `--val-size` bytes (the same random letters every time).
    pub fn value(&self) -> Vec<u8> {
        self.value.clone()
    }

    /// The end of the prefix range: the prefix with its last byte incremented.
    pub fn range_end(&self) -> Vec<u8> {
        prefix_end(self.prefix.as_bytes())
    }
}

/// etcd's prefix range end: the smallest key greater than every key with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// A per-client random generator, reproducible from `--seed`.
pub fn rng(seed: u64, client: usize) -> StdRng {
    StdRng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(client as u64))
}
