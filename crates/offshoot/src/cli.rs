//! The command line (clap): `offshoot serve` and the operator's commands beside it:
//! dead-lettered webhook deliveries (list, replay) and job counts. Every command reads the
//! configuration the same way (`--config FILE`, the environment; `serve` adds its flags) and
//! the operator's commands work while a server runs.

use crate::config::{Config, Settings};
use clap::{Args, Parser, Subcommand};
use offshoot_store::Store;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(name = "offshoot", version, about = "A Stream Chat compatible chat backend with channel forks")]
pub struct Cli {
    /// A config file of KEY=value lines (as offshoot.env.example); the environment and the
    /// flags override it.
    #[arg(long, global = true, env = "OFFSHOOT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server (the roles api, ws and worker) until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// Webhook deliveries given up on: list them (the default) or queue them again.
    #[command(args_conflicts_with_subcommands = true)]
    DeadLetters {
        #[command(subcommand)]
        action: Option<DeadLetterAction>,
        #[command(flatten)]
        list: ListArgs,
    },
    /// Jobs per queue and state.
    Jobs,
}

/// Flags of `serve`; each overrides the config file and the environment.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (OFFSHOOT_LISTEN); port 0 picks a free one.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// sqlite://FILE?mode=rwc or postgres://… (DATABASE_URL).
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// Roles this process runs: any of api, ws, worker, or all (OFFSHOOT_ROLES).
    #[arg(long, value_name = "ROLES")]
    pub roles: Option<String>,
}

impl ServeArgs {
    /// The flags as the configuration's top layer.
    pub fn settings(&self) -> Settings {
        Settings { listen: self.listen.clone(), database_url: self.database_url.clone(), roles: self.roles.clone(), ..Settings::default() }
    }
}

#[derive(Debug, Subcommand)]
pub enum DeadLetterAction {
    /// List dead-lettered deliveries, newest first.
    List(ListArgs),
    /// Queue deliveries again for a new retry window (same X-Webhook-Id).
    Replay {
        /// Every dead-lettered delivery.
        #[arg(long, conflicts_with = "ids", required_unless_present = "ids")]
        all: bool,
        /// The deliveries to replay.
        ids: Vec<String>,
    },
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// How many to list.
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
}

async fn open(config: &Config) -> anyhow::Result<offshoot_worker::Queue> {
    let store = Store::connect(&config.database_url).await.map_err(|e| anyhow::anyhow!("opening the database: {e}"))?;
    offshoot_worker::Queue::connect(store, &config.database_url).await.map_err(|e| anyhow::anyhow!("opening the job queue: {e}"))
}

fn rfc3339(ns: i64) -> String {
    offshoot_core::time::to_rfc3339(ns)
}

/// `offshoot dead-letters [list] [--limit N]` and `offshoot dead-letters replay (--all | ID...)`.
pub async fn dead_letters(config: &Config, action: Option<DeadLetterAction>, list: ListArgs) -> anyhow::Result<()> {
    let queue = open(config).await?;
    let result = async {
        match action {
            None | Some(DeadLetterAction::List(_)) => {
                let limit = match action {
                    Some(DeadLetterAction::List(l)) => l.limit,
                    _ => list.limit,
                };
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
            Some(DeadLetterAction::Replay { all, ids }) => {
                let n = if all { queue.replay_dead_letters(None).await } else { queue.replay_dead_letters(Some(&ids)).await }
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                println!("queued {n} dead-lettered deliveries again");
                Ok(())
            }
        }
    }
    .await;
    queue.close().await;
    queue.store.close().await;
    result
}

/// `offshoot jobs`: jobs per queue and state.
pub async fn jobs(config: &Config) -> anyhow::Result<()> {
    let queue = open(config).await?;
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
