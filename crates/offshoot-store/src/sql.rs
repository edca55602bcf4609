//! Generic helpers of dynamically built statements: bind values and their arguments.

use crate::Result;
use sqlx::any::AnyArguments;
use sqlx::Arguments;

/// A bind value of a dynamically built statement.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    S(String),
    I(i64),
    F(f64),
}

/// The arguments of a dynamically built statement, for `sqlx::query_with` and its kin.
pub(crate) fn arguments(binds: &[Bind]) -> Result<AnyArguments> {
    let mut args = AnyArguments::default();
    for b in binds {
        match b {
            Bind::S(s) => args.add(s.clone()),
            Bind::I(i) => args.add(*i),
            Bind::F(f) => args.add(*f),
        }
        .map_err(|e| crate::StoreError::Db(sqlx::Error::Encode(e)))?;
    }
    Ok(args)
}

impl Bind {
    pub(crate) fn clone_str(&self) -> String {
        match self {
            Bind::S(s) => s.clone(),
            Bind::I(i) => i.to_string(),
            Bind::F(f) => f.to_string(),
        }
    }
}

/// Several statements' rows in one: `UNION ALL` of each, as a subquery so that each keeps its
/// own `ORDER BY … LIMIT` (and its index scan). The caller orders the result.
pub(crate) fn union_all(statements: &[String]) -> String {
    statements.iter().enumerate().map(|(i, s)| format!("SELECT * FROM ({s}) AS u{i}")).collect::<Vec<_>>().join(" UNION ALL ")
}
