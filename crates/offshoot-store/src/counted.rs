//! Counting the statements a call sends to the database, so a test can show that a read does
//! not grow with its input (Query Channels is a fixed number of statements, whatever the
//! number of channels). Every statement of the store goes through [`counted`]; the count is
//! kept per task, and only inside [`count_statements`].

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use sqlx::any::{AnyQueryResult, AnyRow, AnyStatement, AnyTypeInfo};
use sqlx::{Any, Describe, Either, Error, Execute, Executor, SqlStr};
use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static STATEMENTS: Cell<u64>;
}

/// Runs `f` and returns its output with the number of statements the store sent meanwhile
/// (on this task: run the calls to count directly in `f`, not in spawned tasks).
pub async fn count_statements<F: Future>(f: F) -> (F::Output, u64) {
    STATEMENTS
        .scope(Cell::new(0), async {
            let out = f.await;
            (out, STATEMENTS.with(Cell::get))
        })
        .await
}

fn count() {
    add(1);
}

/// Counts `n` statements sent for this task by another (a group of message updates, `batch.rs`).
pub(crate) fn add(n: u64) {
    let _ = STATEMENTS.try_with(|c| c.set(c.get() + n));
}

/// An executor (pool, connection or transaction) whose statements are counted.
#[derive(Debug)]
pub(crate) struct Counted<E>(E);

pub(crate) fn counted<E>(executor: E) -> Counted<E> {
    Counted(executor)
}

impl<'c, E: Executor<'c, Database = Any>> Executor<'c> for Counted<E> {
    type Database = Any;

    fn fetch_many<'e, 'q: 'e, Q>(self, query: Q) -> BoxStream<'e, Result<Either<AnyQueryResult, AnyRow>, Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Any>,
    {
        count();
        self.0.fetch_many(query)
    }

    fn fetch_optional<'e, 'q: 'e, Q>(self, query: Q) -> BoxFuture<'e, Result<Option<AnyRow>, Error>>
    where
        'c: 'e,
        Q: 'q + Execute<'q, Any>,
    {
        count();
        self.0.fetch_optional(query)
    }

    fn prepare_with<'e>(self, sql: SqlStr, parameters: &'e [AnyTypeInfo]) -> BoxFuture<'e, Result<AnyStatement, Error>>
    where
        'c: 'e,
    {
        self.0.prepare_with(sql, parameters)
    }

    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<Describe<Any>, Error>>
    where
        'c: 'e,
    {
        self.0.describe(sql)
    }
}
