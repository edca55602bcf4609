//! Uploads: the client-side app settings, the multipart upload of files and images, the signed
//! links (same bytes, ranges, expired and tampered links refused, safe headers), the limits
//! (size, image type by its bytes, the app's allow and block lists), delete, forks sharing a
//! file until the last reference goes, and the S3 backend against a real S3-compatible server.

use crate::helpers::*;
use hmac::{KeyInit, Mac};
use serde_json::json;
use std::time::Duration;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89\0\0\0\rIDATx\x9cc\xf8\x0f\0\x01\x01\x01\0\x18\xdd\x8d\xb4\0\0\0\0IEND\xaeB`\x82";

/// Uploads `bytes` as the form's `file` part (named `name`, of type `mime`) to `kind` (`file` or
/// `image`) of channel `cid`, with an optional `user` part.
#[allow(clippy::too_many_arguments)] // each part of the form, named where the test reads it
async fn upload(c: &Client, cid: &str, token: &str, kind: &str, name: &str, mime: &str, bytes: Vec<u8>, user: Option<&str>) -> Resp {
    let part = reqwest::multipart::Part::bytes(bytes).file_name(name.to_string()).mime_str(mime).expect("a MIME type");
    let mut form = reqwest::multipart::Form::new().part("file", part);
    if let Some(u) = user {
        form = form.text("user", json!({"id": u}).to_string());
    }
    c.send(c.request(reqwest::Method::POST, &format!("{}/{kind}", channel_path(cid)), token).multipart(form)).await
}

/// GET of a link without any header: status, headers, body bytes.
async fn download(url: &str, range: Option<&str>) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
    let mut rb = reqwest::Client::new().get(url);
    if let Some(r) = range {
        rb = rb.header("Range", r);
    }
    let resp = rb.send().await.expect("the server answers");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.expect("a body").to_vec())
}

/// The documented link signature: HMAC-SHA256 with the API secret over `path \n exp`, hex.
fn sign_link(path: &str, exp: i64) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(API_SECRET.as_bytes()).expect("a key");
    mac.update(format!("{path}\n{exp}").as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// `(origin, path)` of a link.
fn split_link(url: &str) -> (String, String) {
    let at = url.find("/uploads/").unwrap_or_else(|| panic!("not an upload link: {url}"));
    let path = url[at..].split('?').next().unwrap().to_string();
    (url[..at].to_string(), path)
}

fn upload_id(url: &str) -> String {
    split_link(url).1.trim_start_matches("/uploads/").split('/').next().unwrap().to_string()
}

/// Waits until `url` answers `status` (bounded).
async fn wait_status(url: &str, status: u16, what: &str) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (s, _, _) = download(url, None).await;
        if s == status {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {url} still answers {s}, not {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn setup(app: &TestApp, cid: &str) {
    app.users(&["u1", "u2", "outsider"]).await;
    app.channel(cid, "u1", &["u1", "u2"]).await;
}

#[tokio::test]
async fn a_client_reads_the_upload_settings_from_get_app_but_no_server_only_field_in_both_dialects() {
    let app = TestApp::spawn().await;
    app.users(&["u1"]).await;
    let server = app.server();
    app.patch(
        "/app",
        &server,
        json!({"webhook_url": "https://hooks.example/x", "image_upload_config": {"blocked_file_extensions": ["GIF"]}, "sqs_secret": "hush"}),
    )
    .await
    .ok();
    for path in ["/app", "/api/v2/app"] {
        let full = app.get(path, &server).await.ok();
        assert_eq!(full["app"]["webhook_url"], json!("https://hooks.example/x"), "server-side keeps the full answer: {full}");
        let client = app.get(path, &app.user("u1")).await.ok();
        let a = &client["app"];
        assert_eq!(a["image_upload_config"]["blocked_file_extensions"], json!([".gif"]), "{client}");
        assert_eq!(a["file_upload_config"]["size_limit"], json!(100 * 1024 * 1024), "{client}");
        assert_eq!(a["fork_enabled"], json!(true), "{client}");
        let text = a.to_string();
        for hidden in ["webhook_url", "event_hooks", "sqs_secret", "hush", "hooks.example", "sqs_key", "api_secret", "disable_auth_checks"]
        {
            assert!(!text.contains(hidden), "{hidden} must not reach a client: {client}");
        }
    }
    app.patch("/app", &server, json!({"file_upload_config": {"no_such_key": 1}})).await.err(400, 4);
}

#[tokio::test]
async fn an_uploaded_file_downloads_the_same_bytes_by_its_link_with_ranges_and_safe_headers_and_bad_links_are_refused() {
    let app = TestApp::spawn().await;
    let cid = "messaging:up1";
    setup(&app, cid).await;
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let r = upload(&app, cid, &app.user("u2"), "file", "report 2024.pdf", "application/pdf", data.clone(), None).await.ok();
    let url = r["file"].as_str().expect("file URL").to_string();
    assert!(r.get("thumb_url").is_none(), "a file has no thumbnail: {r}");
    let (status, h, body) = download(&url, None).await;
    assert_eq!(status, 200);
    assert_eq!(body, data, "the link downloads the same bytes");
    assert_eq!(h["content-type"], "application/pdf");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert!(h["content-disposition"].to_str().unwrap().contains("report_2024.pdf"), "{:?}", h["content-disposition"]);
    let (status, h, body) = download(&url, Some("bytes=1000-1999")).await;
    assert_eq!(status, 206);
    assert_eq!(body, data[1000..2000]);
    assert_eq!(h["content-range"], "bytes 1000-1999/300000");
    let (status, _, body) = download(&url, Some("bytes=-10")).await;
    assert_eq!((status, body), (206, data[data.len() - 10..].to_vec()));

    // Expired (correctly signed) and tampered links: 403, no data.
    let (origin, path) = split_link(&url);
    let past = unix_secs() - 60;
    let expired = format!("{origin}{path}?exp={past}&sig={}", sign_link(&path, past));
    let (status, _, body) = download(&expired, None).await;
    assert_eq!(status, 403);
    assert!(!body.windows(16).any(|w| w == &data[..16]), "no data in a refusal");
    let far = unix_secs() + 3600;
    let good = format!("{origin}{path}?exp={far}&sig={}", sign_link(&path, far));
    assert_eq!(download(&good, None).await.0, 200, "a link signed as documented works");
    let mut sig = sign_link(&path, far);
    sig.replace_range(0..1, if sig.starts_with('0') { "1" } else { "0" });
    assert_eq!(download(&format!("{origin}{path}?exp={far}&sig={sig}"), None).await.0, 403, "a changed signature");
    assert_eq!(download(&format!("{origin}{path}?exp={}&sig={}", far + 1, sign_link(&path, far)), None).await.0, 403, "a changed expiry");
    assert_eq!(download(&format!("{origin}{path}"), None).await.0, 403, "no signature");

    // The v2 path answers the same shape.
    let v2 =
        app.send(app.request(reqwest::Method::POST, "/api/v2/chat/channels/messaging/up1/file", &app.user("u1")).multipart(
            reqwest::multipart::Form::new().part("file", reqwest::multipart::Part::bytes(b"hello".to_vec()).file_name("a.txt")),
        ))
        .await
        .ok();
    let (status, h, body) = download(v2["file"].as_str().unwrap(), None).await;
    assert_eq!((status, body), (200, b"hello".to_vec()));
    assert_eq!(h["content-type"], "text/plain", "a part without a type is typed by its extension");
}

#[tokio::test]
async fn images_are_known_by_their_bytes_svg_is_served_as_an_attachment_and_the_app_lists_refuse_types() {
    let app = TestApp::spawn().await;
    let cid = "messaging:img";
    setup(&app, cid).await;
    let u1 = app.user("u1");
    let r = upload(&app, cid, &u1, "image", "pixel.png", "image/png", PNG.to_vec(), None).await.ok();
    let url = r["file"].as_str().unwrap();
    assert_eq!(r["thumb_url"].as_str(), Some(url), "{r}");
    let (status, h, body) = download(url, None).await;
    assert_eq!((status, body.as_slice()), (200, PNG));
    assert_eq!(h["content-type"], "image/png");
    assert!(h["content-disposition"].to_str().unwrap().starts_with("inline"));

    // Named and typed as a PNG, but the bytes are HTML: refused.
    upload(&app, cid, &u1, "image", "evil.png", "image/png", b"<html><script>alert(1)</script>".to_vec(), None).await.err(400, 4);
    // SVG is an image Stream accepts, served as an attachment (no script on our origin).
    let svg = br#"<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>"#.to_vec();
    let r = upload(&app, cid, &u1, "image", "x.svg", "image/svg+xml", svg, None).await.ok();
    let (status, h, _) = download(r["file"].as_str().unwrap(), None).await;
    assert_eq!(status, 200);
    assert_eq!(h["content-type"], "image/svg+xml");
    assert!(h["content-disposition"].to_str().unwrap().starts_with("attachment"), "{:?}", h["content-disposition"]);
    assert!(h["content-security-policy"].to_str().unwrap().contains("sandbox"));

    // The app's lists.
    let server = app.server();
    app.patch(
        "/app",
        &server,
        json!({"file_upload_config": {"allowed_file_extensions": ["pdf", ".txt"], "blocked_mime_types": ["application/x-msdownload"]},
               "image_upload_config": {"blocked_mime_types": ["image/png"]}}),
    )
    .await
    .ok();
    upload(&app, cid, &u1, "file", "tool.exe", "application/octet-stream", b"MZ".to_vec(), None).await.err(400, 4);
    upload(&app, cid, &u1, "file", "tool.txt", "application/x-msdownload", b"MZ".to_vec(), None).await.err(400, 4);
    upload(&app, cid, &u1, "file", "notes.txt", "text/plain", b"ok".to_vec(), None).await.ok();
    // The image's type is its bytes': a PNG named .gif is still a PNG, and PNGs are blocked.
    upload(&app, cid, &u1, "image", "pixel.gif", "image/gif", PNG.to_vec(), None).await.err(400, 4);
}

#[tokio::test]
async fn only_members_who_may_write_upload_server_side_uploads_for_a_user_and_the_uploader_deletes() {
    let app = TestApp::spawn().await;
    let cid = "messaging:perm";
    setup(&app, cid).await;
    upload(&app, cid, &app.user("outsider"), "file", "a.txt", "text/plain", b"x".to_vec(), None).await.err(403, 17);
    upload(&app, "messaging:nope", &app.user("u1"), "file", "a.txt", "text/plain", b"x".to_vec(), None).await.err(404, 16);
    let bare = app.request(reqwest::Method::POST, &format!("{}/file", channel_path(cid)), &app.user("u1")).body("not a form");
    app.send(bare).await.err(400, 4);
    let no_file = reqwest::multipart::Form::new().text("user", "u1");
    app.send(app.request(reqwest::Method::POST, &format!("{}/file", channel_path(cid)), &app.user("u1")).multipart(no_file))
        .await
        .err(400, 4);

    let r = upload(&app, cid, &app.server(), "file", "s.txt", "text/plain", b"server".to_vec(), Some("u2")).await.ok();
    let url = r["file"].as_str().unwrap().to_string();
    let del = |token: String, url: String| {
        let app = &app;
        async move { app.delete(&format!("{}/file?url={}", channel_path(cid), urlencode(&url)), &token).await }
    };
    del(app.user("u1"), url.clone()).await.err(403, 17);
    del(app.user("u2"), url.clone()).await.ok();
    assert_eq!(download(&url, None).await.0, 404, "a deleted file is gone");
    del(app.user("u2"), url.clone()).await.err(404, 16);
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Peak resident memory of a process, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).expect("VmHWM")
}

#[tokio::test]
async fn a_101_mb_upload_is_refused_with_413_and_the_server_never_holds_it_in_memory() {
    let db = TestDb::create().await;
    let dir = std::env::temp_dir().join(format!("offshoot-e2e-big-{}", uuid::Uuid::new_v4().simple()));
    let storage = format!("file://{}", dir.display());
    let server = ServerProcess::start(&db, &[("OFFSHOOT_STORAGE", &storage)]).await;
    let cid = "messaging:big";
    server.users(&["u1"]).await;
    server.channel(cid, "u1", &["u1"]).await;
    // Warm the server's paths once so the peak below is the upload's alone.
    upload(&server, cid, &server.user("u1"), "file", "small.bin", "application/octet-stream", vec![1; 1024], None).await.ok();
    let before = peak_rss_kib(server.pid());

    // 101 MB, generated as it is sent: the client does not hold it either.
    const MB: usize = 1024 * 1024;
    let chunks = futures_util::stream::iter((0..101).map(|i| Ok::<Vec<u8>, std::io::Error>(vec![(i % 251) as u8; MB])));
    let part = reqwest::multipart::Part::stream_with_length(reqwest::Body::wrap_stream(chunks), 101 * MB as u64).file_name("big.bin");
    let form = reqwest::multipart::Form::new().part("file", part);
    let r = server
        .send(server.request(reqwest::Method::POST, &format!("{}/file", channel_path(cid)), &server.user("u1")).multipart(form))
        .await;
    r.err(413, 22);
    let after = peak_rss_kib(server.pid());
    assert!(after < before + 40 * 1024, "the peak memory grew by {} KiB for a 101 MB upload: it was held, not streamed", after - before);
    let left: u64 = walk_sizes(&dir);
    assert!(left < 2 * 1024, "nothing of the refused upload is kept in storage ({left} bytes)");
    let _ = std::fs::remove_dir_all(dir);
}

fn walk_sizes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().map(|e| if e.path().is_dir() { walk_sizes(&e.path()) } else { e.metadata().map(|m| m.len()).unwrap_or(0) }).sum()
}

/// Sends a message of `user` with `url` as a file attachment; returns its id.
async fn attach(app: &TestApp, cid: &str, user: &str, url: &str) -> String {
    let m = app
        .send_message(
            cid,
            json!({"user_id": user, "text": "see attached", "attachments": [{"type": "file", "asset_url": url, "title": "doc"}]}),
        )
        .await;
    m["id"].as_str().expect("a message id").to_string()
}

#[tokio::test]
async fn a_fork_shares_the_file_the_source_hard_deleted_keeps_it_and_the_last_reference_frees_it() {
    let app = TestApp::spawn().await;
    let src = "agent:files-src";
    app.users(&["u1"]).await;
    app.channel(src, "u1", &["u1"]).await;
    let shared = upload(&app, src, &app.user("u1"), "file", "shared.txt", "text/plain", b"shared bytes".to_vec(), None).await.ok();
    let shared = shared["file"].as_str().unwrap().to_string();
    let control = upload(&app, src, &app.user("u1"), "file", "control.txt", "text/plain", b"control".to_vec(), None).await.ok();
    let control = control["file"].as_str().unwrap().to_string();
    let point = attach(&app, src, "u1", &shared).await;
    // After the fork point: not copied, so only the source refers to it.
    let _ = attach(&app, src, "u1", &control).await;
    let fork = "agent:files-fork";
    app.fork(src, &point, "files-fork").await.ok();
    app.wait_fork_finished(fork).await;

    // The copy carries a link to the same file (no byte copied), signed afresh when read.
    let copy = app.get(&format!("/messages/{}", copy_id(fork, &point)), &app.server()).await.ok();
    let copy_url = copy["message"]["attachments"][0]["asset_url"].as_str().expect("the copy keeps its attachment").to_string();
    assert_eq!(upload_id(&copy_url), upload_id(&shared), "the copy refers to the source's file");
    assert_eq!(download(&copy_url, None).await.2, b"shared bytes");
    // A fork without attachments has none.
    let bare = app.fork_with(src, json!({"message_id": point, "channel": {"id": "files-bare"}, "exclude_attachments": true})).await.ok();
    let _ = bare;
    app.wait_fork_finished("agent:files-bare").await;
    let bare_copy = app.get(&format!("/messages/{}", copy_id("agent:files-bare", &point)), &app.server()).await.ok();
    assert_eq!(bare_copy["message"]["attachments"], json!([]), "{bare_copy}");

    // Hard delete of the source: the control file (only the source referred to it) is freed;
    // the shared one is kept while the fork refers to it.
    app.delete(&format!("{}?hard_delete=true", channel_path(src)), &app.server()).await.ok();
    wait_status(&control, 404, "the control file, referred to by the source only, is freed").await;
    let (status, _, body) = download(&copy_url, None).await;
    assert_eq!((status, body.as_slice()), (200, &b"shared bytes"[..]), "the fork still shows the file");

    // The last reference gone frees it.
    app.delete(&format!("{}?hard_delete=true", channel_path(fork)), &app.server()).await.ok();
    wait_status(&copy_url, 404, "the file, its last reference gone, is freed").await;
}

#[tokio::test]
async fn hard_truncate_and_hard_message_delete_free_files_and_a_file_never_attached_is_kept() {
    let app = TestApp::spawn().await;
    let cid = "messaging:trunc";
    setup(&app, cid).await;
    let u1 = app.user("u1");
    let a = upload(&app, cid, &u1, "file", "a.txt", "text/plain", b"a".to_vec(), None).await.ok()["file"].as_str().unwrap().to_string();
    let b = upload(&app, cid, &u1, "file", "b.txt", "text/plain", b"b".to_vec(), None).await.ok()["file"].as_str().unwrap().to_string();
    let loose = upload(&app, cid, &u1, "file", "c.txt", "text/plain", b"c".to_vec(), None).await.ok()["file"].as_str().unwrap().to_string();
    let ma = attach(&app, cid, "u1", &a).await;
    let _mb = attach(&app, cid, "u1", &b).await;
    // An edit keeps the file referred to (and a stored link is re-signed on read).
    let edited = app.get(&format!("/messages/{ma}"), &app.server()).await.ok();
    assert_eq!(download(edited["message"]["attachments"][0]["asset_url"].as_str().unwrap(), None).await.2, b"a");
    app.delete(&format!("/messages/{ma}?hard=true"), &app.server()).await.ok();
    wait_status(&a, 404, "a hard-deleted message's file is freed").await;
    app.post(&format!("{}/truncate", channel_path(cid)), &app.server(), json!({"hard_delete": true})).await.ok();
    wait_status(&b, 404, "a hard truncate frees its messages' files").await;
    assert_eq!(download(&loose, None).await.0, 200, "a file no message ever referred to is kept, as on Stream");
}

#[tokio::test]
async fn concurrent_sends_referring_to_a_file_and_the_deletion_of_its_last_reference_never_free_a_file_in_use() {
    let app = TestApp::spawn().await;
    let cid = "messaging:race";
    setup(&app, cid).await;
    for round in 0..8 {
        let url = upload(&app, cid, &app.user("u1"), "file", "r.txt", "text/plain", format!("round {round}").into_bytes(), None).await.ok()
            ["file"]
            .as_str()
            .unwrap()
            .to_string();
        let first = attach(&app, cid, "u1", &url).await;
        // The first reference goes while new messages refer to the file, all at once; each
        // hard delete queues a files job that races the sends.
        let (del_path, server) = (format!("/messages/{first}?hard=true"), app.server());
        let del = app.delete(&del_path, &server);
        let sends = futures_util::future::join_all((0..6).map(|_| attach(&app, cid, "u2", &url)));
        let (d, ids) = tokio::join!(del, sends);
        d.ok();
        // Another files job after everything committed: it must keep the file.
        let probe = upload(&app, cid, &app.user("u1"), "file", "p.txt", "text/plain", b"p".to_vec(), None).await.ok()["file"]
            .as_str()
            .unwrap()
            .to_string();
        let pm = attach(&app, cid, "u1", &probe).await;
        app.delete(&format!("/messages/{pm}?hard=true"), &app.server()).await.ok();
        wait_status(&probe, 404, "the files job ran").await;
        let (status, _, body) = download(&url, None).await;
        assert_eq!((status, body), (200, format!("round {round}").into_bytes()), "round {round}: {} messages refer to the file", ids.len());
    }
}

/// A real S3-compatible server (`s3s-fs`, a directory behind the S3 protocol) on 127.0.0.1:0.
async fn s3_server(root: &std::path::Path, bucket: &str) -> (String, tokio::task::JoinHandle<()>) {
    std::fs::create_dir_all(root.join(bucket)).expect("the bucket's directory");
    let fs = s3s_fs::FileSystem::new(root).expect("s3s-fs");
    let mut b = s3s::service::S3ServiceBuilder::new(fs);
    b.set_auth(s3s::auth::SimpleAuth::from_single("offshoot-test", "offshoot-test-secret"));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let service = service.clone();
            tokio::spawn(async move {
                let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                let _ = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
            });
        }
    });
    (format!("http://{addr}"), task)
}

#[tokio::test]
async fn the_s3_backend_stores_serves_ranges_and_deletes_against_a_real_s3_server() {
    let root = std::env::temp_dir().join(format!("offshoot-e2e-s3-{}", uuid::Uuid::new_v4().simple()));
    let (endpoint, task) = s3_server(&root, "uploads").await;
    let storage =
        format!("s3://uploads?endpoint={endpoint}&region=us-east-1&access_key_id=offshoot-test&secret_access_key=offshoot-test-secret");
    let app = TestApp::spawn_with(|c| c.storage = Some(storage)).await;
    let cid = "messaging:s3";
    setup(&app, cid).await;
    // Larger than one part (5 MiB), so the write goes out in several.
    let data: Vec<u8> = (0..12 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect();
    let r = upload(&app, cid, &app.user("u1"), "file", "big.bin", "application/octet-stream", data.clone(), None).await.ok();
    let url = r["file"].as_str().unwrap().to_string();
    let (status, _, body) = download(&url, None).await;
    assert_eq!(status, 200);
    assert!(body == data, "the S3 round trip returns the same bytes");
    let (status, _, body) = download(&url, Some("bytes=6000000-6000099")).await;
    assert_eq!((status, body.as_slice()), (206, &data[6_000_000..6_000_100]));
    let id = upload_id(&url);
    assert!(walk_sizes(&root.join("uploads").join(&id)) >= data.len() as u64, "the object is in the S3 server's bucket");
    app.delete(&format!("{}/file?url={}", channel_path(cid), urlencode(&url)), &app.user("u1")).await.ok();
    assert_eq!(download(&url, None).await.0, 404);
    assert_eq!(walk_sizes(&root.join("uploads").join(&id)), 0, "deleted from the bucket");
    drop(app);
    task.abort();
    let _ = std::fs::remove_dir_all(root);
}
