//! `--config FILE`: a program's flags from a TOML file (feature `cli`), so
//! a service unit is a file and not a command line.
//!
//! Each key is a flag's long name (`pcap = "eth0"`, `rcvbuf-max = 8388608`;
//! `_` may stand for `-`), or for a flag with only a short name the name
//! its `--help` gives the value (`count` for uping's `-c`). A switch takes
//! `true` or `false`, a flag with a value a string or a number, a flag
//! that may be repeated a list (`ip = ["10.0.0.2/24", "fd00::2/64"]`) or
//! one value.
//!
//! [`args_with_config_file`] turns the file into flags inserted before the
//! ones of the command line, and leaves out every key the command line
//! sets itself or overrides with a flag that conflicts with it (`--xdp`
//! over a file's `pcap`, `--cores` over its `core`; `--ip` given on the
//! command line replaces the file's whole list). The program's own clap
//! definition then parses the result as it parses a command line: the
//! contract of the flags does not change.
//!
//! Every mistake is refused before anything starts, in one line naming
//! the file and the key ([`ConfigFileError`]): an unknown key, a value of
//! the wrong type, a value the flag's own parser refuses, two keys that
//! conflict, a TOML syntax error (with its line).
//!
//! ```
//! use clap::{CommandFactory, Parser};
//! use ustack_runtime::cli::NetArgs;
//! use ustack_runtime::config_file::{ConfigArg, args_with_config_file};
//!
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     net: NetArgs,
//!     #[command(flatten)]
//!     config: ConfigArg,
//! }
//!
//! let dir = std::env::temp_dir().join(format!("ustack-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let file = dir.join("a.toml");
//! std::fs::write(&file, "pcap = \"eth0\"\nip = [\"10.0.0.2/24\", \"fd00::2/64\"]\n")?;
//! let argv = ["prog", "--config", file.to_str().unwrap(), "--pcap", "eth1"];
//! let cli = Cli::parse_from(args_with_config_file(&Cli::command(), argv)?);
//! assert_eq!(cli.net.pcap.as_deref(), Some("eth1")); // the command line wins
//! assert_eq!(cli.net.ips.len(), 2);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::{Arg, ArgAction, Command};

/// `--config FILE`, for a program's clap definition (`#[command(flatten)]`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ConfigArg {
    /// Read flags from this TOML file: keys are the long flag names
    /// (`pcap = "eth0"`, `ip = ["10.0.0.2/24", "fd00::2/64"]`, `sim = true`);
    /// flags on the command line override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Why a config file was refused: each says the file, and the key where
/// one is at fault, in one line.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    /// The file cannot be read.
    #[error("config {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("config {}: line {line}: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// The line (from 1).
        line: usize,
        /// The TOML parser's words.
        message: String,
    },
    /// A key that is no flag of the program.
    #[error("config {}: unknown key '{key}' (the keys are the long flags of `{program} --help`)", path.display())]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key as written.
        key: String,
        /// The program (and subcommand) the file is for.
        program: String,
    },
    /// A key whose value is of the wrong type or refused by the flag.
    #[error("config {}: key '{key}': {what}", path.display())]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key as written.
        key: String,
        /// What is wrong.
        what: String,
    },
    /// Two keys that cannot be used together (two backends).
    #[error("config {}: keys '{first}' and '{second}' cannot be used together", path.display())]
    Conflict {
        /// The file.
        path: PathBuf,
        /// One key.
        first: String,
        /// The other.
        second: String,
    },
}

/// `args` (a command line, program name first) with the flags of the
/// `--config FILE` it names inserted before its own flags (after the
/// subcommand's name, for a program with subcommands), leaving out what the
/// command line sets. Without `--config`, or for a (sub)command that has no
/// `config` flag, `args` comes back as it was.
pub fn args_with_config_file<I, T>(cmd: &Command, args: I) -> Result<Vec<OsString>, ConfigFileError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString>,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let mut cmd = cmd.clone();
    cmd.build();
    // The subcommand the flags belong to, and where its flags start.
    let mut path = vec![cmd.get_name().to_string()];
    let mut at = 1;
    let mut sub = &cmd;
    while sub.has_subcommands() {
        let Some(i) = (at..args.len()).find(|&i| !args[i].to_string_lossy().starts_with('-'))
        else {
            break;
        };
        match sub.find_subcommand(&args[i]) {
            Some(s) => {
                sub = s;
                path.push(s.get_name().to_string());
                at = i + 1;
            }
            None => break,
        }
    }
    if !sub.get_arguments().any(|a| a.get_id() == "config") {
        return Ok(args);
    }
    let own: Vec<&OsStr> = args[at..]
        .iter()
        .map(OsString::as_os_str)
        .take_while(|a| *a != "--")
        .collect();
    let mut file = None;
    for (i, a) in own.iter().enumerate() {
        let a = a.to_string_lossy();
        if a == "--config" {
            file = own.get(i + 1).map(PathBuf::from);
        } else if let Some(f) = a.strip_prefix("--config=") {
            file = Some(PathBuf::from(f));
        }
    }
    let Some(file) = file else {
        return Ok(args);
    };
    let given = given_on_command_line(sub, &own);
    let from_file = file_args(sub, &path.join(" "), &file, &given)?;
    let mut out = args[..at].to_vec();
    out.extend(from_file);
    out.extend_from_slice(&args[at..]);
    Ok(out)
}

/// The ids of the arguments `own` (a command line's flags) sets: options
/// by long or short name, and positionals in order.
fn given_on_command_line(cmd: &Command, own: &[&OsStr]) -> HashSet<String> {
    let mut given = HashSet::new();
    let mut positionals = cmd.get_positionals();
    let mut i = 0;
    while i < own.len() {
        let word = own[i].to_string_lossy();
        i += 1;
        if let Some(long) = word.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, _)) => (n, true),
                None => (long, false),
            };
            let arg = cmd.get_arguments().find(|a| {
                a.get_long() == Some(name)
                    || a.get_all_aliases().is_some_and(|al| al.contains(&name))
            });
            if let Some(arg) = arg {
                given.insert(arg.get_id().to_string());
                if !inline && takes_value(arg) && !optional_value(arg) {
                    i += 1;
                }
            }
        } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            for (n, c) in shorts.char_indices() {
                let Some(arg) = cmd.get_arguments().find(|a| a.get_short() == Some(c)) else {
                    break;
                };
                given.insert(arg.get_id().to_string());
                if takes_value(arg) {
                    // The value is the rest of the word, or the next word.
                    if n + c.len_utf8() == shorts.len() {
                        i += 1;
                    }
                    break;
                }
            }
        } else if let Some(p) = positionals.next() {
            given.insert(p.get_id().to_string());
        }
    }
    given
}

/// Whether `arg` takes a value (not a switch).
fn takes_value(arg: &Arg) -> bool {
    matches!(arg.get_action(), ArgAction::Set | ArgAction::Append)
}

/// Whether `arg`'s value may be left out (`--rdma` alone).
fn optional_value(arg: &Arg) -> bool {
    arg.get_num_args().is_some_and(|n| n.min_values() == 0)
}

/// The flag a key names: its long name, or for a flag with only a short
/// name its id; never a positional, `--help`, `--version` or `--config`.
fn find_key<'c>(cmd: &'c Command, key: &str) -> Option<&'c Arg> {
    let long = key.replace('_', "-");
    let id = key.replace('-', "_");
    cmd.get_arguments().find(|a| {
        !a.is_positional()
            && !matches!(a.get_id().as_str(), "help" | "version" | "config")
            && (a.get_long() == Some(long.as_str())
                || (a.get_long().is_none() && a.get_id().as_str() == id))
    })
}

/// The flags of `file` for `cmd`, without those in `given`.
fn file_args(
    cmd: &Command,
    program: &str,
    file: &Path,
    given: &HashSet<String>,
) -> Result<Vec<OsString>, ConfigFileError> {
    let text = std::fs::read_to_string(file).map_err(|source| ConfigFileError::Read {
        path: file.to_path_buf(),
        source,
    })?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let line = e.span().map_or(1, |s| {
            text[..s.start.min(text.len())].matches('\n').count() + 1
        });
        ConfigFileError::Syntax {
            path: file.to_path_buf(),
            line,
            message: e.message().trim().to_string(),
        }
    })?;
    let bad = |key: &str, what: String| ConfigFileError::BadValue {
        path: file.to_path_buf(),
        key: key.to_string(),
        what,
    };
    let mut keys: Vec<(&String, &Arg)> = Vec::new();
    for key in table.keys() {
        if key == "config" {
            return Err(bad(key, "a config file cannot name another one".into()));
        }
        let arg = find_key(cmd, key).ok_or_else(|| ConfigFileError::UnknownKey {
            path: file.to_path_buf(),
            key: key.to_string(),
            program: program.to_string(),
        })?;
        if let Some((other, _)) = keys.iter().find(|(_, a)| a.get_id() == arg.get_id()) {
            return Err(bad(key, format!("set twice (also as '{other}')")));
        }
        keys.push((key, arg));
    }
    for (i, (k1, a1)) in keys.iter().enumerate() {
        let conflicts = cmd.get_arg_conflicts_with(a1);
        for (k2, a2) in &keys[i + 1..] {
            if conflicts.iter().any(|c| c.get_id() == a2.get_id()) {
                return Err(ConfigFileError::Conflict {
                    path: file.to_path_buf(),
                    first: k1.to_string(),
                    second: k2.to_string(),
                });
            }
        }
    }
    let mut out = Vec::new();
    for (key, arg) in keys {
        let overridden = given.contains(arg.get_id().as_str())
            || cmd
                .get_arg_conflicts_with(arg)
                .iter()
                .any(|c| given.contains(c.get_id().as_str()));
        let value = &table[key.as_str()];
        let values: Vec<String> = match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse => match value {
                toml::Value::Boolean(on) => {
                    let on = *on == matches!(arg.get_action(), ArgAction::SetTrue);
                    if on && !overridden {
                        out.push(flag(arg));
                    }
                    continue;
                }
                v => return Err(bad(key, format!("true or false, not {}", kind(v)))),
            },
            ArgAction::Count => match value {
                toml::Value::Integer(n @ 0..=255) => {
                    if !overridden {
                        out.extend((0..*n).map(|_| flag(arg)));
                    }
                    continue;
                }
                v => return Err(bad(key, format!("a count from 0 to 255, not {}", kind(v)))),
            },
            ArgAction::Append => match value {
                toml::Value::Array(items) => items
                    .iter()
                    .map(|v| scalar(v).ok_or_else(|| bad(key, list_items(v))))
                    .collect::<Result<_, _>>()?,
                v => vec![scalar(v).ok_or_else(|| bad(key, one_value(v, true)))?],
            },
            ArgAction::Set => vec![scalar(value).ok_or_else(|| bad(key, one_value(value, false)))?],
            _ => return Err(bad(key, "cannot be set in a config file".into())),
        };
        for v in &values {
            check_value(cmd, arg, v).map_err(|what| bad(key, what))?;
        }
        if overridden {
            continue;
        }
        for v in values {
            match arg.get_long() {
                // `=` keeps a value that starts with `-` (EAL arguments) a value.
                Some(long) => out.push(format!("--{long}={v}").into()),
                None => {
                    out.push(flag(arg));
                    out.push(v.into());
                }
            }
        }
    }
    Ok(out)
}

/// The flag's name on a command line.
fn flag(arg: &Arg) -> OsString {
    match (arg.get_long(), arg.get_short()) {
        (Some(l), _) => format!("--{l}").into(),
        (None, Some(s)) => format!("-{s}").into(),
        (None, None) => arg.get_id().to_string().into(),
    }
}

/// A string or a number as the flag's words.
fn scalar(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    }
}

/// A TOML value's type, for messages.
fn kind(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a number",
        toml::Value::Boolean(_) => "true or false",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
    }
}

fn one_value(v: &toml::Value, list_ok: bool) -> String {
    let or_list = if list_ok { " (or a list of them)" } else { "" };
    let hint = match v {
        toml::Value::Array(_) => ": this flag takes one value",
        toml::Value::Boolean(_) => ": this flag takes a value, it is not a switch",
        _ => "",
    };
    format!("a string or a number{or_list}, not {}{hint}", kind(v))
}

fn list_items(v: &toml::Value) -> String {
    format!("a list of strings or numbers, with {} in it", kind(v))
}

/// `value` through the flag's own parser (the command parsing that flag
/// alone), its refusal in its own words.
fn check_value(cmd: &Command, arg: &Arg, value: &str) -> Result<(), String> {
    use clap::error::ErrorKind;
    let words: Vec<OsString> = match arg.get_long() {
        Some(long) => vec![cmd.get_name().into(), format!("--{long}={value}").into()],
        None => vec![cmd.get_name().into(), flag(arg), value.into()],
    };
    let Err(e) = cmd.clone().try_get_matches_from(words) else {
        return Ok(());
    };
    // Only the value matters here: what else is missing is the whole
    // command line's business.
    match e.kind() {
        ErrorKind::ValueValidation | ErrorKind::InvalidUtf8 => {
            match std::error::Error::source(&e) {
                Some(source) => Err(format!("'{value}': {source}")),
                None => Err(format!("'{value}' is not a valid value")),
            }
        }
        ErrorKind::InvalidValue => {
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|p| !p.is_hide_set())
                .map(|p| p.get_name().to_string())
                .collect();
            Err(format!("'{value}' is not one of {}", possible.join(", ")))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use crate::cli::NetArgs;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug)]
    #[command(name = "prog")]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(clap::Subcommand, Debug)]
    #[allow(clippy::large_enum_variant)]
    enum Cmd {
        Run(RunArgs),
        Other {
            #[arg(long)]
            x: Option<u32>,
        },
    }

    #[derive(clap::Args, Debug)]
    struct RunArgs {
        #[command(flatten)]
        net: NetArgs,
        #[command(flatten)]
        config: ConfigArg,
        /// A short-only flag.
        #[arg(short = 'c', value_name = "COUNT")]
        count: Option<u64>,
        #[arg(long)]
        tui: bool,
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        host: Option<String>,
    }

    #[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
    enum Mode {
        Ud,
        Rc,
    }

    /// A config file in a directory of its own, removed on drop.
    struct File(PathBuf, PathBuf);

    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn file(text: &str) -> File {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ustack-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.toml");
        std::fs::write(&path, text).unwrap();
        File(dir, path)
    }

    fn args(f: &File, rest: &[&str]) -> Result<Vec<OsString>, ConfigFileError> {
        let mut argv = vec!["prog", "run", "--config", f.1.to_str().unwrap()];
        argv.extend(rest);
        args_with_config_file(&Cli::command(), argv)
    }

    fn run(f: &File, rest: &[&str]) -> RunArgs {
        match Cli::try_parse_from(args(f, rest).unwrap()).unwrap().cmd {
            Cmd::Run(r) => r,
            Cmd::Other { .. } => unreachable!(),
        }
    }

    fn error(text: &str) -> String {
        let f = file(text);
        let e = args(&f, &[]).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("config {}: ", f.1.display())),
            "names the file: {e}"
        );
        assert!(!e.contains('\n'), "one line: {e}");
        e[format!("config {}: ", f.1.display()).len()..].to_string()
    }

    #[test]
    fn keys_become_flags() {
        let f = file(
            "pcap = \"eth0\"\nip = [\"10.0.0.2/24\", \"fd00::2/64\"]\ngw = \"10.0.0.1\"\n\
             mac = \"02:00:00:00:00:09\"\ncore = 1\ntelemetry = \"/run/ustack/a.sock\"\n\
             metrics = \"127.0.0.1:9464\"\nrcvbuf_max = 8388608\ntui = true\nslaac = false\n\
             count = 3\nmode = \"rc\"\n",
        );
        let r = run(&f, &[]);
        assert_eq!(r.net.pcap.as_deref(), Some("eth0"));
        let ips: Vec<String> = r.net.ips.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.0.0.2/24", "fd00::2/64"]);
        assert_eq!(r.net.gw, ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]);
        assert_eq!(r.net.mac.unwrap().0, [2, 0, 0, 0, 0, 9]);
        assert_eq!(r.net.core, Some(1));
        assert_eq!(r.net.rcvbuf_max, 8 << 20);
        assert!(r.tui && !r.net.slaac);
        assert_eq!((r.count, r.mode), (Some(3), Some(Mode::Rc)));
        assert_eq!(r.config.config.as_deref(), Some(f.1.as_path()));
        // A single value for a repeatable flag.
        let r = run(&file("pcap = \"eth0\"\nip = \"10.0.0.2/24\""), &[]);
        assert_eq!(r.net.ips.len(), 1);
    }

    #[test]
    fn the_command_line_overrides_the_file() {
        let f = file(
            "pcap = \"eth0\"\nip = [\"10.0.0.2/24\", \"fd00::2/64\"]\ncore = 1\ncount = 3\n\
             dpdk-mbufs = 100\n",
        );
        // Same flag: the command line's value, not a second one.
        let r = run(&f, &["--pcap", "eth1", "-c5"]);
        assert_eq!(r.net.pcap.as_deref(), Some("eth1"));
        assert_eq!(r.count, Some(5));
        // A repeatable flag on the command line replaces the file's list.
        let r = run(&f, &["--ip=10.9.9.9/8"]);
        let ips: Vec<String> = r.net.ips.iter().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.9.9.9/8"]);
        // A conflicting flag on the command line drops the file's key.
        let r = run(&f, &["--xdp", "eth2:1"]);
        assert_eq!(r.net.pcap, None);
        assert_eq!(r.net.xdp, Some(("eth2".into(), 1)));
        // Flags after `--config` and before it, a positional, and `--` all
        // leave the file's other keys alone.
        let argv = [
            "prog",
            "run",
            "--tui",
            "--config",
            f.1.to_str().unwrap(),
            "host1",
        ];
        let full = args_with_config_file(&Cli::command(), argv).unwrap();
        let Cmd::Run(r) = Cli::try_parse_from(full).unwrap().cmd else {
            unreachable!()
        };
        assert_eq!(r.host.as_deref(), Some("host1"));
        assert_eq!((r.net.core, r.count, r.tui), (Some(1), Some(3), true));
        // Without --config, or for a subcommand without it, nothing changes.
        let plain = ["prog", "other", "--x", "1"];
        assert_eq!(
            args_with_config_file(&Cli::command(), plain).unwrap(),
            plain.map(OsString::from)
        );
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert_eq!(
            error("pcapp = \"eth0\""),
            "unknown key 'pcapp' (the keys are the long flags of `prog run --help`)"
        );
        // Positionals and the file itself are no keys.
        assert!(error("host = \"x\"").starts_with("unknown key 'host'"));
        assert!(error("help = true").starts_with("unknown key 'help'"));
        assert_eq!(
            error("config = \"other.toml\""),
            "key 'config': a config file cannot name another one"
        );
        // A section is a key too.
        assert!(error("[net]\npcap = \"eth0\"").starts_with("unknown key 'net'"));
    }

    #[test]
    fn wrong_types_and_values_are_refused() {
        assert_eq!(
            error("tui = \"yes\""),
            "key 'tui': true or false, not a string"
        );
        assert_eq!(
            error("pcap = [\"eth0\", \"eth1\"]"),
            "key 'pcap': a string or a number, not a list: this flag takes one value"
        );
        assert_eq!(
            error("pcap = true"),
            "key 'pcap': a string or a number, not true or false: this flag takes a value, it is not a switch"
        );
        assert_eq!(
            error("ip = [\"10.0.0.2/24\", 5.5, {a = 1}]"),
            "key 'ip': a list of strings or numbers, with a table in it"
        );
        assert_eq!(
            error("ip = \"10.0.0.300/24\""),
            "key 'ip': '10.0.0.300/24': '10.0.0.300' is not an IPv4 address"
        );
        assert!(error("core = \"two\"").starts_with("key 'core': 'two': invalid digit"));
        assert_eq!(
            error("mode = \"xx\""),
            "key 'mode': 'xx' is not one of ud, rc"
        );
        assert_eq!(
            error("mtu = 100"),
            "key 'mtu': '100': 100 is not in 576..=9000"
        );
        assert_eq!(
            error("pcap = \"a\"\nxdp = \"b\""),
            "keys 'pcap' and 'xdp' cannot be used together"
        );
        assert_eq!(
            error("rcvbuf-max = 1\nrcvbuf_max = 2"),
            "key 'rcvbuf_max': set twice (also as 'rcvbuf-max')"
        );
        assert!(error("pcap = \"eth0\"\nip = ").starts_with("line 2: "));
        let missing = Path::new("/nonexistent/ustack.toml");
        let e = args_with_config_file(
            &Cli::command(),
            ["prog", "run", "--config", missing.to_str().unwrap()],
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("config /nonexistent/ustack.toml: No such file")
        );
    }
}
