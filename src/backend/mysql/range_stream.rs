//! `StreamRange` on MySQL: the range statement `query_range` runs, executed
//! once inside the read transaction, its rows read off the connection as
//! each chunk is asked for (mysql_async reads a result set row by row, so
//! the rest waits in the server and the socket).

use anyhow::Context;
use mysql_async::BinaryProtocol;
use mysql_async::QueryResult;
use mysql_async::prelude::Queryable;

use super::db_error;
use super::queries::{NO_LIMIT, range_params, range_sql};
use super::txn::MysqlRead;
use crate::backend::range_stream::{RangeRows, StreamRange};
use crate::backend::rows::kv_from_row;
use crate::backend::{BackendResult, KeyRange, ReadAt};
use crate::proto::mvccpb::KeyValue;

impl StreamRange for MysqlRead {
    type Rows<'a> = MysqlRows<'a>;

    async fn range_rows<'a>(
        &'a mut self,
        range: &KeyRange,
        at: ReadAt,
        limit: usize,
        keys_only: bool,
    ) -> BackendResult<MysqlRows<'a>> {
        let limit = if limit == 0 { NO_LIMIT } else { limit as u64 };
        let sql = range_sql(at, range.end.is_some(), false, keys_only);
        let params = range_params(range, at, Some(limit));
        let rows = self
            .session
            .begun()
            .await?
            .exec_iter(sql.as_str(), params)
            .await
            .map_err(db_error)
            .with_context(|| format!("MySQL query failed: {sql}"))?;
        Ok(MysqlRows { rows })
    }
}

/// The rows of one range statement, as MySQL sends them.
pub struct MysqlRows<'a> {
    rows: QueryResult<'a, 'static, BinaryProtocol>,
}

impl RangeRows for MysqlRows<'_> {
    async fn next_chunk(&mut self, n: usize) -> BackendResult<Vec<KeyValue>> {
        let mut kvs = Vec::with_capacity(n.min(1024));
        while kvs.len() < n {
            let Some(row) = self.rows.next().await.map_err(db_error)? else {
                break;
            };
            kvs.push(kv_from_row(&row).context("unexpected row from the range statement")?);
        }
        Ok(kvs)
    }
}
