//! File storage for uploads: one small handle, [`Files`], over two real backends chosen by one
//! setting (`OFFSHOOT_STORAGE`): a local directory (`file://./offshoot-files`, the embedded
//! default) and S3-compatible object storage (`s3://bucket?endpoint=…`), both through the
//! `object_store` crate's `ObjectStore` trait. Bodies are streamed in both directions (never
//! held whole in memory): writes go out in parts as they arrive, reads come back as a stream of
//! chunks, ranged when asked. Also here: the signed links to stored files ([`Signer`]) and the
//! check of an image's type by its first bytes ([`sniff_image`]).
//!
//! Depends on object_store, hmac/sha2 and tokio only; must not depend on the store, the API or
//! any other Offshoot crate.

mod sign;
mod sniff;

pub use sign::{Signer, SIGNATURE_PARAM};
pub use sniff::{sniff_image, IMAGE_MIME_TYPES};

use bytes::Bytes;
use futures_util::stream::{BoxStream, Stream, StreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, WriteMultipart};
use std::ops::Range;
use std::sync::Arc;

/// The size of each part a streamed write sends (S3's smallest part but the last is 5 MiB);
/// at most [`PARTS_IN_FLIGHT`] of them are held at once, so a write holds at most about
/// 10 MiB whatever the file's size.
pub const PART_BYTES: usize = 5 * 1024 * 1024;
/// Parts of one write sent at once.
pub const PARTS_IN_FLIGHT: usize = 2;

#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The storage setting cannot be used.
    #[error("storage setting: {0}")]
    Setting(String),
    /// No file under this key.
    #[error("no stored file {0:?}")]
    NotFound(String),
    /// The body went over the size limit; nothing was kept.
    #[error("the file is larger than {limit} bytes")]
    TooLarge { limit: u64 },
    /// The requested range is outside the file.
    #[error("range not satisfiable (size {size})")]
    BadRange { size: u64 },
    /// Reading the request body failed; nothing was kept.
    #[error("reading the upload: {0}")]
    Body(String),
    #[error("storage: {0}")]
    Storage(#[from] object_store::Error),
}

pub type Result<T, E = FilesError> = std::result::Result<T, E>;

/// A stored file being read: its total size, the byte range the stream carries, the stream.
pub struct Blob {
    pub size: u64,
    pub range: Range<u64>,
    pub stream: BoxStream<'static, Result<Bytes>>,
}

/// The file storage. Cheap to clone.
#[derive(Clone)]
pub struct Files {
    inner: Arc<dyn ObjectStore>,
    /// The setting it was opened from, with any credentials left out (for logs).
    describe: Arc<str>,
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Files").field("storage", &self.describe).finish()
    }
}

impl Files {
    /// Opens the storage a setting names: `file://DIR` (created if missing; relative to the
    /// working directory) or `s3://BUCKET?endpoint=URL&region=R&access_key_id=K&secret_access_key=S`
    /// (each parameter optional: the `AWS_*` environment fills what is missing; an `http://`
    /// endpoint is allowed, for a server on a private network).
    pub fn open(setting: &str) -> Result<Files> {
        if let Some(dir) = setting.strip_prefix("file://") {
            return Files::local(std::path::Path::new(dir));
        }
        let url = url::Url::parse(setting).map_err(|e| FilesError::Setting(format!("{setting:?} is not a URL: {e}")))?;
        if url.scheme() != "s3" {
            return Err(FilesError::Setting(format!("{setting:?}: use file://DIR or s3://BUCKET?endpoint=…")));
        }
        let bucket = url.host_str().filter(|b| !b.is_empty()).ok_or_else(|| FilesError::Setting("s3:// needs a bucket".into()))?;
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
        let mut region_set = false;
        for (k, v) in url.query_pairs() {
            b = match k.as_ref() {
                "endpoint" => {
                    if v.starts_with("http://") {
                        b = b.with_allow_http(true);
                    }
                    b.with_endpoint(v.as_ref()).with_virtual_hosted_style_request(false)
                }
                "region" => {
                    region_set = true;
                    b.with_region(v.as_ref())
                }
                "access_key_id" => b.with_access_key_id(v.as_ref()),
                "secret_access_key" => b.with_secret_access_key(v.as_ref()),
                other => return Err(FilesError::Setting(format!("unknown s3:// parameter {other:?}"))),
            };
        }
        if !region_set && std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
            b = b.with_region("us-east-1");
        }
        let store = b.build()?;
        let describe = format!("s3://{bucket}");
        Ok(Files { inner: Arc::new(store), describe: describe.into() })
    }

    /// A local directory (created if missing).
    pub fn local(dir: &std::path::Path) -> Result<Files> {
        std::fs::create_dir_all(dir).map_err(|e| FilesError::Setting(format!("creating {}: {e}", dir.display())))?;
        let store = LocalFileSystem::new_with_prefix(dir)?;
        Ok(Files { inner: Arc::new(store), describe: format!("file://{}", dir.display()).into() })
    }

    /// Where the files are (no credentials).
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// Streams `body` to `key`, part by part; returns the bytes written. A body over `limit`
    /// bytes, or one that fails to arrive, is aborted and leaves nothing stored.
    pub async fn put_stream<S, E>(&self, key: &str, body: S, limit: u64) -> Result<u64>
    where
        S: Stream<Item = Result<Bytes, E>> + Send,
        E: std::fmt::Display,
    {
        let path = ObjectPath::from(key);
        let upload = self.inner.put_multipart(&path).await?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        let mut body = std::pin::pin!(body);
        let mut total: u64 = 0;
        let failure = loop {
            match body.next().await {
                None => break None,
                Some(Err(e)) => break Some(FilesError::Body(e.to_string())),
                Some(Ok(chunk)) => {
                    total += chunk.len() as u64;
                    if total > limit {
                        break Some(FilesError::TooLarge { limit });
                    }
                    if let Err(e) = w.wait_for_capacity(PARTS_IN_FLIGHT).await {
                        break Some(e.into());
                    }
                    w.put(chunk);
                }
            }
        };
        match failure {
            None => {
                w.finish().await?;
                Ok(total)
            }
            Some(e) => {
                if let Err(abort) = w.abort().await {
                    tracing::warn!(key, error = %abort, "aborting a refused upload failed");
                }
                Err(e)
            }
        }
    }

    /// The size of the file under `key`.
    pub async fn size(&self, key: &str) -> Result<u64> {
        match self.inner.head(&ObjectPath::from(key)).await {
            Ok(meta) => Ok(meta.size),
            Err(object_store::Error::NotFound { .. }) => Err(FilesError::NotFound(key.into())),
            Err(e) => Err(e.into()),
        }
    }

    /// Reads `key`, all of it or `range` (an HTTP `Range` header's single range, already
    /// parsed by [`parse_range`]).
    pub async fn get(&self, key: &str, range: Option<ByteRange>) -> Result<Blob> {
        let size = self.size(key).await?;
        let wanted = match range {
            None => 0..size,
            Some(r) => r.resolve(size).ok_or(FilesError::BadRange { size })?,
        };
        if wanted.is_empty() {
            return Ok(Blob { size, range: wanted, stream: futures_util::stream::empty().boxed() });
        }
        let opts = GetOptions { range: Some(GetRange::Bounded(wanted.clone())), ..Default::default() };
        let got = match self.inner.get_opts(&ObjectPath::from(key), opts).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Err(FilesError::NotFound(key.into())),
            Err(e) => return Err(e.into()),
        };
        let stream = got.into_stream().map(|r| r.map_err(FilesError::from)).boxed();
        Ok(Blob { size, range: wanted, stream })
    }

    /// Removes `key`; a key already gone is not an error.
    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.inner.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// One range of an HTTP `Range` header, before the file's size is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `bytes=a-b` (inclusive) or `bytes=a-`.
    From { start: u64, end: Option<u64> },
    /// `bytes=-n`: the last n bytes.
    Suffix(u64),
}

impl ByteRange {
    /// The half-open range within a file of `size` bytes, or `None` when unsatisfiable.
    pub fn resolve(self, size: u64) -> Option<Range<u64>> {
        match self {
            ByteRange::From { start, end } => {
                if start >= size {
                    return None;
                }
                let end = end.map_or(size, |e| e.saturating_add(1).min(size));
                (end > start).then_some(start..end)
            }
            ByteRange::Suffix(0) => None,
            ByteRange::Suffix(n) => Some(size.saturating_sub(n)..size),
        }
    }
}

/// Parses a `Range` header. Only a single `bytes` range is served; anything else (several
/// ranges, other units, garbage) is `None`, and the whole file is answered, as RFC 9110 allows.
pub fn parse_range(header: &str) -> Option<ByteRange> {
    let spec = header.trim().strip_prefix("bytes=")?;
    if spec.contains(',') {
        return None;
    }
    let (a, b) = spec.split_once('-')?;
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return b.parse().ok().map(ByteRange::Suffix);
    }
    let start = a.parse().ok()?;
    let end = if b.is_empty() { None } else { Some(b.parse().ok()?) };
    if end.is_some_and(|e| e < start) {
        return None;
    }
    Some(ByteRange::From { start, end })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_resolve_as_rfc_9110_says() {
        assert_eq!(parse_range("bytes=0-9"), Some(ByteRange::From { start: 0, end: Some(9) }));
        assert_eq!(parse_range("bytes=5-"), Some(ByteRange::From { start: 5, end: None }));
        assert_eq!(parse_range("bytes=-3"), Some(ByteRange::Suffix(3)));
        assert_eq!(parse_range("bytes=0-1,4-5"), None);
        assert_eq!(parse_range("items=0-1"), None);
        assert_eq!(parse_range("bytes=9-2"), None);
        assert_eq!(ByteRange::From { start: 0, end: Some(9) }.resolve(5), Some(0..5));
        assert_eq!(ByteRange::From { start: 5, end: None }.resolve(5), None);
        assert_eq!(ByteRange::Suffix(3).resolve(10), Some(7..10));
        assert_eq!(ByteRange::Suffix(30).resolve(10), Some(0..10));
    }

    #[tokio::test]
    async fn a_local_directory_stores_streams_ranges_refuses_oversize_and_deletes() {
        let dir = std::env::temp_dir().join(format!("offshoot-files-unit-{}", std::process::id()));
        let files = Files::open(&format!("file://{}", dir.display())).expect("open");
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let chunks: Vec<Result<Bytes, std::io::Error>> = data.chunks(7_000).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let n = files.put_stream("a/b.bin", futures_util::stream::iter(chunks), 1 << 20).await.expect("put");
        assert_eq!(n, data.len() as u64);
        let all = collect(files.get("a/b.bin", None).await.expect("get")).await;
        assert_eq!(all, data);
        let part = files.get("a/b.bin", parse_range("bytes=100-199")).await.expect("range");
        assert_eq!(part.range, 100..200);
        assert_eq!(collect(part).await, data[100..200]);

        let big: Vec<Result<Bytes, std::io::Error>> = data.chunks(7_000).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        let err = files.put_stream("a/too-big.bin", futures_util::stream::iter(big), 10_000).await.unwrap_err();
        assert!(matches!(err, FilesError::TooLarge { limit: 10_000 }), "{err}");
        assert!(matches!(files.size("a/too-big.bin").await, Err(FilesError::NotFound(_))), "nothing of a refused upload is kept");

        files.delete("a/b.bin").await.expect("delete");
        files.delete("a/b.bin").await.expect("a second delete is not an error");
        assert!(matches!(files.get("a/b.bin", None).await, Err(FilesError::NotFound(_))));
        let _ = std::fs::remove_dir_all(dir);
    }

    async fn collect(blob: Blob) -> Vec<u8> {
        let mut out = Vec::new();
        let mut s = blob.stream;
        while let Some(chunk) = s.next().await {
            out.extend_from_slice(&chunk.expect("chunk"));
        }
        out
    }
}
