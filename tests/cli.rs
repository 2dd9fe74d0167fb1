//! The command line as users read it: `--help` texts.

use std::process::Command;

/// The help text of `cetera ARGS... --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cetera"))
        .args(args)
        .arg("--help")
        .output()
        .expect("run cetera --help");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

/// The lines of `text` from the one naming `flag` up to the next flag.
fn flag_help<'a>(text: &'a str, flag: &str) -> String {
    let mut lines = text
        .lines()
        .skip_while(|line| !line.trim_start().starts_with(flag));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {flag} in:\n{text}"));
    let rest = lines.take_while(|line: &&'a str| !line.trim_start().starts_with('-'));
    std::iter::once(first)
        .chain(rest)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn endpoint_help_names_every_datastore() {
    let endpoint = flag_help(&help(&[]), "--endpoint");
    for scheme in ["sqlite://", "postgres://", "mysql://"] {
        assert!(endpoint.contains(scheme), "{scheme} missing:\n{endpoint}");
    }
}

/// migrate takes its datastores from --from and --to: --endpoint is not its flag.
#[test]
fn migrate_help_has_no_endpoint() {
    let migrate = help(&["migrate"]);
    assert!(migrate.contains("--from"), "{migrate}");
    assert!(migrate.contains("--datastore-cafile"), "{migrate}");
    let is_flag = |line: &str, flag: &str| line.trim_start().starts_with(flag);
    assert!(
        !migrate.lines().any(|line| is_flag(line, "--endpoint")),
        "{migrate}"
    );
    // restore does use it.
    let restore = help(&["restore"]);
    assert!(
        restore.lines().any(|line| is_flag(line, "--endpoint")),
        "{restore}"
    );
}
