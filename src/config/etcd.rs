//! etcd's command line, `ETCD_*` variables and `--config-file`, read the way
//! etcd 3.5's etcdmain reads them, on top of cetera's own flags.
//!
//! The mechanism is generic over the clap arguments: an `ETCD_*` variable or
//! a config-file key names a flag by its long name (or an alias), upper-cased
//! with dashes as underscores for variables (`ETCD_DATA_DIR` is
//! `--data-dir`), so every flag cetera has, now or later, is covered.
//! etcd's flags that mean nothing to cetera are accepted (hidden) and named
//! once in the log. The rules, as etcd's:
//!
//! - an unknown flag: `flag provided but not defined: -NAME` and etcd's usage
//!   on stderr, exit code 2;
//! - `--config-file` (or `ETCD_CONFIG_FILE`): the YAML is the whole
//!   configuration; the command line's other flags and `ETCD_*` variables
//!   are ignored (cetera's own `CETERA_*` variables still apply);
//! - otherwise a variable is used for a flag not on the command line; one
//!   given both ways stops the server (etcd's fatal "conflicting environment
//!   variable is shadowed..."); an `ETCD_*` variable no flag has is warned
//!   about; `ETCD_VERSION` is refused with a warning.

use std::collections::BTreeSet;
use std::ffi::OsString;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use super::Config;

/// etcd's usage text, printed after an unknown flag as etcd prints it
/// (3.7 adds [`DURATION_NOTE`] after the config file's line).
const ETCD_USAGE: &str = "Usage:

  etcd [flags]
    Start an etcd server.

  etcd --version
    Show the version of etcd.

  etcd -h | --help
    Show the help information about etcd.

  etcd --config-file
    Path to the server configuration file. Note that if a configuration file is provided, other command line flags and environment variables will be ignored.
{duration_note}
  etcd gateway
    Run the stateless pass-through etcd TCP connection forwarding proxy.

  etcd grpc-proxy
    Run the stateless etcd v3 gRPC L7 reverse proxy.
";

/// etcd 3.7's note on durations in a config file, in its usage text.
const DURATION_NOTE: &str =
    "    Duration-typed fields (for example --heartbeat-interval, --election-timeout,
    --watch-progress-notify-interval) must be specified as integer nanoseconds
    in the JSON/YAML file (e.g. 600000000000 for 10m); human-readable strings
    such as \"10m\" are only accepted on the command line.
";

/// The usage text of the etcd that `args` (or `CETERA_EMULATED_ETCD_VERSION`,
/// or the default) make cetera emulate.
fn etcd_usage(args: &[OsString]) -> String {
    let mut version = std::env::var("CETERA_EMULATED_ETCD_VERSION").ok();
    let mut args = args.iter().map(|arg| arg.to_string_lossy());
    while let Some(arg) = args.next() {
        let arg = arg.trim_start_matches('-');
        if arg == "emulated-etcd-version" {
            version = args.next().map(|v| v.into_owned());
        } else if let Some(value) = arg.strip_prefix("emulated-etcd-version=") {
            version = Some(value.to_string());
        }
    }
    let version = version.unwrap_or_else(|| super::DEFAULT_EMULATED_VERSION.to_string());
    let from_37 = super::major_minor(&version) >= (3, 7);
    ETCD_USAGE.replace("{duration_note}", if from_37 { DURATION_NOTE } else { "" })
}

/// Whether an accepted etcd flag takes a value or is a Go bool flag.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Value,
    Bool,
}
use Kind::{Bool, Value};

/// etcd 3.5's flags (3.5.1 to 3.5.28, and etcd's own ignored ones) that
/// have no counterpart in cetera, with why. Accepted, and named once in
/// the log when given.
const NO_EFFECT: &[(&str, Kind, &str)] = &[
    // Raft and the WAL: the database keeps the data, not a log of cetera's.
    ("wal-dir", Value, "cetera keeps no WAL"),
    ("max-snapshots", Value, "cetera keeps no snapshot files"),
    ("max-wals", Value, "cetera keeps no WAL"),
    ("snapshot-count", Value, "cetera keeps no raft snapshots"),
    ("heartbeat-interval", Value, "cetera has no etcd raft ticks"),
    ("election-timeout", Value, "cetera has no etcd raft ticks"),
    (
        "initial-election-tick-advance",
        Bool,
        "cetera has no etcd raft ticks",
    ),
    ("pre-vote", Bool, "cetera has no etcd raft"),
    ("strict-reconfig-check", Bool, "cetera has no etcd raft"),
    ("force-new-cluster", Bool, "cetera has no etcd raft"),
    ("unsafe-no-fsync", Bool, "the database decides durability"),
    ("raft-read-timeout", Value, "cetera has no rafthttp"),
    ("raft-write-timeout", Value, "cetera has no rafthttp"),
    (
        "initial-cluster",
        Value,
        "a cetera member is one server on its database; a replicated cetera cluster is formed with --cluster-init and --join",
    ),
    (
        "initial-cluster-state",
        Value,
        "a cetera member is one server on its database; a replicated cetera cluster is formed with --cluster-init and --join",
    ),
    (
        "initial-cluster-token",
        Value,
        "a cetera member is one server on its database; replicated members authenticate with --token",
    ),
    ("discovery", Value, "cetera does not discover members"),
    (
        "discovery-fallback",
        Value,
        "cetera does not discover members",
    ),
    ("discovery-proxy", Value, "cetera does not discover members"),
    ("discovery-srv", Value, "cetera does not discover members"),
    (
        "discovery-srv-name",
        Value,
        "cetera does not discover members",
    ),
    // bbolt.
    (
        "backend-bbolt-freelist-type",
        Value,
        "the database is not bbolt",
    ),
    (
        "backend-batch-interval",
        Value,
        "each write commits at once",
    ),
    ("backend-batch-limit", Value, "each write commits at once"),
    // The v2 API and the v2 proxy.
    ("enable-v2", Bool, "cetera serves the v3 API only"),
    (
        "experimental-enable-v2v3",
        Value,
        "cetera serves the v3 API only",
    ),
    ("v2-deprecation", Value, "cetera serves the v3 API only"),
    ("proxy", Value, "cetera is not a v2 proxy"),
    ("proxy-failure-wait", Value, "cetera is not a v2 proxy"),
    ("proxy-refresh-interval", Value, "cetera is not a v2 proxy"),
    ("proxy-dial-timeout", Value, "cetera is not a v2 proxy"),
    ("proxy-write-timeout", Value, "cetera is not a v2 proxy"),
    ("proxy-read-timeout", Value, "cetera is not a v2 proxy"),
    // TLS details cetera leaves to rustls.
    ("auto-tls", Bool, "cetera makes no self-signed certificates"),
    (
        "peer-auto-tls",
        Bool,
        "cetera makes no self-signed certificates",
    ),
    (
        "self-signed-cert-validity",
        Value,
        "cetera makes no self-signed certificates",
    ),
    (
        "client-cert-file",
        Value,
        "cetera's server certificate serves both ends",
    ),
    (
        "client-key-file",
        Value,
        "cetera's server certificate serves both ends",
    ),
    ("client-crl-file", Value, "not applied: no CRL check"),
    (
        "client-cert-allowed-hostname",
        Value,
        "not applied: any certificate of --trusted-ca-file is taken",
    ),
    (
        "peer-client-cert-auth",
        Bool,
        "cetera's peer TLS always checks both ends against --peer-trusted-ca-file",
    ),
    (
        "peer-client-cert-file",
        Value,
        "cetera's peer certificate serves both ends",
    ),
    (
        "peer-client-key-file",
        Value,
        "cetera's peer certificate serves both ends",
    ),
    ("peer-crl-file", Value, "not applied: no CRL check"),
    (
        "peer-cert-allowed-cn",
        Value,
        "not applied: any certificate of --peer-trusted-ca-file is taken",
    ),
    (
        "peer-cert-allowed-hostname",
        Value,
        "not applied: any certificate of --peer-trusted-ca-file is taken",
    ),
    (
        "experimental-peer-skip-client-san-verification",
        Bool,
        "not applied: peer certificates are checked by chain",
    ),
    (
        "cipher-suites",
        Value,
        "not applied: rustls's safe defaults are used",
    ),
    (
        "tls-min-version",
        Value,
        "not applied: rustls's safe defaults (TLS 1.2 and 1.3) are used",
    ),
    (
        "tls-max-version",
        Value,
        "not applied: rustls's safe defaults (TLS 1.2 and 1.3) are used",
    ),
    // Serving details.
    (
        "grpc-keepalive-min-time",
        Value,
        "not applied: the gRPC server's defaults are used",
    ),
    (
        "grpc-keepalive-interval",
        Value,
        "not applied: the gRPC server's defaults are used",
    ),
    (
        "grpc-keepalive-timeout",
        Value,
        "not applied: the gRPC server's defaults are used",
    ),
    (
        "max-concurrent-streams",
        Value,
        "not applied: the gRPC server's defaults are used",
    ),
    ("socket-reuse-port", Bool, "not applied"),
    ("socket-reuse-address", Bool, "not applied"),
    ("cors", Value, "not applied"),
    ("host-whitelist", Value, "not applied"),
    ("enable-grpc-gateway", Bool, "not a switch in cetera"),
    (
        "listen-client-http-urls",
        Value,
        "not applied: HTTP is served with gRPC on the client URLs",
    ),
    ("enable-pprof", Bool, "cetera has no Go profiler"),
    (
        "metrics",
        Value,
        "cetera's metrics are one set (etcd's basic and its own)",
    ),
    // Logging details.
    (
        "enable-log-rotation",
        Bool,
        "not applied: rotate with logrotate",
    ),
    (
        "log-rotation-config-json",
        Value,
        "not applied: rotate with logrotate",
    ),
    // Tracing.
    (
        "experimental-enable-distributed-tracing",
        Bool,
        "cetera has no tracing exporter",
    ),
    (
        "experimental-distributed-tracing-address",
        Value,
        "cetera has no tracing exporter",
    ),
    (
        "experimental-distributed-tracing-service-name",
        Value,
        "cetera has no tracing exporter",
    ),
    (
        "experimental-distributed-tracing-instance-id",
        Value,
        "cetera has no tracing exporter",
    ),
    (
        "experimental-distributed-tracing-sampling-rate",
        Value,
        "cetera has no tracing exporter",
    ),
    // etcd's internal checks and tuning.
    (
        "experimental-initial-corrupt-check",
        Bool,
        "the database keeps its own integrity",
    ),
    (
        "experimental-corrupt-check-time",
        Value,
        "the database keeps its own integrity",
    ),
    (
        "experimental-compact-hash-check-enabled",
        Bool,
        "the database keeps its own integrity",
    ),
    (
        "experimental-compact-hash-check-time",
        Value,
        "the database keeps its own integrity",
    ),
    (
        "experimental-enable-lease-checkpoint",
        Bool,
        "leases live in the database",
    ),
    (
        "experimental-enable-lease-checkpoint-persist",
        Bool,
        "leases live in the database",
    ),
    (
        "experimental-compaction-batch-limit",
        Value,
        "cetera compacts in its own steps of 1000 revisions",
    ),
    (
        "experimental-compaction-sleep-interval",
        Value,
        "cetera compacts in its own steps of 1000 revisions",
    ),
    ("experimental-downgrade-check-time", Value, "not applied"),
    ("experimental-warning-apply-duration", Value, "not applied"),
    ("experimental-memory-mlock", Bool, "not applied"),
    (
        "experimental-txn-mode-write-with-shared-buffer",
        Bool,
        "not applied",
    ),
    (
        "experimental-bootstrap-defrag-threshold-megabytes",
        Value,
        "not applied",
    ),
    (
        "experimental-snapshot-catchup-entries",
        Value,
        "cetera has no etcd raft",
    ),
    (
        "experimental-stop-grpc-service-on-defrag",
        Bool,
        "defragmentation does not stop serving",
    ),
    (
        "experimental-max-learners",
        Value,
        "cetera has no etcd raft learners",
    ),
    (
        "experimental-wait-cluster-ready-timeout",
        Value,
        "not applied",
    ),
    // Flags of etcd 2 that etcd 3.5 still accepts and ignores.
    ("cluster-active-size", Value, "ignored by etcd too"),
    ("cluster-remove-delay", Value, "ignored by etcd too"),
    ("cluster-sync-interval", Value, "ignored by etcd too"),
    ("config", Value, "ignored by etcd too"),
    ("force", Value, "ignored by etcd too"),
    ("max-result-buffer", Value, "ignored by etcd too"),
    ("max-retry-attempts", Value, "ignored by etcd too"),
    ("peer-heartbeat-interval", Value, "ignored by etcd too"),
    ("peer-election-timeout", Value, "ignored by etcd too"),
    ("retry-interval", Value, "ignored by etcd too"),
    ("snapshot", Value, "ignored by etcd too"),
    ("v", Value, "ignored by etcd too"),
    ("vv", Value, "ignored by etcd too"),
];

/// A YAML key that is a Go time.Duration in etcd's config struct: an integer
/// there is nanoseconds.
const DURATION_KEYS: &[&str] = &[
    "experimental-watch-progress-notify-interval",
    "watch-progress-notify-interval",
];

/// Something to log once logging is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// An info line.
    Info(String),
    /// A warning.
    Warn(String),
}

/// Why the configuration cannot be used, and how the process ends.
#[derive(Debug)]
pub enum LoadError {
    /// clap's own answer (help, version, a bad value): print it and exit
    /// as clap does.
    Clap(clap::Error),
    /// etcd's answer: the text for stderr and the exit code.
    Etcd {
        /// What to print on stderr.
        message: String,
        /// The process's exit code.
        code: u8,
    },
}

/// The command line with etcd's flags that cetera accepts without effect.
pub fn command() -> clap::Command {
    let mut command = Config::command().args_override_self(true);
    for &(name, kind, _) in NO_EFFECT {
        let arg = Arg::new(name).long(name).hide(true);
        let arg = match kind {
            Value => arg.action(ArgAction::Set).allow_hyphen_values(true),
            Bool => arg
                .action(ArgAction::Set)
                .num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .value_parser(|text: &str| {
                    super::parse_go_bool(text).ok_or_else(|| {
                        format!("parse error: strconv.ParseBool: parsing {text:?}: invalid syntax")
                    })
                }),
        };
        command = command.arg(arg);
    }
    command
}

/// Reads the configuration from `args` (program name first) and `env`.
pub fn load<I, T>(
    args: I,
    env: &dyn Fn(&str) -> Option<String>,
    env_names: &[String],
) -> Result<(Config, Vec<Note>), LoadError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let command = command();
    let args = go_style_flags(args);
    let matches = parse(&command, &args)?;
    let mut notes = Vec::new();
    if matches.subcommand().is_some() {
        return Ok((from_matches(&matches)?, notes));
    }
    let config_file = matches
        .get_one::<std::path::PathBuf>("config_file")
        .cloned()
        .or_else(|| {
            env("ETCD_CONFIG_FILE")
                .filter(|v| !v.is_empty())
                .map(Into::into)
        });
    let matches = match config_file {
        Some(path) => {
            let yaml_args = yaml_args(&command, &path, &mut notes)?;
            let mut full = vec![args[0].clone()];
            full.extend(yaml_args);
            notes.push(Note::Info(format!(
                "loaded server configuration, other configuration command line flags and environment variables will be ignored if provided (path: {})",
                path.display()
            )));
            parse(&command, &full)?
        }
        None => {
            let env_args = env_args(&command, &matches, env, env_names, &mut notes)?;
            if env_args.is_empty() {
                matches
            } else {
                let mut full = args.clone();
                full.extend(env_args);
                parse(&command, &full)?
            }
        }
    };
    for &(name, _, why) in NO_EFFECT {
        if matches.value_source(name) == Some(ValueSource::CommandLine) {
            notes.push(Note::Warn(format!(
                "etcd flag --{name} accepted without effect: {why}"
            )));
        }
    }
    let mut config = from_matches(&matches)?;
    config.resolve_etcd_flags(&matches, &mut notes)?;
    Ok((config, notes))
}

fn from_matches(matches: &ArgMatches) -> Result<Config, LoadError> {
    Config::from_arg_matches(matches).map_err(LoadError::Clap)
}

/// Parses `args`, answering an unknown flag as etcd does.
fn parse(command: &clap::Command, args: &[OsString]) -> Result<ArgMatches, LoadError> {
    command
        .clone()
        .try_get_matches_from(args)
        .map_err(|error| match error.kind() {
            clap::error::ErrorKind::UnknownArgument | clap::error::ErrorKind::InvalidSubcommand => {
                let given = error
                    .get(clap::error::ContextKind::InvalidArg)
                    .or_else(|| error.get(clap::error::ContextKind::InvalidSubcommand))
                    .map(|value| value.to_string())
                    .unwrap_or_default();
                let name = given
                    .trim_start_matches('-')
                    .split('=')
                    .next()
                    .unwrap_or_default()
                    .to_string();
                if given.starts_with('-') {
                    LoadError::Etcd {
                        message: format!(
                            "flag provided but not defined: -{name}\n{}",
                            etcd_usage(args)
                        ),
                        code: 2,
                    }
                } else {
                    LoadError::Etcd {
                        message: format!("'{given}' is not a valid flag"),
                        code: 1,
                    }
                }
            }
            _ => LoadError::Clap(error),
        })
}

/// Every long name (and alias) of the command's flags, with its arg.
fn long_names(command: &clap::Command) -> Vec<(String, &Arg)> {
    command
        .get_arguments()
        .filter(|arg| !["help", "version"].contains(&arg.get_id().as_str()))
        .flat_map(|arg| {
            arg.get_long()
                .into_iter()
                .chain(arg.get_all_aliases().unwrap_or_default())
                .map(move |name| (name.to_string(), arg))
        })
        .collect()
}

/// Go's flag package takes `-name` as `--name`: so does cetera, for names
/// of two letters or more (its `-h` and `-V` stay short; `-1`, a value, is
/// left alone).
fn go_style_flags(args: Vec<OsString>) -> Vec<OsString> {
    let mut done = false;
    args.into_iter()
        .enumerate()
        .map(|(i, arg)| {
            let Some(text) = arg.to_str() else { return arg };
            if i == 0 || done {
                return arg;
            }
            if text == "--" {
                done = true;
                return arg;
            }
            let name = text.split('=').next().unwrap_or_default();
            let go_style =
                name.len() > 2 && name.starts_with('-') && name.as_bytes()[1].is_ascii_alphabetic();
            if go_style {
                OsString::from(format!("-{text}"))
            } else {
                arg
            }
        })
        .collect()
}

/// `--name=value` for a flag, or the bare flag for a switch that is on.
fn flag_arg(arg: &Arg, name: &str, value: &str) -> Option<OsString> {
    if arg.get_action().takes_values() {
        Some(format!("--{name}={value}").into())
    } else if super::parse_go_bool(value) == Some(true) {
        Some(format!("--{name}").into())
    } else {
        None
    }
}

/// etcd's SetFlagsFromEnv: `ETCD_NAME` for each flag not on the command line.
fn env_args(
    command: &clap::Command,
    matches: &ArgMatches,
    env: &dyn Fn(&str) -> Option<String>,
    env_names: &[String],
    notes: &mut Vec<Note>,
) -> Result<Vec<OsString>, LoadError> {
    if let Some(value) = env("ETCD_VERSION").filter(|v| !v.is_empty()) {
        notes.push(Note::Warn(format!(
            "cannot set special environment variable (key: ETCD_VERSION, value: {value})"
        )));
    }
    let mut used = BTreeSet::from(["ETCD_VERSION".to_string(), "ETCD_CONFIG_FILE".to_string()]);
    let mut args = Vec::new();
    for (name, arg) in long_names(command) {
        let key = format!("ETCD_{}", name.to_uppercase().replace('-', "_"));
        let Some(value) = env(&key) else { continue };
        let on_command_line =
            matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine);
        if on_command_line {
            return Err(LoadError::Etcd {
                message: format!(
                    "conflicting environment variable is shadowed by corresponding command-line flag (either unset environment variable or disable flag)) (environment-variable: {key})"
                ),
                code: 1,
            });
        }
        used.insert(key.clone());
        if value.is_empty() {
            continue;
        }
        notes.push(Note::Info(format!(
            "recognized and used environment variable (variable-name: {key}, variable-value: {value})"
        )));
        args.extend(flag_arg(arg, &name, &value));
    }
    for name in env_names {
        if name.starts_with("ETCD_") && !used.contains(name) {
            notes.push(Note::Warn(format!(
                "unrecognized environment variable (environment-variable: {name})"
            )));
        }
    }
    Ok(args)
}

/// The flags an etcd YAML config file sets: each key is a flag's long
/// name; the `client-transport-security` and `peer-transport-security`
/// sections hold the TLS flags (the peer ones with `peer-`).
fn yaml_args(
    command: &clap::Command,
    path: &std::path::Path,
    notes: &mut Vec<Note>,
) -> Result<Vec<OsString>, LoadError> {
    let fail = |message: String| LoadError::Etcd { message, code: 1 };
    let text = std::fs::read_to_string(path).map_err(|e| {
        fail(format!(
            "cannot read the config file {}: {e}",
            path.display()
        ))
    })?;
    let document: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)
        .map_err(|e| fail(format!("error converting YAML to JSON: yaml: {e}")))?;
    let mut pairs: Vec<(String, serde_yaml_ng::Value)> = Vec::new();
    match document {
        serde_yaml_ng::Value::Mapping(map) => {
            for (key, value) in map {
                let Some(key) = key.as_str().map(str::to_string) else {
                    continue;
                };
                match (key.as_str(), value) {
                    ("client-transport-security", serde_yaml_ng::Value::Mapping(section)) => {
                        for (inner, value) in section {
                            if let Some(inner) = inner.as_str() {
                                let name = match inner {
                                    "crl-file" => "client-crl-file".to_string(),
                                    "allowed-hostname" => {
                                        "client-cert-allowed-hostname".to_string()
                                    }
                                    other => other.to_string(),
                                };
                                pairs.push((name, value));
                            }
                        }
                    }
                    ("peer-transport-security", serde_yaml_ng::Value::Mapping(section)) => {
                        for (inner, value) in section {
                            if let Some(inner) = inner.as_str() {
                                let name = match inner {
                                    "client-cert-auth" => "peer-client-cert-auth".to_string(),
                                    "allowed-cn" => "peer-cert-allowed-cn".to_string(),
                                    "allowed-hostname" => "peer-cert-allowed-hostname".to_string(),
                                    other => format!("peer-{other}"),
                                };
                                pairs.push((name, value));
                            }
                        }
                    }
                    (_, value) => pairs.push((key, value)),
                }
            }
        }
        serde_yaml_ng::Value::Null => {}
        _ => {
            return Err(fail(
                "error unmarshaling JSON: the config file is not a YAML mapping".to_string(),
            ));
        }
    }
    let names = long_names(command);
    let mut args = Vec::new();
    for (key, value) in pairs {
        let Some((name, arg)) = names.iter().find(|(name, _)| *name == key) else {
            notes.push(Note::Warn(format!(
                "config file key {key:?} is not an etcd or cetera setting; ignored"
            )));
            continue;
        };
        let text = match value {
            serde_yaml_ng::Value::Null => continue,
            serde_yaml_ng::Value::Bool(on) => on.to_string(),
            serde_yaml_ng::Value::Number(number) => {
                if DURATION_KEYS.contains(&key.as_str()) {
                    format!("{number}ns")
                } else {
                    number.to_string()
                }
            }
            serde_yaml_ng::Value::String(text) => text,
            serde_yaml_ng::Value::Sequence(items) => items
                .iter()
                .map(|item| match item {
                    serde_yaml_ng::Value::String(text) => text.clone(),
                    other => serde_yaml_ng::to_string(other)
                        .unwrap_or_default()
                        .trim()
                        .to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
            serde_yaml_ng::Value::Mapping(_) | serde_yaml_ng::Value::Tagged(_) => {
                notes.push(Note::Warn(format!(
                    "config file key {key:?} holds a mapping cetera does not read; ignored"
                )));
                continue;
            }
        };
        // etcd's YAML leaves empty strings and false at their defaults.
        if text.is_empty() {
            continue;
        }
        args.extend(flag_arg(arg, name, &text));
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load_with(args: &[&str], env: &[(&str, &str)]) -> Result<(Config, Vec<Note>), LoadError> {
        let vars: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let names: Vec<String> = vars.iter().map(|(k, _)| k.clone()).collect();
        let lookup = move |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let mut full = vec!["cetera"];
        full.extend_from_slice(args);
        load(full, &lookup, &names)
    }

    fn etcd_error(result: Result<(Config, Vec<Note>), LoadError>) -> (String, u8) {
        match result {
            Err(LoadError::Etcd { message, code }) => (message, code),
            Err(LoadError::Clap(error)) => panic!("clap: {error}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn unknown_flags_get_etcds_message_and_exit_code() {
        let (message, code) = etcd_error(load_with(&["--no-such-flag=1"], &[]));
        assert!(message.starts_with("flag provided but not defined: -no-such-flag\nUsage:"));
        assert_eq!(code, 2);
        let (message, code) = etcd_error(load_with(&["-no-such-flag"], &[]));
        assert!(message.starts_with("flag provided but not defined: -no-such-flag\n"));
        assert_eq!(code, 2);
        let (message, code) = etcd_error(load_with(&["extra"], &[]));
        assert_eq!((message.as_str(), code), ("'extra' is not a valid flag", 1));
    }

    #[test]
    fn etcd_flags_map_to_cetera_settings_and_the_rest_are_named_once() {
        let (config, notes) = load_with(
            &[
                "--name=m1",
                "--data-dir",
                "/var/lib/etcd",
                "-snapshot-count=10000",
                "--heartbeat-interval",
                "100",
                "--enable-v2=false",
                "--auto-tls",
                "--listen-peer-urls=http://127.0.0.1:12380,http://127.0.0.2:12380",
                "--initial-advertise-peer-urls",
                "http://10.0.0.1:2380",
                "--log-level",
                "warn",
                "--experimental-initial-corrupt-check=true",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(config.name, "m1");
        assert_eq!(config.endpoint, "/var/lib/etcd/cetera/state.db");
        assert_eq!(
            config.peer_listen_address,
            "127.0.0.1:12380".parse().unwrap()
        );
        assert_eq!(
            config.advertise_peer_url.as_deref(),
            Some("http://10.0.0.1:2380")
        );
        assert_eq!(config.log_level.as_deref(), Some("warn"));
        let named: Vec<&Note> = notes
            .iter()
            .filter(|n| matches!(n, Note::Warn(t) if t.starts_with("etcd flag")))
            .collect();
        assert_eq!(named.len(), 5, "{notes:?}");
        // A Go bool flag takes no separate value.
        assert!(load_with(&["--enable-v2", "true"], &[]).is_err());
        assert!(load_with(&["--enable-v2=maybe"], &[]).is_err());
        // --endpoint wins over --data-dir.
        let (config, _) = load_with(&["--data-dir=/d", "--endpoint=/e.db"], &[]).unwrap();
        assert_eq!(config.endpoint, "/e.db");
    }

    #[test]
    fn etcd_variables_count_as_etcd_counts_them() {
        let (config, notes) = load_with(
            &["--name", "m1"],
            &[
                ("ETCD_DATA_DIR", "/srv/etcd"),
                ("ETCD_CLIENT_CERT_AUTH", "false"),
                ("ETCD_SNAPSHOT_COUNT", "5000"),
                ("ETCD_NO_SUCH_THING", "1"),
                ("ETCD_MAX_TXN_OPS", "256"),
                ("ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL", "250ms"),
            ],
        )
        .unwrap();
        assert_eq!(config.endpoint, "/srv/etcd/cetera/state.db");
        assert_eq!(config.max_txn_ops, 256);
        assert_eq!(
            config.watch_progress_notify_interval,
            std::time::Duration::from_millis(250)
        );
        assert!(notes.contains(&Note::Warn(
            "unrecognized environment variable (environment-variable: ETCD_NO_SUCH_THING)".into()
        )));
        assert!(
            notes
                .iter()
                .any(|n| matches!(n, Note::Info(t) if t.contains("ETCD_DATA_DIR")))
        );
        // A flag and its variable both: etcd refuses to start.
        let (message, code) = etcd_error(load_with(&["--name=a"], &[("ETCD_NAME", "b")]));
        assert!(
            message.starts_with("conflicting environment variable is shadowed"),
            "{message}"
        );
        assert_eq!(code, 1);
    }

    #[test]
    fn config_file_is_the_whole_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd.yaml");
        std::fs::write(
            &path,
            "name: infra1\n\
             data-dir: /var/lib/etcd\n\
             snapshot-count: 10000\n\
             max-txn-ops: 512\n\
             enable-v2: false\n\
             experimental-watch-progress-notify-interval: 250000000\n\
             log-outputs: [stderr]\n\
             client-transport-security:\n  cert-file: /c.pem\n  key-file: /k.pem\n  client-cert-auth: true\n  trusted-ca-file: /ca.pem\n\
             peer-transport-security:\n  cert-file: /pc.pem\n  client-cert-auth: true\n\
             not-a-setting: 1\n",
        )
        .unwrap();
        let file = path.display().to_string();
        let (config, notes) = load_with(
            &["--config-file", &file, "--name", "ignored"],
            &[("ETCD_MAX_TXN_OPS", "3")],
        )
        .unwrap();
        assert_eq!(config.name, "infra1");
        assert_eq!(config.endpoint, "/var/lib/etcd/cetera/state.db");
        assert_eq!(config.max_txn_ops, 512);
        assert_eq!(
            config.watch_progress_notify_interval,
            std::time::Duration::from_millis(250)
        );
        assert_eq!(config.cert_file, Some("/c.pem".into()));
        assert!(config.client_cert_auth);
        assert_eq!(config.trusted_ca_file, Some("/ca.pem".into()));
        assert_eq!(config.peer_cert_file, Some("/pc.pem".into()));
        assert!(
            notes
                .iter()
                .any(|n| matches!(n, Note::Warn(t) if t.contains("not-a-setting")))
        );
        assert!(
            notes.iter().any(
                |n| matches!(n, Note::Info(t) if t.starts_with("loaded server configuration"))
            )
        );
        // ETCD_CONFIG_FILE names it too.
        let (config, _) = load_with(&[], &[("ETCD_CONFIG_FILE", &file)]).unwrap();
        assert_eq!(config.name, "infra1");
    }
}
