//! `offshoot`: parses the command line, reads the configuration, sets up tracing and runs the
//! command; `serve` runs the server until SIGINT or SIGTERM.

use anyhow::Context;
use clap::Parser;
use offshoot::cli::{Cli, Command};
use offshoot::client::ClientCommand;
use offshoot::Config;
use tokio_util::sync::CancellationToken;

/// mimalloc, not the system allocator: a request allocates and frees many small buffers across
/// threads, and glibc's malloc took a fifth of the server's time under load
/// (docs/performance.md, "Memory: connections, allocator and huge pages").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Log lines on stdout: text, or one JSON object per line (`OFFSHOOT_LOG_FORMAT=json`) with
/// the fields of every enclosing span, so each line of a request carries its `request_id`.
fn init_tracing(format: offshoot::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,sqlx=warn".into());
    // Colour only for a person at a terminal: a file or a pipe gets plain lines, and NO_COLOR
    // (any non-empty value, no-color.org) turns colour off everywhere.
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let ansi = !no_color && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi);
    match format {
        offshoot::LogFormat::Text => builder.init(),
        offshoot::LogFormat::Json => builder.json().with_current_span(false).with_span_list(true).init(),
    }
}

/// Ends the process with a client command's exit code (0, 1, 2 or 3; see `offshoot --help`).
fn exit(code: u8) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(i32::from(code))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let file = cli.config.as_deref();
    let serve = match cli.command {
        Command::Serve(args) => args,
        Command::DeadLetters { action, list } => {
            return offshoot::cli::dead_letters(&Config::load(file, Default::default())?, action, list).await
        }
        Command::Jobs => return offshoot::cli::jobs(&Config::load(file, Default::default())?).await,
        Command::Completions { shell } => {
            offshoot::cli::completions(shell);
            return Ok(());
        }
        Command::Fork(a) => exit(offshoot::client::run(file, ClientCommand::Fork(a)).await),
        Command::Tree(a) => exit(offshoot::client::run(file, ClientCommand::Tree(a)).await),
        Command::Task(a) => exit(offshoot::client::run(file, ClientCommand::Task(a)).await),
        Command::Lookup(a) => exit(offshoot::client::run(file, ClientCommand::Lookup(a)).await),
        Command::Token(a) => exit(offshoot::client::run(file, ClientCommand::Token(a)).await),
        Command::Console(a) => exit(offshoot::client::run(file, ClientCommand::Console(a)).await),
    };
    let config = Config::load(file, serve.settings())?;
    init_tracing(config.log_format);
    let listener = tokio::net::TcpListener::bind(&config.listen).await.with_context(|| format!("binding {}", config.listen))?;
    let shutdown = CancellationToken::new();
    let s = shutdown.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        s.cancel();
    });
    offshoot::run(listener, config, shutdown).await
}
