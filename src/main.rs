//! The `cetera` binary: parses flags, sets up logging, serves until SIGINT or
//! SIGTERM, or runs a one-off command such as `cetera restore` or `cetera migrate`.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use cetera::config::etcd::{LoadError, Note};
use cetera::config::{Command, Config, LogFormat};

// Every request allocates its protobuf messages and HTTP/2 frames; mimalloc
// makes those allocations markedly cheaper than glibc's malloc under threads.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    disable_transparent_huge_pages();
    let (config, notes) = match Config::load() {
        Ok(loaded) => loaded,
        Err(LoadError::Clap(error)) => error.exit(),
        Err(LoadError::Etcd { message, code }) => {
            eprintln!("{message}");
            return std::process::ExitCode::from(code);
        }
    };
    let config = config.with_command_endpoint();
    if let Err(error) = init_logging(&config) {
        eprintln!("{error:#}");
        return std::process::ExitCode::FAILURE;
    }
    for note in notes {
        match note {
            Note::Info(text) => tracing::info!("{text}"),
            Note::Warn(text) => tracing::warn!("{text}"),
        }
    }
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

/// Logging as the flags ask: etcd's --log-level (else RUST_LOG, else info),
/// --log-outputs (stderr, stdout, files) and cetera's --log-format.
fn init_logging(config: &Config) -> anyhow::Result<()> {
    let filter = match config.log_level.as_deref() {
        Some("dpanic" | "panic" | "fatal") => EnvFilter::new("error"),
        Some(level) => EnvFilter::new(level),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let mut outputs: Option<BoxMakeWriter> = None;
    let mut only_stderr = true;
    for output in &config.log_outputs {
        let writer = match output.as_str() {
            "default" | "stderr" => BoxMakeWriter::new(std::io::stderr),
            "stdout" => {
                only_stderr = false;
                BoxMakeWriter::new(std::io::stdout)
            }
            path => {
                only_stderr = false;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| anyhow::anyhow!("cannot open log output {path}: {e}"))?;
                BoxMakeWriter::new(std::sync::Arc::new(file))
            }
        };
        outputs = Some(match outputs {
            None => writer,
            Some(earlier) => BoxMakeWriter::new(earlier.and(writer)),
        });
    }
    let writer = outputs.unwrap_or_else(|| BoxMakeWriter::new(std::io::stderr));
    // Colours only for a person at a terminal, not in files or journals.
    let colour = only_stderr && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(colour)
        .with_writer(writer);
    let layer = match config.log_format {
        LogFormat::Plain => layer.boxed(),
        LogFormat::Json => layer.json().boxed(),
    };
    // openraft's line per failed peer call: the peer connections log a lost
    // peer once instead (see cetera::is_openraft_per_call_report).
    let quiet = tracing_subscriber::filter::filter_fn(|metadata: &tracing::Metadata<'_>| {
        !cetera::is_openraft_per_call_report(metadata)
    });
    tracing_subscriber::registry()
        .with(filter)
        .with(quiet)
        .with(layer)
        .init();
    Ok(())
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

/// mimalloc asks the kernel for transparent huge pages on its arenas, and a
/// huge page is resident whole once any byte of it is touched: 17 MB more
/// at start and 30 MB more after 100k puts (issue 51), with no gain in CPU
/// per request measured. etcd's Go runtime asks for none either.
fn disable_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes no pointers; it sets a flag of this
    // process's memory map, and failure (an old kernel) changes nothing.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
