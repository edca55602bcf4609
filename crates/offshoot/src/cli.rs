//! The command line (clap): `offshoot serve`, the operator's commands beside it (dead-lettered
//! webhook deliveries, job counts: they open the database), and the client commands (`fork`,
//! `tree`, `task`, `lookup`, `token`, `console`: they talk to a running server over HTTP,
//! `client.rs`). Every command reads the configuration the same way (`--config FILE`, the
//! environment; `serve` adds its flags) and the operator's commands work while a server runs.

use crate::config::{Config, Settings};
use clap::{Args, Parser, Subcommand};
use offshoot_store::Store;
use std::path::PathBuf;

/// The exit codes of the client commands, for `--help`.
pub const EXIT_CODES: &str = "Exit codes of the client commands (fork, tree, task, lookup, token, console):\n  \
    0  done\n  \
    1  the server refused (its Stream error message and code are printed), or a fork ended failed\n  \
    2  usage: bad arguments, or no API key and secret configured\n  \
    3  the server cannot be reached";

#[derive(Debug, Parser)]
#[command(
    name = "offshoot",
    version,
    about = "A Stream Chat compatible chat backend with channel forks",
    after_help = EXIT_CODES
)]
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
    /// Fork a channel at a message; with --wait (the default on a terminal) follow the backfill
    /// with a progress bar until the fork is complete.
    #[command(after_help = EXIT_CODES)]
    Fork(ForkArgs),
    /// Draw the fork tree a channel belongs to: its root, every fork, forks of forks.
    #[command(after_help = EXIT_CODES)]
    Tree(TreeArgs),
    /// A fork's backfill task: status and copied/total; --watch follows it to the end.
    #[command(after_help = EXIT_CODES)]
    Task(TaskArgs),
    /// The copy ids of source messages in a fork.
    #[command(after_help = EXIT_CODES)]
    Lookup(LookupArgs),
    /// Mint a token signed with the app's secret (server-side without --user), for curl and SDK
    /// scripts.
    #[command(after_help = EXIT_CODES)]
    Token(TokenArgs),
    /// Print a link to the web console carrying a short-lived server-side token in its fragment.
    #[command(after_help = EXIT_CODES)]
    Console(ConsoleArgs),
    /// Print a shell completion script: `offshoot completions bash > /etc/bash_completion.d/offshoot`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Where the server is, and how to print: every client command takes these.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// The server's base URL (default: http:// and the configured listen address).
    #[arg(long, env = "OFFSHOOT_URL", value_name = "URL")]
    pub url: Option<String>,
    /// One JSON document on stdout, nothing else there (errors still go to stderr).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The source channel, TYPE:ID.
    #[arg(value_name = "TYPE:ID")]
    pub source: String,
    /// The message to fork at (it and everything before it are copied).
    #[arg(long, value_name = "MESSAGE_ID")]
    pub at: String,
    /// The new channel's id (default: the source's id and a random suffix).
    #[arg(long, value_name = "NEW_ID")]
    pub to: Option<String>,
    /// A member of the fork (repeat; default: the source's members).
    #[arg(long = "member", value_name = "USER_ID")]
    pub members: Vec<String>,
    /// Leave attachments out of the copies.
    #[arg(long)]
    pub exclude_attachments: bool,
    /// A custom key of the source channel the fork keeps (repeat).
    #[arg(long, value_name = "KEY")]
    pub inherit: Vec<String>,
    /// Follow the backfill to its end (the default on a terminal).
    #[arg(long, conflicts_with = "no_wait")]
    pub wait: bool,
    /// Print the summary at once and leave the backfill running.
    #[arg(long)]
    pub no_wait: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl ForkArgs {
    /// Whether to follow the backfill: the flags, else `terminal`.
    pub fn wait_or(&self, terminal: bool) -> bool {
        self.wait || (!self.no_wait && terminal)
    }
}

#[derive(Debug, Args)]
pub struct TreeArgs {
    /// Any channel of the tree, TYPE:ID.
    #[arg(value_name = "TYPE:ID")]
    pub cid: String,
    /// Draw at most this many channels (1..5000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=5000))]
    pub max_nodes: i64,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct TaskArgs {
    pub task_id: String,
    /// Follow the task with a progress bar until it completes or fails.
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct LookupArgs {
    /// The fork, TYPE:ID.
    #[arg(value_name = "FORK")]
    pub fork: String,
    /// Source message ids.
    #[arg(value_name = "SOURCE_ID", required = true)]
    pub source_ids: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The user the token is for; without it the token is server-side.
    #[arg(long, value_name = "USER_ID")]
    pub user: Option<String>,
    /// Lifetime: 90s, 30m, 1h, 2d.
    #[arg(long, default_value = "1h")]
    pub ttl: String,
    /// `{"token", "user_id", "expires_at"}` on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ConsoleArgs {
    /// Lifetime of the console's token: 90s, 30m, 1h, 2d.
    #[arg(long, default_value = "1h")]
    pub ttl: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `offshoot completions SHELL`: the script on stdout.
pub fn completions(shell: clap_complete::Shell) {
    use clap::CommandFactory;
    clap_complete::generate(shell, &mut Cli::command(), "offshoot", &mut std::io::stdout());
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
