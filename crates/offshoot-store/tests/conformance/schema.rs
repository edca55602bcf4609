//! The two migration folders: the same versions, and the same resulting schema (tables,
//! columns with their normalised types and nullability, primary keys, indexes).

use crate::support::{require_postgres, TestBackend, TestDb};
use offshoot_store::Store;
use sqlx::{Connection, PgConnection, SqliteConnection};
use std::collections::{BTreeMap, BTreeSet};

fn migration_names(dir: &str) -> BTreeSet<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations").join(dir);
    std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
        .map(|entry| entry.expect("directory entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".sql"))
        .collect()
}

#[test]
fn sqlite_and_postgres_migrations_have_the_same_versions() {
    let sqlite = migration_names("sqlite");
    let postgres = migration_names("postgres");
    assert!(!sqlite.is_empty(), "migrations/sqlite holds no migrations");
    assert_eq!(sqlite, postgres, "migrations/sqlite and migrations/postgres must hold the same file names");
    for name in &sqlite {
        let version = name.split('_').next().unwrap_or_default();
        assert!(!version.is_empty() && version.chars().all(|c| c.is_ascii_digit()), "{name} does not start with a version number");
    }
}

/// A column as both engines can describe it.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Column {
    name: String,
    /// `text`, `bigint` or `boolean` (see [`sqlite_type`]).
    ty: String,
    not_null: bool,
}

/// An index: its table, columns in order, whether it is unique and whether it is partial; the
/// name only for indexes created by `CREATE INDEX` (constraint indexes are named by the engine).
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Index {
    table: String,
    name: Option<String>,
    columns: Vec<String>,
    unique: bool,
    partial: bool,
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Schema {
    columns: BTreeMap<String, Vec<Column>>,
    primary_keys: BTreeMap<String, Vec<String>>,
    indexes: BTreeSet<Index>,
}

/// SQLite's declared types in the normalised form. Flags are INTEGER on SQLite because sqlx's
/// `Any` driver refuses SQLite columns declared BOOLEAN (the store's crate doc); every other
/// integer is BIGINT, except the outbox's `INTEGER PRIMARY KEY`, which SQLite needs for its
/// auto-increment.
fn sqlite_type(declared: &str, primary_key: bool) -> String {
    match declared.to_ascii_uppercase().as_str() {
        "TEXT" => "text".into(),
        "BIGINT" => "bigint".into(),
        "INTEGER" if primary_key => "bigint".into(),
        "INTEGER" => "boolean".into(),
        other => other.to_ascii_lowercase(),
    }
}

fn postgres_type(data_type: &str) -> String {
    data_type.to_string()
}

/// The full-text indexes of message search are each engine's own (both
/// 0020_message_search_document.sql): SQLite's FTS5 table and the shadow tables FTS5 keeps for
/// it, PostgreSQL's GIN index of the generated column `message.search_document`. They are left
/// out of the comparison and checked to exist on their side.
const SQLITE_FULL_TEXT_TABLES: [&str; 5] =
    ["message_search", "message_search_config", "message_search_data", "message_search_docsize", "message_search_idx"];
const POSTGRES_FULL_TEXT_INDEX: &str = "message_search";
const POSTGRES_FULL_TEXT_COLUMN: (&str, &str) = ("message", "search_document");

async fn sqlite_schema(url: &str) -> Schema {
    let mut conn = SqliteConnection::connect(url).await.expect("open the SQLite database");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_sqlx%' ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .expect("tables");
    let full_text: Vec<&String> = tables.iter().filter(|t| SQLITE_FULL_TEXT_TABLES.contains(&t.as_str())).collect();
    assert_eq!(full_text.len(), SQLITE_FULL_TEXT_TABLES.len(), "the message search tables exist: {tables:?}");
    let mut schema = Schema::default();
    for table in tables.into_iter().filter(|t| !SQLITE_FULL_TEXT_TABLES.contains(&t.as_str())) {
        // (cid, name, type, notnull, default, pk)
        let cols: Vec<(i64, String, String, bool, Option<String>, i64)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("PRAGMA table_info('{table}')"))).fetch_all(&mut conn).await.expect("table_info");
        let mut pk: Vec<(i64, String)> = cols.iter().filter(|c| c.5 > 0).map(|c| (c.5, c.1.clone())).collect();
        pk.sort();
        schema.primary_keys.insert(table.clone(), pk.into_iter().map(|(_, name)| name).collect());
        let mut columns: Vec<Column> = cols
            .iter()
            // SQLite lets a non-INTEGER primary key hold NULL unless told otherwise; PostgreSQL
            // never does. The store never writes one, so both count as NOT NULL.
            .map(|c| Column { name: c.1.clone(), ty: sqlite_type(&c.2, c.5 > 0), not_null: c.3 || c.5 > 0 })
            .collect();
        columns.sort();
        schema.columns.insert(table.clone(), columns);
        // (seq, name, unique, origin, partial)
        let list: Vec<(i64, String, bool, String, bool)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!("PRAGMA index_list('{table}')"))).fetch_all(&mut conn).await.expect("index_list");
        for (_, name, unique, origin, partial) in list {
            if origin == "pk" {
                continue;
            }
            // (seqno, cid, name)
            let mut cols: Vec<(i64, i64, String)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!("PRAGMA index_info('{name}')"))).fetch_all(&mut conn).await.expect("index_info");
            cols.sort();
            schema.indexes.insert(Index {
                table: table.clone(),
                name: (origin == "c").then_some(name),
                columns: cols.into_iter().map(|c| c.2).collect(),
                unique,
                partial,
            });
        }
    }
    conn.close().await.ok();
    schema
}

async fn postgres_schema(url: &str) -> Schema {
    let mut conn = PgConnection::connect(url).await.expect("open the PostgreSQL database");
    let cols: Vec<(String, String, String, String)> = sqlx::query_as(
        "SELECT c.table_name::text, c.column_name::text, c.data_type::text, c.is_nullable::text FROM information_schema.columns c \
         JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name \
         WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE' AND c.table_name NOT LIKE '\\_sqlx%'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("columns");
    let mut schema = Schema::default();
    assert!(cols.iter().any(|c| (c.0.as_str(), c.1.as_str()) == POSTGRES_FULL_TEXT_COLUMN), "the message search document exists");
    for (table, name, data_type, nullable) in cols.into_iter().filter(|c| (c.0.as_str(), c.1.as_str()) != POSTGRES_FULL_TEXT_COLUMN) {
        schema.columns.entry(table).or_default().push(Column { name, ty: postgres_type(&data_type), not_null: nullable == "NO" });
    }
    for columns in schema.columns.values_mut() {
        columns.sort();
    }
    // Every index of the public tables with its columns in index order.
    #[derive(sqlx::FromRow)]
    struct PgIndex {
        table_name: String,
        name: String,
        is_unique: bool,
        is_primary: bool,
        partial: bool,
        of_constraint: bool,
        columns: Vec<String>,
    }
    let indexes: Vec<PgIndex> = sqlx::query_as(
        "SELECT t.relname::text AS table_name, i.relname::text AS name, x.indisunique AS is_unique, x.indisprimary AS is_primary, \
         x.indpred IS NOT NULL AS partial, EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid) AS of_constraint, \
         ARRAY(SELECT a.attname::text FROM unnest(x.indkey) WITH ORDINALITY AS k(attnum, n) \
               JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum ORDER BY k.n) AS columns \
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid \
         JOIN pg_namespace n ON n.oid = t.relnamespace WHERE n.nspname = 'public' AND t.relname NOT LIKE '\\_sqlx%'",
    )
    .fetch_all(&mut conn)
    .await
    .expect("indexes");
    for table in schema.columns.keys() {
        schema.primary_keys.insert(table.clone(), Vec::new());
    }
    assert!(indexes.iter().any(|x| x.name == POSTGRES_FULL_TEXT_INDEX), "the message search index exists");
    for x in indexes.into_iter().filter(|x| x.name != POSTGRES_FULL_TEXT_INDEX) {
        if x.is_primary {
            schema.primary_keys.insert(x.table_name, x.columns);
            continue;
        }
        schema.indexes.insert(Index {
            table: x.table_name,
            name: (!x.of_constraint).then_some(x.name),
            columns: x.columns,
            unique: x.is_unique,
            partial: x.partial,
        });
    }
    conn.close().await.ok();
    schema
}

/// Both folders migrate to the same schema. It needs both engines at once, so it runs when the
/// suite runs on PostgreSQL (SQLite is always at hand).
#[tokio::test]
#[ignore = "PostgreSQL only: runs with OFFSHOOT_TEST_BACKEND=postgres and --include-ignored"]
async fn sqlite_and_postgres_migrations_build_the_same_schema() {
    require_postgres("compares the SQLite schema with a PostgreSQL one");
    let (lite, pg) = (TestDb::on(TestBackend::Sqlite).await, TestDb::on(TestBackend::Postgres).await);
    for db in [&lite, &pg] {
        Store::connect(&db.url).await.expect("connect and migrate").close().await;
    }
    let (sqlite, postgres) = (sqlite_schema(&lite.url).await, postgres_schema(&pg.url).await);
    lite.remove().await;
    pg.remove().await;
    assert!(sqlite.columns.contains_key("message") && sqlite.indexes.len() > 5, "the schema was read: {sqlite:?}");
    assert_eq!(sqlite.columns.keys().collect::<Vec<_>>(), postgres.columns.keys().collect::<Vec<_>>(), "the same tables");
    for (table, columns) in &sqlite.columns {
        assert_eq!(columns, &postgres.columns[table], "the columns of {table}");
    }
    assert_eq!(sqlite.primary_keys, postgres.primary_keys, "the same primary keys");
    assert_eq!(sqlite.indexes, postgres.indexes, "the same indexes");
}
