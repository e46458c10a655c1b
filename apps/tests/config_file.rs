//! `--config FILE` on the real command lines: the example settings the
//! Debian package ships (packaging/etc/) are accepted by `ustack run` and
//! `uping` and mean what they say, a command-line flag overrides a key,
//! and a bad file stops the binary with one line and status 2.

use std::path::PathBuf;
use std::process::Command;

use clap::{CommandFactory, Parser};
use ustack_runtime::config_file::args_with_config_file;

fn packaging(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/etc")
        .join(file)
}

#[test]
fn the_shipped_examples_are_accepted() {
    use ustack_apps::cli::{uping, ustack};
    let example = packaging("example.toml");
    let argv = args_with_config_file(
        &ustack::Cli::command(),
        [
            "ustack".as_ref(),
            "run".as_ref(),
            "--config".as_ref(),
            example.as_os_str(),
        ],
    )
    .unwrap();
    let ustack::Cmd::Run(run) = ustack::Cli::try_parse_from(argv).unwrap().cmd else {
        panic!("not run");
    };
    assert_eq!(run.net.pcap.as_deref(), Some("eth0"));
    assert_eq!(run.net.ip().unwrap().to_string(), "192.0.2.50/24");
    assert_eq!(
        run.net.telemetry.as_deref(),
        Some("/run/ustack/example/telemetry.sock".as_ref())
    );

    let mesh = packaging("mesh.toml");
    let argv = args_with_config_file(
        &uping::Cli::command(),
        [
            "uping".as_ref(),
            "--config".as_ref(),
            mesh.as_os_str(),
            "--rate".as_ref(),
            "50".as_ref(),
        ],
    )
    .unwrap();
    let cli = uping::Cli::try_parse_from(argv).unwrap();
    cli.check().unwrap();
    assert_eq!(cli.pinglist.as_deref(), Some("/etc/ustack/pinglist.txt"));
    assert_eq!(
        (cli.rate, cli.duration, cli.timeout),
        (50.0, 0.0, Some(2.0))
    );
    assert_eq!(cli.net.metrics, Some("0.0.0.0:9464".parse().unwrap()));
}

#[test]
fn uperf_takes_a_config_file() {
    use ustack_apps::cli::uperf;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("server.toml");
    std::fs::write(
        &file,
        "server = true\none-off = true\npcap = \"lo\"\nip = \"10.0.0.2/24\"\n",
    )
    .unwrap();
    let argv = args_with_config_file(
        &uperf::Cli::command(),
        [
            "uperf".as_ref(),
            "--config".as_ref(),
            file.as_os_str(),
            "-p".as_ref(),
            "5202".as_ref(),
        ],
    )
    .unwrap();
    let cli = uperf::parse_args(argv).unwrap();
    assert!(cli.server && cli.one_off);
    assert_eq!(cli.port, Some(5202));
}

#[test]
fn a_bad_file_is_one_line_and_status_2() {
    let dir = tempfile::tempdir().unwrap();
    for (bin, args, text, said) in [
        (
            env!("CARGO_BIN_EXE_ustack"),
            &["run"][..],
            "pcap = \"eth0\"\nipp = \"10.0.0.2/24\"\n",
            "unknown key 'ipp' (the keys are the long flags of `ustack run --help`)",
        ),
        (
            env!("CARGO_BIN_EXE_uping"),
            &[][..],
            "pinglist = \"x\"\nrate = \"fast\"\n",
            "key 'rate': 'fast': 'fast' is not a rate from 0.1 to 10000000 per second",
        ),
        (
            env!("CARGO_BIN_EXE_uperf"),
            &[][..],
            "server = \"yes\"\n",
            "key 'server': true or false, not a string",
        ),
    ] {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).unwrap();
        let out = Command::new(bin)
            .args(args)
            .arg("--config")
            .arg(&file)
            .output()
            .unwrap();
        let name = std::path::Path::new(bin)
            .file_name()
            .unwrap()
            .to_string_lossy();
        assert_eq!(out.status.code(), Some(2), "{bin}");
        assert_eq!(
            String::from_utf8_lossy(&out.stderr),
            format!("{name}: config {}: {said}\n", file.display())
        );
    }
}
