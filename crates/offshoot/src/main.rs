//! `offshoot serve`: reads the configuration, sets up tracing and runs the server until
//! SIGINT or SIGTERM.

use anyhow::Context;
use tokio_util::sync::CancellationToken;

fn usage() -> ! {
    eprintln!(
        "usage: offshoot serve [--config FILE] [--listen ADDR] [--database-url URL] [--roles api,ws,worker]\n\
         \x20      offshoot dead-letters [list] [--limit N]      webhook deliveries given up on\n\
         \x20      offshoot dead-letters replay (--all | ID...)  queue them again (same X-Webhook-Id)\n\
         \x20      offshoot jobs                                 jobs per queue and state\n\n\
         Environment: OFFSHOOT_LISTEN (default 127.0.0.1:3000), DATABASE_URL (default sqlite://offshoot.db?mode=rwc),\n\
         OFFSHOOT_API_KEY / OFFSHOOT_API_SECRET (generated and stored on first start when unset), OFFSHOOT_ROLES,\n\
         OFFSHOOT_BACKFILL_PAGE_SIZE, OFFSHOOT_BACKFILL_PAGE_DELAY_MS, RUST_LOG, OFFSHOOT_LOG_FORMAT (text|json),\n\
         OFFSHOOT_METRICS_LISTEN (main|off|ADDR), OFFSHOOT_REQUEST_TIMEOUT_MS, OFFSHOOT_MAX_BODY_BYTES, OFFSHOOT_MAX_WS_CONNECTIONS.\n\
         --config FILE (or OFFSHOOT_CONFIG): the same keys as KEY=value lines; the environment wins."
    );
    std::process::exit(2)
}

/// Log lines on stdout: text, or one JSON object per line (`OFFSHOOT_LOG_FORMAT=json`) with
/// the fields of every enclosing span, so each line of a request carries its `request_id`.
fn init_tracing(format: offshoot::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,sqlx=warn".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match format {
        offshoot::LogFormat::Text => builder.init(),
        offshoot::LogFormat::Json => builder.json().with_current_span(false).with_span_list(true).init(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("serve") => {}
        Some("dead-letters") => return offshoot::cli::dead_letters(args.collect()).await,
        Some("jobs") => return offshoot::cli::jobs().await,
        _ => usage(),
    }
    let rest: Vec<String> = args.collect();
    // The config file comes first: flags override it and the environment.
    let file =
        rest.iter().position(|a| a == "--config").and_then(|i| rest.get(i + 1)).cloned().or_else(|| std::env::var("OFFSHOOT_CONFIG").ok());
    let mut config = offshoot::Config::load(file.as_deref().map(std::path::Path::new))?;
    let mut args = rest.into_iter();
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--config" => {}
            "--listen" => config.listen = value,
            "--database-url" => config.database_url = value,
            "--roles" => config.roles = offshoot::Roles::parse(&value)?,
            _ => usage(),
        }
    }
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
