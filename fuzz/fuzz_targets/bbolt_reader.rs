//! The bbolt reader on arbitrary bytes: every top-level bucket and every
//! nested bucket it names is walked; an error, never a panic or a hang.
#![no_main]

use cetera::bbolt::Db;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(db) = Db::open(data) else { return };
    let mut names = Vec::new();
    let _ = db.for_each(db.bucket_root(), &mut |key, _, _| {
        names.push(key);
        Ok(())
    });
    for name in names {
        if let Ok(Some(bucket)) = db.bucket(name) {
            let _ = db.for_each(bucket, &mut |_, _, _| Ok(()));
        }
    }
});
