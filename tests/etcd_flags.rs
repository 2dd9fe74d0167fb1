//! etcd's command line, ETCD_* variables and --config-file start cetera as
//! they start the oracle etcd (3.7.3 or 3.5.1): the same unit-file command line and the same YAML
//! bring both up serving on the given address with data in the given
//! directory, and what etcd refuses, cetera refuses with etcd's words.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::cetera_server::cetera_bin;
use common::process::Proc;
use common::{etcd_bin, free_port};

/// An etcd systemd unit's ExecStart arguments, as etcd's docs and
/// distributions write them, for one member on 127.0.0.1.
fn unit_args(data_dir: &Path, client: u16, peer: u16) -> Vec<String> {
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    [
        "--name=infra0".to_string(),
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=infra0={peer_url}"),
        "--initial-cluster-token=etcd-cluster-1".to_string(),
        "--initial-cluster-state=new".to_string(),
        "--heartbeat-interval=100".to_string(),
        "--election-timeout=1000".to_string(),
        "--snapshot-count=10000".to_string(),
        "--max-snapshots=5".to_string(),
        "--max-wals=5".to_string(),
        "--quota-backend-bytes=8589934592".to_string(),
        "--auto-compaction-mode=periodic".to_string(),
        "--auto-compaction-retention=1".to_string(),
        "--max-request-bytes=1572864".to_string(),
        "--enable-pprof".to_string(),
        "--metrics=basic".to_string(),
        "--logger=zap".to_string(),
        "--log-level=info".to_string(),
        "--log-outputs=stderr".to_string(),
        "--unsafe-no-fsync".to_string(),
    ]
    .into_iter()
    .chain(version_args())
    .collect()
}

/// The unit's flags whose spelling depends on the oracle's version: 3.6 and
/// later removed `--enable-v2` and the `--experimental-` flags (the corrupt
/// check became a feature gate).
fn version_args() -> Vec<String> {
    let flags: &[&str] = if common::oracle().is_36_or_later() {
        &[
            "--feature-gates=InitialCorruptCheck=true",
            "--watch-progress-notify-interval=5s",
        ]
    } else {
        &[
            "--enable-v2=false",
            "--experimental-initial-corrupt-check=true",
            "--experimental-watch-progress-notify-interval=5s",
        ]
    };
    flags.iter().map(|s| s.to_string()).collect()
}

/// `program` to run, with the version the oracle asks cetera to report.
fn command(program: &Path) -> Command {
    let mut command = Command::new(program);
    if program == cetera_bin() {
        command.envs(common::reference_binaries::cetera_env());
    }
    command
}

/// Spawns `program` with `args` and `env` (and nothing else from ETCD_* or
/// CETERA_*, but the version cetera reports).
fn spawn(program: &Path, args: &[String], env: &[(&str, String)], log: &Path) -> Proc {
    let out = std::fs::File::create(log).unwrap();
    let mut command = Command::new(program);
    for (name, _) in std::env::vars() {
        if name.starts_with("ETCD_") || name.starts_with("CETERA_") {
            command.env_remove(name);
        }
    }
    if program == cetera_bin() {
        command.envs(common::reference_binaries::cetera_env());
    }
    let child = command
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    Proc {
        child,
        log: log.to_path_buf(),
    }
}

/// Starts `program` and waits until it serves on `client`; puts and gets a
/// key through etcdctl.
async fn serves(program: &Path, args: &[String], env: &[(&str, String)], client: u16, dir: &Path) {
    let log = dir.join(format!(
        "{}.log",
        program.file_name().unwrap().to_string_lossy()
    ));
    let mut proc = spawn(program, args, env, &log);
    if let Err((_, message)) = proc.wait_ready(client, "server", None).await {
        proc.kill();
        common::process::fail_startup(&format!("{message} (args: {args:?})"), &log);
    }
    if let Some(etcdctl) = common::etcdctl_35() {
        let endpoint = format!("127.0.0.1:{client}");
        let put = common::run_etcdctl(&etcdctl, &endpoint, &["put", "k", "v"]);
        assert!(put.status.success(), "{put:?}");
        let get = common::run_etcdctl(&etcdctl, &endpoint, &["get", "k", "--print-value-only"]);
        assert_eq!(String::from_utf8_lossy(&get.stdout), "v\n");
    }
    proc.terminate(std::time::Duration::from_secs(10));
}

#[tokio::test]
async fn an_etcd_unit_command_line_starts_cetera_as_it_starts_etcd() {
    let Some(etcd) = etcd_bin() else { return };
    let work = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let etcd_dir = work.path().join("etcd-data");
    serves(
        &etcd,
        &unit_args(&etcd_dir, client, peer),
        &[],
        client,
        work.path(),
    )
    .await;
    assert!(etcd_dir.join("member/snap").is_dir());

    let (client, peer) = (free_port(), free_port());
    let data_dir = work.path().join("cetera-data");
    let args = unit_args(&data_dir, client, peer);
    serves(cetera_bin(), &args, &[], client, work.path()).await;
    assert!(data_dir.join("cetera/state.db").is_file());
    let log = std::fs::read_to_string(work.path().join("cetera.log")).unwrap();
    // Flags without meaning for cetera are named, once each.
    assert_eq!(
        log.matches("--snapshot-count accepted without effect")
            .count(),
        1,
        "{log}"
    );
    assert!(
        log.contains("--initial-cluster accepted without effect"),
        "{log}"
    );
}

/// The same settings as an EnvironmentFile gives them: ETCD_* variables.
#[tokio::test]
async fn etcd_variables_start_cetera_and_a_flag_with_its_variable_is_refused() {
    let Some(etcd) = etcd_bin() else { return };
    let work = tempfile::tempdir().unwrap();
    let (client, peer) = (free_port(), free_port());
    let data_dir = work.path().join("data");
    let env: Vec<(&str, String)> = vec![
        ("ETCD_NAME", "infra0".into()),
        ("ETCD_DATA_DIR", data_dir.display().to_string()),
        (
            "ETCD_ADVERTISE_CLIENT_URLS",
            format!("http://127.0.0.1:{client}"),
        ),
        ("ETCD_LISTEN_PEER_URLS", format!("http://127.0.0.1:{peer}")),
        (
            "ETCD_INITIAL_ADVERTISE_PEER_URLS",
            format!("http://127.0.0.1:{peer}"),
        ),
        (
            "ETCD_INITIAL_CLUSTER",
            format!("infra0=http://127.0.0.1:{peer}"),
        ),
        ("ETCD_SNAPSHOT_COUNT", "10000".into()),
        ("ETCD_UNRECOGNIZED_THING", "1".into()),
        (
            "ETCD_LISTEN_CLIENT_URLS",
            format!("http://127.0.0.1:{client}"),
        ),
    ];
    serves(cetera_bin(), &[], &env, client, work.path()).await;
    assert!(data_dir.join("cetera/state.db").is_file());
    let log = std::fs::read_to_string(work.path().join("cetera.log")).unwrap();
    assert!(
        log.contains("recognized and used environment variable (variable-name: ETCD_DATA_DIR"),
        "{log}"
    );
    assert!(
        log.contains(
            "unrecognized environment variable (environment-variable: ETCD_UNRECOGNIZED_THING)"
        ),
        "{log}"
    );

    // A flag and its own variable: etcd stops (fatal, exit 1), and so does cetera.
    let conflict = |program: &Path| {
        let out = command(program)
            .args(["--name", "a"])
            .env("ETCD_NAME", "b")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (etcd_code, etcd_text) = conflict(&etcd);
    let (cetera_code, cetera_text) = conflict(cetera_bin());
    assert_eq!(cetera_code, etcd_code);
    let shadowed =
        "conflicting environment variable is shadowed by corresponding command-line flag";
    assert!(etcd_text.contains(shadowed), "{etcd_text}");
    assert!(cetera_text.contains(shadowed), "{cetera_text}");
}

/// etcd's YAML config file: the whole configuration; the command line's
/// other flags are ignored.
#[tokio::test]
async fn an_etcd_config_file_starts_cetera_as_it_starts_etcd() {
    let Some(etcd) = etcd_bin() else { return };
    let work = tempfile::tempdir().unwrap();
    let yaml = |data_dir: &Path, client: u16, peer: u16| {
        format!(
            "name: infra0\n\
             data-dir: {}\n\
             listen-client-urls: http://127.0.0.1:{client}\n\
             advertise-client-urls: http://127.0.0.1:{client}\n\
             listen-peer-urls: http://127.0.0.1:{peer}\n\
             initial-advertise-peer-urls: http://127.0.0.1:{peer}\n\
             initial-cluster: infra0=http://127.0.0.1:{peer}\n\
             initial-cluster-token: etcd-cluster-1\n\
             initial-cluster-state: new\n\
             snapshot-count: 10000\n\
             heartbeat-interval: 100\n\
             election-timeout: 1000\n\
             quota-backend-bytes: 0\n\
             max-request-bytes: 1572864\n\
             enable-v2: false\n\
             auto-compaction-mode: periodic\n\
             auto-compaction-retention: \"1\"\n\
             logger: zap\n\
             log-level: info\n\
             log-outputs: [stderr]\n\
             unsafe-no-fsync: true\n\
             client-transport-security:\n  client-cert-auth: false\n\
             peer-transport-security:\n  client-cert-auth: false\n",
            data_dir.display()
        )
    };
    let (client, peer) = (free_port(), free_port());
    let etcd_yaml = work.path().join("etcd.yaml");
    std::fs::write(
        &etcd_yaml,
        yaml(&work.path().join("etcd-data"), client, peer),
    )
    .unwrap();
    let args = vec![
        format!("--config-file={}", etcd_yaml.display()),
        // Ignored with a config file, by etcd as by cetera.
        "--name=ignored".to_string(),
    ];
    serves(&etcd, &args, &[], client, work.path()).await;

    let (client, peer) = (free_port(), free_port());
    let data_dir = work.path().join("cetera-data");
    let text = yaml(&data_dir, client, peer);
    let cetera_yaml = work.path().join("cetera.yaml");
    std::fs::write(&cetera_yaml, text).unwrap();
    let args = vec![
        format!("--config-file={}", cetera_yaml.display()),
        "--name=ignored".to_string(),
    ];
    serves(cetera_bin(), &args, &[], client, work.path()).await;
    assert!(data_dir.join("cetera/state.db").is_file());
    let log = std::fs::read_to_string(work.path().join("cetera.log")).unwrap();
    assert!(log.contains("loaded server configuration, other configuration command line flags and environment variables will be ignored"), "{log}");
}

/// A flag etcd does not know: etcd's message and usage, etcd's exit code.
#[test]
fn an_unknown_flag_is_refused_with_etcds_message() {
    let Some(etcd) = etcd_bin() else { return };
    for args in [
        &["--no-such-flag"][..],
        &["--no-such-flag=1"],
        &["-data-dirr", "x"],
    ] {
        let run = |program: &Path| {
            let out = command(program).args(args).output().unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        };
        let (cetera_code, cetera_text) = run(cetera_bin());
        let (etcd_code, etcd_text) = run(&etcd);
        assert_eq!(cetera_code, etcd_code, "{args:?}");
        assert_eq!(cetera_text, etcd_text, "{args:?}");
    }
}
