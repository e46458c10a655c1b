//! What `tools/prometheus/` ships, checked with Prometheus' own `promtool`:
//! the scrape config and the rules load, the rules' unit tests pass, the
//! Grafana dashboard is well-formed and every PromQL expression in it
//! parses, and every `ustack_*` name the rules and the dashboard use is one
//! of README.md's. Each check is also run on a broken copy, which it must
//! reject. Skips with the reason when promtool is missing (Debian's
//! `prometheus` package has it).

#[macro_use]
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/prometheus")
}

fn read(name: &str) -> String {
    let p = dir().join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `promtool ARGS`: Ok(output) when it succeeds, Err(output) when not.
fn promtool(args: &[&str]) -> Result<String, String> {
    let out = Command::new("promtool")
        .args(args)
        .output()
        .expect("run promtool");
    let text = format!(
        "promtool {}: {}\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn check_config(path: &Path) -> Result<String, String> {
    promtool(&["check", "config", path_str(path)])
}

fn check_rules(path: &Path) -> Result<String, String> {
    promtool(&["check", "rules", path_str(path)])
}

fn test_rules(path: &Path) -> Result<String, String> {
    promtool(&["test", "rules", path_str(path)])
}

/// Grafana's own variables, replaced by a range for the parser.
const GRAFANA_RANGES: [&str; 3] = ["__rate_interval", "__interval", "__range"];

/// Every PromQL expression of a dashboard, with where it is: the panels'
/// (and rows' nested panels') `targets[].expr`, and the selector inside
/// each query variable's `label_values(SELECTOR, label)`.
fn dashboard_exprs(dash: &Value) -> Vec<(String, String)> {
    fn panels<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            panels(&p["panels"], out);
        }
    }
    let mut all = Vec::new();
    panels(&dash["panels"], &mut all);
    let mut exprs = Vec::new();
    for p in all {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                let at = format!("panel '{}' target {}", p["title"], t["refId"]);
                exprs.push((at, e.to_string()));
            }
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]
            .as_str()
            .or_else(|| v["query"]["query"].as_str())
            .unwrap_or_default();
        // label_values(SELECTOR, label): the selector is an expression.
        if let Some(args) = q
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
            && let Some((sel, _label)) = args.rsplit_once(',')
        {
            exprs.push((format!("variable {}", v["name"]), sel.trim().to_string()));
        }
    }
    exprs
}

/// `expr` with the dashboard's variables replaced as Grafana would
/// interpolate them (`.*` for a label regex, `5m` for a range); an
/// undefined variable is an error.
fn substitute(expr: &str, vars: &BTreeSet<String>) -> Result<String, String> {
    let re = regex::Regex::new(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|\$([A-Za-z_][A-Za-z0-9_]*)|\[\[([A-Za-z_][A-Za-z0-9_]*)\]\]").unwrap();
    let mut err = None;
    let out = re.replace_all(expr, |c: &regex::Captures| {
        let name = c
            .get(1)
            .or_else(|| c.get(2))
            .or_else(|| c.get(3))
            .unwrap()
            .as_str();
        if GRAFANA_RANGES.contains(&name) {
            "5m".to_string()
        } else if vars.contains(name) {
            ".*".to_string()
        } else {
            err = Some(format!("undefined variable ${name} in {expr}"));
            String::new()
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(out.into_owned()),
    }
}

/// Metric names (`ustack_...`, no colon: recording rules have colons) in a
/// text.
fn ustack_names(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"[A-Za-z0-9_:]*ustack_[A-Za-z0-9_:]*").unwrap();
    re.find_iter(text)
        .map(|m| m.as_str())
        .filter(|n| n.starts_with("ustack_") && !n.contains(':'))
        .map(str::to_string)
        .collect()
}

/// README.md's names, from the first column of its tables: exact names,
/// and patterns for families written with a `*` (`ustack_arp_*`,
/// `ustack_shard_*_total`).
fn readme_names() -> (BTreeSet<String>, Vec<regex::Regex>) {
    let readme = read("README.md");
    let re = regex::Regex::new(r"`(ustack_[a-z0-9_*]*)`").unwrap();
    let (mut exact, mut families) = (BTreeSet::new(), Vec::new());
    for row in readme.lines().filter(|l| l.starts_with('|')) {
        let first = row.split('|').nth(1).unwrap_or_default();
        for c in re.captures_iter(first) {
            let name = &c[1];
            if !name.contains('*') {
                exact.insert(name.to_string());
            } else if name != "ustack_*" {
                let pattern = format!("^{}$", name.replace('*', "[a-z0-9_]+"));
                families.push(regex::Regex::new(&pattern).unwrap());
            }
        }
    }
    assert!(
        exact.contains("ustack_mesh_rtt_seconds") && exact.contains("ustack_pool_buffers"),
        "README.md's names tables did not parse: {exact:?}"
    );
    (exact, families)
}

/// The names in `text` that README.md does not define (a histogram's
/// `_bucket`, `_sum` and `_count` series count as its name).
fn unknown_names(text: &str) -> Vec<String> {
    let (exact, families) = readme_names();
    ustack_names(text)
        .into_iter()
        .filter(|n| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| n.strip_suffix(s))
                .unwrap_or(n);
            !(exact.contains(n.as_str())
                || exact.contains(base)
                || families.iter().any(|f| f.is_match(n)))
        })
        .collect()
}

/// The dashboard check: well-formed JSON of a Grafana dashboard whose
/// panels all use the `datasource` variable, whose variables are defined,
/// whose metric names are README.md's, and whose every expression parses
/// (each put as a recording rule in a rules file for `promtool check
/// rules`). Ok(number of expressions checked).
fn check_dashboard(path: &Path) -> Result<usize, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let dash: Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))?;
    for key in ["title", "uid", "panels", "templating", "schemaVersion"] {
        if dash.get(key).is_none() {
            return Err(format!("no '{key}' in the dashboard"));
        }
    }
    let vars: BTreeSet<String> = dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    if !dash["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| {
            v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"
        })
    {
        return Err("no Prometheus `datasource` variable".into());
    }
    // Every panel and query on the templated data source; ids unique.
    let mut ids = BTreeSet::new();
    let mut stack: Vec<&Value> = dash["panels"].as_array().into_iter().flatten().collect();
    while let Some(p) = stack.pop() {
        stack.extend(p["panels"].as_array().into_iter().flatten());
        if !ids.insert(p["id"].to_string()) {
            return Err(format!("panel id {} used twice", p["id"]));
        }
        if p["gridPos"]["w"].as_u64().is_none() {
            return Err(format!("panel '{}' has no gridPos", p["title"]));
        }
        if let Some(r) = p["repeat"].as_str()
            && !vars.contains(r)
        {
            return Err(format!("panel '{}' repeats by undefined ${r}", p["title"]));
        }
        if p["type"] == "row" {
            continue;
        }
        let mut sources = vec![&p["datasource"]];
        sources.extend(
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| &t["datasource"]),
        );
        if sources.iter().any(|d| d["uid"] != "${datasource}") {
            return Err(format!(
                "panel '{}' does not use the ${{datasource}} variable",
                p["title"]
            ));
        }
    }
    let exprs = dashboard_exprs(&dash);
    if exprs.is_empty() {
        return Err("no expressions in the dashboard".into());
    }
    let all: String = exprs.iter().map(|(_, e)| format!("{e}\n")).collect();
    let unknown = unknown_names(&all);
    if !unknown.is_empty() {
        return Err(format!("names not in README.md: {unknown:?}"));
    }
    // One recording rule per expression; JSON is YAML.
    let mut rules = Vec::new();
    for (i, (at, e)) in exprs.iter().enumerate() {
        let expr = substitute(e, &vars).map_err(|err| format!("{at}: {err}"))?;
        rules.push(serde_json::json!({"record": format!("dashboard_expr_{i}"), "expr": expr}));
    }
    let file = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
    let rules_path = tmp.path().join("dashboard-exprs.yml");
    std::fs::write(&rules_path, serde_json::to_string_pretty(&file).unwrap())
        .map_err(|e| e.to_string())?;
    check_rules(&rules_path).map_err(|out| {
        let list: String = exprs
            .iter()
            .enumerate()
            .map(|(i, (at, e))| format!("  dashboard_expr_{i}: {at}: {e}\n"))
            .collect();
        format!("{out}\nthe expressions:\n{list}")
    })?;
    Ok(exprs.len())
}

#[test]
fn prometheus_config_is_valid() {
    need_program!("promtool", "prometheus");
    let out = check_config(&dir().join("prometheus.yml")).unwrap_or_else(|e| panic!("{e}"));
    // It loads rules.yml (relative to the config) and checks it too.
    assert!(out.contains("1 rule files found"), "{out}");
}

#[test]
fn rules_are_valid() {
    need_program!("promtool", "prometheus");
    let out = check_rules(&dir().join("rules.yml")).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn rules_unit_tests_pass() {
    need_program!("promtool", "prometheus");
    test_rules(&dir().join("rules_test.yml")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_alert_has_a_unit_test_and_every_recording_rule_an_eval() {
    let rules = read("rules.yml");
    let tests = read("rules_test.yml");
    let re = regex::Regex::new(r"(?m)^\s*- (alert|record): (\S+)").unwrap();
    let mut seen = 0;
    for c in re.captures_iter(&rules) {
        seen += 1;
        let name = &c[2];
        let needle = if &c[1] == "alert" {
            format!("alertname: {name}\n")
        } else {
            format!("expr: {name}")
        };
        assert!(
            tests.contains(&needle),
            "rules_test.yml has no case for {} {name}",
            &c[1]
        );
    }
    assert!(seen >= 10, "only {seen} rules found in rules.yml");
}

#[test]
fn rules_use_the_readme_names() {
    let unknown = unknown_names(&read("rules.yml"));
    assert!(unknown.is_empty(), "names not in README.md: {unknown:?}");
}

#[test]
fn dashboard_is_well_formed_and_every_expr_parses() {
    need_program!("promtool", "prometheus");
    let n =
        check_dashboard(&dir().join("grafana-dashboard.json")).unwrap_or_else(|e| panic!("{e}"));
    assert!(n >= 15, "only {n} expressions");
}

/// Copy `names` of tools/prometheus into a temp dir, `name` changed by
/// replacing `from` (which must be there once) with `to`.
fn broken_copy(names: &[&str], name: &str, from: &str, to: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for n in names {
        let mut text = read(n);
        if *n == name {
            assert_eq!(text.matches(from).count(), 1, "'{from}' once in {name}");
            text = text.replace(from, to);
        }
        std::fs::write(tmp.path().join(n), text).unwrap();
    }
    tmp
}

#[test]
fn every_check_rejects_a_broken_copy() {
    need_program!("promtool", "prometheus");
    // The config: a malformed duration.
    let t = broken_copy(
        &["prometheus.yml", "rules.yml"],
        "prometheus.yml",
        "scrape_interval: 5s",
        "scrape_interval: 5 seconds",
    );
    let e = check_config(&t.path().join("prometheus.yml")).expect_err("a bad duration must fail");
    assert!(e.contains("5 seconds"), "{e}");
    // The config: a rules file that does not parse fails the config too.
    let t = broken_copy(
        &["prometheus.yml", "rules.yml"],
        "rules.yml",
        "rate(ustack_mesh_probes_received_total[1m]) > 0",
        "rate(ustack_mesh_probes_received_total[1m] > 0",
    );
    check_config(&t.path().join("prometheus.yml")).expect_err("a broken rules file must fail");
    // The rules: a syntax error.
    let e = check_rules(&t.path().join("rules.yml")).expect_err("a syntax error must fail");
    assert!(e.contains("parse error"), "{e}");
    // The unit tests: a changed loss threshold makes MeshTargetLoss's case fail.
    let t = broken_copy(
        &["rules.yml", "rules_test.yml"],
        "rules.yml",
        "          > 0.01\n",
        "          > 0.1\n",
    );
    let e =
        test_rules(&t.path().join("rules_test.yml")).expect_err("a changed threshold must fail");
    assert!(e.contains("MeshTargetLoss"), "{e}");
    // The dashboard: an expression that does not parse, a name README.md
    // does not have, an undefined variable, JSON cut short.
    let dash = read("grafana-dashboard.json");
    let broken = [
        (
            "sum by (instance, reason) (rate(ustack_drops_total",
            "sum by (instance, reason) (rate(ustack_drops_total{{",
            "parse error",
        ),
        (
            "ustack_drops_total{",
            "ustack_dropped_frames_total{",
            "names not in README.md",
        ),
        (
            "[$__rate_interval])) > 0",
            "[$window])) > 0",
            "undefined variable $window",
        ),
    ];
    for (from, to, why) in broken {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("grafana-dashboard.json");
        assert_eq!(
            dash.matches(from).count(),
            1,
            "'{from}' once in the dashboard"
        );
        std::fs::write(&p, dash.replace(from, to)).unwrap();
        let e = check_dashboard(&p).expect_err(why);
        assert!(e.contains(why), "expected '{why}': {e}");
    }
    let t = tempfile::tempdir().unwrap();
    let p = t.path().join("grafana-dashboard.json");
    std::fs::write(&p, &dash[..dash.len() / 2]).unwrap();
    let e = check_dashboard(&p).expect_err("cut JSON must fail");
    assert!(e.contains("not JSON"), "{e}");
}
