//! `StreamRange` on Postgres: the range statement `range` runs, executed
//! once inside the read transaction, its rows taken from the connection as
//! each chunk is asked for.

use std::pin::Pin;

use anyhow::bail;
use tokio_postgres::RowStream;
use tokio_stream::StreamExt;

use super::db_error;
use super::queries::{key_params, range_sql, sql_limit};
use super::txn::{PostgresRead, TxnConn};
use crate::backend::range_stream::{RangeRows, StreamRange};
use crate::backend::rows::kv_from_row;
use crate::backend::{BackendResult, KeyRange, ReadAt};
use crate::proto::mvccpb::KeyValue;

impl StreamRange for PostgresRead {
    type Rows<'a> = PostgresRows<'a>;

    async fn range_rows<'a>(
        &'a mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> BackendResult<PostgresRows<'a>> {
        let limit = sql_limit(limit);
        let mut params = key_params(range, &at);
        params.push(&limit);
        let sql = range_sql(at, range.end.is_some(), keys_only);
        let conn = self.conn().await?;
        let rows = conn.query_stream(sql, &params).await?;
        Ok(PostgresRows {
            conn,
            rows: Box::pin(rows),
            last: None,
        })
    }
}

/// The rows of one range statement, as Postgres sends them.
pub struct PostgresRows<'a> {
    conn: &'a mut TxnConn,
    rows: Pin<Box<RowStream>>,
    /// The last key handed out, to check the order.
    last: Option<Vec<u8>>,
}

impl RangeRows for PostgresRows<'_> {
    async fn next_chunk(&mut self, n: usize) -> BackendResult<Vec<KeyValue>> {
        let mut kvs = Vec::with_capacity(n.min(1024));
        while kvs.len() < n {
            let row = match self.rows.next().await {
                None => break,
                Some(Ok(row)) => row,
                Some(Err(error)) => {
                    self.conn.note_failure();
                    return Err(db_error(&error));
                }
            };
            let kv = kv_from_row(&row)?;
            // The historical statement has no outer ORDER BY (see queries.rs).
            let previous = kvs
                .last()
                .map(|kv: &KeyValue| &kv.key)
                .or(self.last.as_ref());
            if previous.is_some_and(|previous| *previous >= kv.key) {
                bail!("Postgres returned a range out of key order");
            }
            kvs.push(kv);
        }
        if let Some(kv) = kvs.last() {
            self.last = Some(kv.key.clone());
        }
        Ok(kvs)
    }
}
