//! The etcd snapshot loader (`cetera restore`, `cetera migrate --from
//! etcd-snapshot://`) on arbitrary bytes: an error, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cetera::migrate::etcd_snapshot::parse(data);
});
