//! The `cetera` binary: parses flags, sets up logging, serves until SIGINT or
//! SIGTERM, or runs a one-off command such as `cetera restore` or `cetera migrate`.

use clap::Parser;
use tracing_subscriber::EnvFilter;

use cetera::config::{Command, Config, LogFormat};

// Every request allocates its protobuf messages and HTTP/2 frames; mimalloc
// makes those allocations markedly cheaper than glibc's malloc under threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let config = Config::parse().with_command_endpoint();
    init_logging(config.log_format);
    let outcome = match &config.command {
        None => cetera::server::run(config, shutdown_signal()).await,
        Some(Command::Restore { file, force, .. }) => {
            cetera::restore::run(&config, file, *force).await
        }
        Some(Command::Migrate {
            from,
            to,
            force,
            history,
            from_cacert,
            from_cert,
            from_key,
            to_cacert,
            to_cert,
            to_key,
        }) => {
            let options = cetera::migrate::MigrateOptions {
                from: from.clone(),
                to: to.clone(),
                force: *force,
                history: *history,
                etcd_tls: cetera::migrate::etcd::EtcdTls {
                    cacert: from_cacert.clone(),
                    cert: from_cert.clone(),
                    key: from_key.clone(),
                },
                to_etcd_tls: cetera::migrate::etcd::EtcdTls {
                    cacert: to_cacert.clone(),
                    cert: to_cert.clone(),
                    key: to_key.clone(),
                },
            };
            cetera::migrate::migrate_command(&config, &options).await
        }
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, not in files or journals.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Resolves on the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("cannot install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutdown signal received");
}
