//! A real Prometheus server scraping ustack mesh agents, in namespaces the
//! test makes and removes itself (tools/netns.sh's pair, plus a second
//! veth pair as the management network):
//!
//! ```text
//!  TAG-linux                                  TAG-stack
//!   TAG-l (data; the kernel's 10.77.0.1) ==== TAG-s (data; no kernel address)
//!     agent A: uping 10.77.0.3, --impair        agent B: uping 10.77.0.2
//!       --metrics 127.0.0.1:9464                  --metrics 10.77.1.2:9464
//!                                              ustack run 10.77.0.5
//!                                                --metrics 10.77.1.2:9465
//!   TAG-ml (management, 10.77.1.1) ========== TAG-ms (management, 10.77.1.2)
//!   prometheus on 127.0.0.1:9090, scraping all three every second,
//!   with tools/prometheus/rules.yml loaded
//! ```
//!
//! Agent A probes agent B (icmp), `ustack run` (icmp and tcp, its echo
//! service) and 10.77.0.99, which does not exist; agent B probes the Linux
//! host 10.77.0.1, agent A and 10.77.0.99 (not `ustack run`: two pcap
//! stacks on one veth end do not see each other's frames). Agent A's port
//! drops 5 % of frames both ways, so its TCP probes retransmit. Through
//! Prometheus' HTTP API (curl inside the namespace): all three targets are
//! scraped; 10.77.0.99's loss is 100 % and its `ustack_mesh_target_up` 0
//! from both sources; the histogram_quantile(0.5) RTT from agent B to the
//! Linux host is finite and positive, raw and from the recording rule; the
//! tcp probe gets answers and agent A's `ustack_tcp_retransmits_total`
//! moved.
//!
//! Then headless Chromium loads agent A's mesh page (`/` of its metrics
//! endpoint) naming agent B as a second agent: the rendered DOM has both
//! sources' rows, the missing target red from both, the Linux host's cell
//! not red with a p99 under a second, the tcp matrix, a detail panel with
//! the distribution; the screenshot has the cells' red and green.
//!
//! Needs root, the `pcap` feature, `prometheus`, `curl` and `chromium`,
//! and a `uping` with `--metrics`; skips with the reason otherwise.
#![cfg(feature = "pcap")]

#[macro_use]
mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A process started in a namespace with its output in a log file; on drop
/// (also when the test fails) it gets SIGTERM, then SIGKILL if it lingers.
struct Proc {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &'static str, ns: &str, args: &[&str], logs: &Path) -> Proc {
        let log = logs.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("create a log file");
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone the log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Proc { name, child, log }
    }

    /// Its output so far.
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, up to 10 s to exit, then SIGKILL; true when it exited by itself.
    fn terminate(&mut self) -> bool {
        if self.child.try_wait().ok().flatten().is_some() {
            return true;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// The topology, the processes and the Prometheus API.
struct Mesh {
    // Dropped in order: the processes first, then the namespaces.
    procs: Vec<Proc>,
    topo: Topo,
    /// Ping lists, the Prometheus config and data, the logs.
    dir: tempfile::TempDir,
}

impl Mesh {
    fn linux_ns(&self) -> String {
        self.topo.ns("linux")
    }

    /// Everything the processes printed, and Prometheus' view of its
    /// targets, for a failure message.
    fn diagnose(&self) -> String {
        let mut s = String::new();
        for p in &self.procs {
            let out = p.output();
            let tail: Vec<&str> = out.lines().rev().take(30).collect();
            s += &format!("--- {} ---\n", p.name);
            for l in tail.iter().rev() {
                s += l;
                s.push('\n');
            }
        }
        let targets = self.api("/api/v1/targets", None);
        s += &format!("--- prometheus targets ---\n{targets}\n");
        for m in [
            "ustack_mesh_probes_sent_total",
            "ustack_mesh_probes_received_total",
        ] {
            let v = self.api("/api/v1/query", Some(m));
            for r in v["data"]["result"].as_array().into_iter().flatten() {
                s += &format!("{m} {} {}\n", r["metric"], r["value"][1]);
            }
        }
        s
    }

    fn fail(&self, msg: &str) -> ! {
        panic!("{msg}\n{}", self.diagnose())
    }

    /// GET an API path (with `query=` if given) through curl inside the
    /// Linux namespace; the JSON answer, or Null when none came.
    fn api(&self, path: &str, query: Option<&str>) -> Value {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.linux_ns()]).args([
            "curl",
            "-sS",
            "--max-time",
            "5",
            "--get",
        ]);
        if let Some(q) = query {
            cmd.arg("--data-urlencode").arg(format!("query={q}"));
        }
        cmd.arg(format!("http://127.0.0.1:9090{path}"));
        let out = cmd.output().expect("run curl");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// An instant query's samples as (labels, value); None while Prometheus
    /// does not answer yet; a failed query fails the test.
    fn query(&self, q: &str) -> Option<Vec<(BTreeMap<String, String>, f64)>> {
        let v = self.api("/api/v1/query", Some(q));
        if v.is_null() {
            return None;
        }
        if v["status"] != "success" {
            self.fail(&format!("query {q}: {v}"));
        }
        let samples = v["data"]["result"]
            .as_array()
            .unwrap_or_else(|| self.fail(&format!("query {q}: not a vector: {v}")))
            .iter()
            .map(|r| {
                let labels = r["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect();
                let value = r["value"][1]
                    .as_str()
                    .and_then(|s| s.parse::<f64>().ok())
                    .unwrap_or_else(|| self.fail(&format!("query {q}: bad value in {r}")));
                (labels, value)
            })
            .collect();
        Some(samples)
    }

    /// Poll `q` every 200 ms until `done` holds for its samples (then return
    /// them), for up to `secs` seconds (then fail, showing the last ones).
    fn wait_for(
        &self,
        what: &str,
        q: &str,
        secs: u64,
        done: impl Fn(&[(BTreeMap<String, String>, f64)]) -> bool,
    ) -> Vec<(BTreeMap<String, String>, f64)> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(s) = self.query(q) {
                if done(&s) {
                    return s;
                }
                last = Some(s);
            }
            if any_exited(&self.procs) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        self.fail(&format!(
            "{what}: not within {secs} s (or a process exited); last answer to {q}: {last:?}"
        ))
    }
}

/// Whether any of the processes exited (they all run until stopped): an
/// exited child stays a zombie until it is waited for.
fn any_exited(procs: &[Proc]) -> bool {
    procs.iter().any(|p| {
        std::fs::read_to_string(format!("/proc/{}/stat", p.child.id()))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
    })
}

/// Why this build's `uping` cannot run the test, if it cannot.
fn uping_lacks_metrics() -> Option<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_uping"))
        .arg("--help")
        .output()
        .expect("run uping --help");
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--metrics", "--pinglist", "probes="] {
        if !help.contains(flag) {
            return Some(format!("`uping --help` has no {flag}"));
        }
    }
    None
}

/// The management veth pair, made from inside the Linux namespace (it goes
/// with the namespaces when the topology is removed).
fn management_link(topo: &Topo) {
    let (ml, ms) = (format!("{}-ml", topo.tag), format!("{}-ms", topo.tag));
    let run = |ns: &str, args: &[&str]| {
        let out = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .output()
            .expect("run ip");
        assert!(
            out.status.success(),
            "{args:?} in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (lns, sns) = (topo.ns("linux"), topo.ns("stack"));
    run(
        &lns,
        &[
            "ip", "link", "add", &ml, "type", "veth", "peer", "name", &ms, "netns", &sns,
        ],
    );
    run(&lns, &["ip", "addr", "add", "10.77.1.1/24", "dev", &ml]);
    run(&lns, &["ip", "link", "set", &ml, "up"]);
    run(&sns, &["ip", "addr", "add", "10.77.1.2/24", "dev", &ms]);
    run(&sns, &["ip", "link", "set", &ms, "up"]);
}

/// Whether the Linux host (10.77.0.1 on TAG-l) gets an ARP answer for `ip`.
fn answers_arp(topo: &Topo, ip: &str) -> bool {
    topo.linux(&["arping", "-c", "1", "-w", "1", "-I", &topo.linux_if(), ip])
        .status
        .success()
}

const UNREACHABLE: &str = "10.77.0.99";

fn start() -> Mesh {
    let topo = Topo::up("pm");
    management_link(&topo);
    let (lns, sns) = (topo.ns("linux"), topo.ns("stack"));
    let mut mesh = Mesh {
        procs: Vec::new(),
        topo,
        dir: tempfile::tempdir().expect("a temp dir"),
    };
    let dir = mesh.dir.path().to_path_buf();
    let d = dir.as_path();
    std::fs::write(
        d.join("a.list"),
        format!(
            "# agent A (10.77.0.3)\n10.77.0.2 agent-b\n10.77.0.5 run-b probes=icmp,tcp\n{UNREACHABLE} nowhere\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("b.list"),
        format!(
            "# agent B (10.77.0.2)\n10.77.0.1 linux\n10.77.0.3 agent-a\n{UNREACHABLE} nowhere\n"
        ),
    )
    .unwrap();
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/prometheus/rules.yml");
    let rules = rules.canonicalize().expect("tools/prometheus/rules.yml");
    std::fs::write(
        d.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - '{}'\n\
             scrape_configs:\n\
             \x20 - job_name: ustack-mesh\n    static_configs:\n      - targets: ['127.0.0.1:9464', '10.77.1.2:9464']\n\
             \x20 - job_name: ustack-run\n    static_configs:\n      - targets: ['10.77.1.2:9465']\n",
            rules.display()
        ),
    )
    .unwrap();
    let p = |f: &str| d.join(f).to_str().expect("a UTF-8 path").to_string();
    let (ustack, uping) = (env!("CARGO_BIN_EXE_ustack"), env!("CARGO_BIN_EXE_uping"));
    let (s_if, l_if) = (mesh.topo.stack_if(), mesh.topo.linux_if());

    // The stack side: `ustack run` (the tcp probe's echo service) and agent B.
    mesh.procs.push(Proc::spawn(
        "ustack-run",
        &sns,
        &[
            ustack,
            "run",
            "--pcap",
            &s_if,
            "--ip",
            "10.77.0.5/24",
            "--metrics",
            "10.77.1.2:9465",
        ],
        d,
    ));
    let b_list = p("b.list");
    mesh.procs.push(Proc::spawn(
        "agent-b",
        &sns,
        &[
            uping,
            "--pcap",
            &s_if,
            "--ip",
            "10.77.0.2/24",
            "--pinglist",
            &b_list,
            "--duration",
            "0",
            "--rate",
            "60",
            "-W",
            "1",
            "-q",
            "--metrics",
            "10.77.1.2:9464",
        ],
        d,
    ));
    // The Linux side: agent A, impaired, serving on the namespace's loopback.
    let a_list = p("a.list");
    mesh.procs.push(Proc::spawn(
        "agent-a",
        &lns,
        &[
            uping,
            "--pcap",
            &l_if,
            "--ip",
            "10.77.0.3/24",
            "--impair",
            "loss=0.05,seed=7",
            "--pinglist",
            &a_list,
            "--duration",
            "0",
            "--rate",
            "100",
            "-W",
            "1",
            "-q",
            "--metrics",
            "127.0.0.1:9464",
        ],
        d,
    ));
    for ip in ["10.77.0.5", "10.77.0.2"] {
        let deadline = Instant::now() + Duration::from_secs(15);
        while !answers_arp(&mesh.topo, ip) {
            if Instant::now() > deadline {
                mesh.fail(&format!("{ip} never answered ARP"));
            }
        }
    }
    let (cfg, data) = (p("prometheus.yml"), p("tsdb"));
    mesh.procs.push(Proc::spawn(
        "prometheus",
        &lns,
        &[
            "prometheus",
            &format!("--config.file={cfg}"),
            &format!("--storage.tsdb.path={data}"),
            "--web.listen-address=127.0.0.1:9090",
            "--log.level=warn",
        ],
        d,
    ));
    mesh
}

fn source_is(s: &(BTreeMap<String, String>, f64), ip: &str) -> bool {
    s.0.get("source").map(String::as_str) == Some(ip)
}

#[test]
fn prometheus_scrapes_the_mesh_agents() {
    need_root!();
    need_program!("prometheus", "prometheus");
    need_program!("curl", "curl");
    need_program!("chromium", "chromium");
    if let Some(why) = uping_lacks_metrics() {
        ustack_test_skip::skip_test!(
            "{why} (the metrics endpoint and mesh probes are not in this build)"
        );
    }
    let mesh = start();

    // Two scrapes of each of the three targets, all up.
    mesh.wait_for(
        "two scrapes of every target",
        "count_over_time(up[1m]) >= 2",
        60,
        |s| s.len() == 3,
    );
    let up = mesh.query("up").unwrap_or_default();
    if up.len() != 3 || up.iter().any(|(_, v)| *v != 1.0) {
        mesh.fail(&format!("every target up: {up:?}"));
    }

    // The target that does not exist: every probe lost, from both agents.
    let lost = format!("ustack_mesh_probes_lost_total{{target=\"{UNREACHABLE}\"}}");
    mesh.wait_for(
        "losses to the missing target",
        &format!("{lost} > 0"),
        30,
        |s| s.len() == 2,
    );
    let ratio = mesh
        .query(&format!(
            "{lost} / ({lost} + ustack_mesh_probes_received_total{{target=\"{UNREACHABLE}\"}})"
        ))
        .unwrap_or_default();
    for src in ["10.77.0.3", "10.77.0.2"] {
        let r: Vec<f64> = ratio
            .iter()
            .filter(|s| source_is(s, src))
            .map(|s| s.1)
            .collect();
        if r != [1.0] {
            mesh.fail(&format!(
                "loss from {src} to {UNREACHABLE} must be 100 %: {ratio:?}"
            ));
        }
    }
    let up = mesh
        .query(&format!(
            "ustack_mesh_target_up{{target=\"{UNREACHABLE}\"}}"
        ))
        .unwrap_or_default();
    if up.len() != 2 || up.iter().any(|(_, v)| *v != 0.0) {
        mesh.fail(&format!(
            "{UNREACHABLE} must be down from both agents: {up:?}"
        ));
    }

    // A reachable target's median RTT: finite and positive, from the raw
    // buckets and from rules.yml's recording rule (its labels fit the
    // exporter's).
    let sel = "source=\"10.77.0.2\", target=\"10.77.0.1\", probe=\"icmp\"";
    let finite = |s: &[(BTreeMap<String, String>, f64)]| s.len() == 1 && s[0].1.is_finite();
    let raw = mesh.wait_for(
        "a p50 RTT",
        &format!(
            "histogram_quantile(0.5, sum by (le) (rate(ustack_mesh_rtt_seconds_bucket{{{sel}}}[30s])))"
        ),
        30,
        finite,
    );
    let rec = mesh.wait_for(
        "the recorded p50 RTT",
        &format!(
            "source_target_probe:ustack_mesh_rtt_seconds:histogram_quantile_rate5m{{quantile=\"0.5\", {sel}}}"
        ),
        30,
        finite,
    );
    for (what, s) in [("raw", &raw), ("recorded", &rec)] {
        let v = s[0].1;
        if !(v > 0.0 && v <= 1.0) {
            mesh.fail(&format!("{what} p50 RTT 10.77.0.2 -> 10.77.0.1: {v} s"));
        }
    }
    eprintln!(
        "p50 RTT 10.77.0.2 -> 10.77.0.1: {} s (recorded: {} s)",
        raw[0].1, rec[0].1
    );

    // The tcp probe is answered, and agent A's lossy port made its TCP
    // retransmit.
    mesh.wait_for(
        "answers to the tcp probe",
        "ustack_mesh_probes_received_total{source=\"10.77.0.3\", target=\"10.77.0.5\", probe=\"tcp\"} > 0",
        30,
        |s| s.len() == 1,
    );
    let rtx = mesh.wait_for(
        "agent A's TCP retransmits",
        "sum(ustack_tcp_retransmits_total{job=\"ustack-mesh\", instance=\"127.0.0.1:9464\"}) > 0",
        60,
        |s| s.len() == 1,
    );
    eprintln!("agent A retransmitted {} segments", rtx[0].1);

    // What the rules and the dashboard lean on holds for the real series:
    // every process has `ustack_info` (the dashboard's `instance`
    // variable); in-use / capacity matches pool by pool (the pool alert);
    // the recorded loss ratio is there for the missing target.
    let info = mesh.query("ustack_info").unwrap_or_default();
    if info.len() != 3 {
        mesh.fail(&format!("ustack_info from all three processes: {info:?}"));
    }
    let pools = mesh
        .query("ustack_pool_buffers_in_use / ustack_pool_buffers")
        .unwrap_or_default();
    let instances: std::collections::BTreeSet<&str> = pools
        .iter()
        .filter_map(|(l, _)| l.get("instance").map(String::as_str))
        .collect();
    if instances.len() != 3 || pools.iter().any(|(_, v)| !(0.0..=1.0).contains(v)) {
        mesh.fail(&format!(
            "pool use of all three processes, 0 to 1: {pools:?}"
        ));
    }
    mesh.wait_for(
        "the recorded loss ratio of the missing target",
        &format!(
            "source_target_probe:ustack_mesh_probes_lost_per_sent:ratio_rate5m{{target=\"{UNREACHABLE}\"}} > 0"
        ),
        30,
        |s| s.len() == 2,
    );

    // The mesh page, in a real browser: agent A's endpoint serves it, and
    // it reads agent B's metrics across origins (the management link).
    browser_draws_the_mesh(&mesh);

    // Everything stops cleanly, without a panic.
    let mut mesh = mesh;
    for p in mesh.procs.iter_mut() {
        let exited = p.terminate();
        let out = p.output();
        assert!(exited, "{} ignored SIGTERM:\n{out}", p.name);
        no_crash(&out);
    }
}

/// The attributes of every `<td class="cell ...">` of the page's matrices.
fn cells(dom: &str) -> Vec<BTreeMap<String, String>> {
    let attr = regex::Regex::new(r#"([a-z0-9-]+)="([^"]*)""#).unwrap();
    dom.split("<td ")
        .skip(1)
        .filter_map(|td| {
            let head = &td[..td.find('>')?];
            let a: BTreeMap<String, String> = attr
                .captures_iter(head)
                .map(|c| (c[1].to_string(), c[2].to_string()))
                .collect();
            a.contains_key("data-key").then_some(a)
        })
        .collect()
}

/// Headless Chromium in the Linux namespace: `--dump-dom` after the page's
/// script ran (virtual time: its refreshes come without waiting), or a
/// screenshot into `shot`.
fn chromium(mesh: &Mesh, url: &str, shot: Option<&Path>) -> String {
    let profile = mesh.dir.path().join("chromium");
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &mesh.linux_ns()])
        .args([
            "timeout",
            "-k",
            "5",
            "90",
            "chromium",
            "--headless",
            "--no-sandbox",
        ])
        .args([
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1100,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--virtual-time-budget=7000");
    match shot {
        Some(f) => cmd.arg(format!("--screenshot={}", f.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd.arg(url).output().expect("run chromium");
    if !out.status.success() {
        mesh.fail(&format!(
            "chromium {url}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn browser_draws_the_mesh(mesh: &Mesh) {
    let url = "http://127.0.0.1:9464/?agents=10.77.1.2:9464&refresh=1";
    let dom = chromium(mesh, url, None);
    let fail = |what: &str| -> ! { mesh.fail(&format!("mesh page: {what}\n--- DOM ---\n{dom}")) };
    let status = regex::Regex::new(r#"<div id="status" ([^>]*)>"#)
        .unwrap()
        .captures(&dom)
        .map(|c| c[1].to_string())
        .unwrap_or_else(|| fail("no status line"));
    for want in ["data-agents=\"2\"", "data-failed=\"0\""] {
        if !status.contains(want) {
            fail(&format!("status {status}: want {want}"));
        }
    }
    let fetches: u32 = regex::Regex::new(r#"data-fetches="(\d+)""#)
        .unwrap()
        .captures(&status)
        .and_then(|c| c[1].parse().ok())
        .unwrap_or(0);
    if fetches < 2 {
        fail(&format!("refreshed live: {fetches} looks"));
    }
    let cells = cells(&dom);
    let cell = |src: &str, dst: &str, probe: &str| {
        cells
            .iter()
            .find(|c| {
                c.get("data-source").map(String::as_str) == Some(src)
                    && c.get("data-target").map(String::as_str) == Some(dst)
                    && c.get("data-probe").map(String::as_str) == Some(probe)
            })
            .unwrap_or_else(|| fail(&format!("no cell {src} -> {dst} ({probe})")))
    };
    let get = |c: &BTreeMap<String, String>, k: &str| c.get(k).cloned().unwrap_or_default();
    for src in ["10.77.0.3", "10.77.0.2"] {
        let c = cell(src, UNREACHABLE, "icmp");
        if get(c, "data-state") != "bad" || get(c, "data-loss") != "1" {
            fail(&format!(
                "{src} -> {UNREACHABLE} must be red at 100 % loss: {c:?}"
            ));
        }
    }
    let c = cell("10.77.0.2", "10.77.0.1", "icmp");
    let p99: f64 = get(c, "data-p99").parse().unwrap_or(f64::NAN);
    if get(c, "data-state") == "bad" || !(p99 > 0.0 && p99 <= 1.0) {
        fail(&format!(
            "10.77.0.2 -> 10.77.0.1 answered, p99 under 1 s: {c:?}"
        ));
    }
    let c = cell("10.77.0.3", "10.77.0.5", "tcp");
    if get(c, "data-sent").parse::<u64>().unwrap_or(0) == 0 {
        fail(&format!("the tcp probe's cell has probes: {c:?}"));
    }
    if !dom.contains("<div id=\"detail\"") || !dom.contains("RTT distribution") {
        fail("no detail panel");
    }
    eprintln!(
        "mesh page: {} cells, {fetches} refreshes, status {status}",
        cells.len()
    );

    // The screenshot: the cells' own colours are there (the legend's
    // swatches are 10 x 10 pixels; a cell is about 64 x 34).
    let shot = mesh.dir.path().join("mesh.png");
    chromium(mesh, url, Some(&shot));
    let file = std::fs::File::open(&shot).unwrap_or_else(|e| fail(&format!("no screenshot: {e}")));
    let mut png = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap_or_else(|e| fail(&format!("screenshot is not a PNG: {e}")));
    let mut buf = vec![0; png.output_buffer_size().unwrap_or(0)];
    let info = png
        .next_frame(&mut buf)
        .unwrap_or_else(|e| fail(&format!("screenshot: {e}")));
    let step = info.color_type.samples();
    let count = |rgb: [u8; 3]| {
        buf[..info.buffer_size()]
            .chunks(step)
            .filter(|p| p.len() >= 3 && p[..3] == rgb)
            .count()
    };
    let (red, green) = (count([0xd7, 0x30, 0x27]), count([0x1a, 0x98, 0x50]));
    eprintln!(
        "mesh page screenshot {}x{}: {red} red pixels, {green} green",
        info.width, info.height
    );
    if red < 1000 || green < 1000 {
        fail(&format!(
            "the screenshot must show red and green cells: {red} red, {green} green pixels"
        ));
    }
}
