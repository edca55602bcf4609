//! The operator's commands besides `serve`: dead-lettered webhook deliveries (list, replay) and
//! job counts. They read `DATABASE_URL` (and `OFFSHOOT_CONFIG`) like `serve` and work while a
//! server runs.

use anyhow::Context;
use offshoot_store::Store;

async fn open() -> anyhow::Result<offshoot_worker::Queue> {
    let file = std::env::var("OFFSHOOT_CONFIG").ok();
    let config = crate::Config::load(file.as_deref().map(std::path::Path::new))?;
    let store = Store::connect(&config.database_url).await.map_err(|e| anyhow::anyhow!("opening the database: {e}"))?;
    offshoot_worker::Queue::connect(store, &config.database_url).await.map_err(|e| anyhow::anyhow!("opening the job queue: {e}"))
}

fn rfc3339(ns: i64) -> String {
    offshoot_core::time::to_rfc3339(ns)
}

/// `offshoot dead-letters [list] [--limit N]` and `offshoot dead-letters replay (--all | ID...)`.
pub async fn dead_letters(args: Vec<String>) -> anyhow::Result<()> {
    let queue = open().await?;
    let result = async {
        match args.first().map(String::as_str) {
            None | Some("list") | Some("--limit") => {
                let mut limit = 100;
                if let Some(i) = args.iter().position(|a| a == "--limit") {
                    limit = args.get(i + 1).context("--limit needs a number")?.parse().context("--limit needs a number")?;
                }
                let letters = queue.dead_letters(limit, 0).await.map_err(|e| anyhow::anyhow!("{e}"))?;
                if letters.is_empty() {
                    println!("no dead-lettered webhook deliveries");
                }
                for l in letters {
                    println!(
                        "{}  {}  seq={}  {}  attempts={}  first_attempt={}  dead_since={}  last_error={:?}",
                        l.id,
                        l.event_type,
                        l.event_seq,
                        l.url,
                        l.attempts,
                        rfc3339(l.first_attempt_at),
                        rfc3339(l.created_at),
                        l.last_error
                    );
                }
                Ok(())
            }
            Some("replay") => {
                let rest = &args[1..];
                let n = if rest == ["--all"] {
                    queue.replay_dead_letters(None).await
                } else if !rest.is_empty() && rest.iter().all(|a| !a.starts_with('-')) {
                    queue.replay_dead_letters(Some(rest)).await
                } else {
                    anyhow::bail!("usage: offshoot dead-letters replay (--all | ID...)")
                }
                .map_err(|e| anyhow::anyhow!("{e}"))?;
                println!("queued {n} dead-lettered deliveries again");
                Ok(())
            }
            Some(other) => anyhow::bail!("unknown dead-letters command {other:?}: use list or replay"),
        }
    }
    .await;
    queue.close().await;
    queue.store.close().await;
    result
}

/// `offshoot jobs`: jobs per queue and state.
pub async fn jobs() -> anyhow::Result<()> {
    let queue = open().await?;
    let counts = queue.counts().await.map_err(|e| anyhow::anyhow!("{e}"));
    queue.close().await;
    queue.store.close().await;
    for c in counts? {
        println!(
            "{}: queued={} running={} retrying={} failed={} dead_lettered={}",
            c.queue, c.queued, c.running, c.retrying, c.failed, c.dead_lettered
        );
    }
    Ok(())
}
