//! Drawing the monitor: the interactive screen (one pane at a time) and the
//! `--once` text frame (every pane, stacked).

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table, Tabs, Widget};
use serde_json::{Map, Value};

use crate::model::Frame;
use crate::monitor::{Col, Monitor, Pane, Status, human};

/// Protocol sections in display order; others follow alphabetically.
const SECTIONS: [&str; 7] = ["eth", "arp", "ipv4", "icmp", "udp", "tcp", "ud"];
/// Rows of the port table.
const PORT_ROWS: u16 = 11;

impl Widget for &Monitor {
    fn render(self, area: Rect, buf: &mut Buffer) {
        // The summary wraps onto a second line on a narrow terminal rather
        // than losing its end (the rates).
        let summary_text = summary_line(self);
        let summary_h = if summary_text.width() > usize::from(area.width) {
            2
        } else {
            1
        };
        let [title, tabs, summary, body, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Length(summary_h),
            Constraint::Min(0),
            Constraint::Length(1),
        ])
        .areas(area);
        title_line(self).render(title, buf);
        let names = Pane::ALL
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{} {}", i + 1, p.title()));
        Tabs::new(names)
            .select(Pane::ALL.iter().position(|p| *p == self.pane))
            .highlight_style(Style::new().add_modifier(Modifier::REVERSED))
            .render(tabs, buf);
        Paragraph::new(summary_text)
            .wrap(ratatui::widgets::Wrap { trim: true })
            .render(summary, buf);
        match &self.frame {
            None => Paragraph::new(self.status_text())
                .block(Block::bordered())
                .render(body, buf),
            Some(_) => render_pane(self, self.pane, body, buf),
        }
        footer_line(self).render(footer, buf);
    }
}

fn render_pane(m: &Monitor, pane: Pane, area: Rect, buf: &mut Buffer) {
    let Some(f) = &m.frame else { return };
    match pane {
        Pane::Pools => pools(f).render(area, buf),
        Pane::Ports => {
            let cores_h = if f.shards.is_empty() {
                0
            } else {
                u16::try_from(f.shards.len() + 3).unwrap_or(u16::MAX)
            };
            let [top, bottom] =
                Layout::vertical([Constraint::Min(0), Constraint::Length(cores_h)]).areas(area);
            let [left, right] =
                Layout::horizontal([Constraint::Length(48), Constraint::Min(20)]).areas(top);
            ports(m, f).render(left, buf);
            drops(f).render(right, buf);
            if cores_h > 0 {
                cores(f).render(bottom, buf);
            }
        }
        Pane::Protocols => {
            let width = area.width.saturating_sub(2);
            let lines = protocol_lines(f, width);
            let shown = area.height.saturating_sub(2);
            let total = u16::try_from(lines.len()).unwrap_or(u16::MAX);
            let top = m.scroll.min(total.saturating_sub(shown));
            let title = if total > shown {
                format!(
                    " Protocols: lines {}-{} of {total} (Up/Down, PgUp/PgDn) ",
                    top + 1,
                    (top + shown).min(total)
                )
            } else {
                " Protocols ".to_string()
            };
            Paragraph::new(lines)
                .scroll((top, 0))
                .block(Block::bordered().title(title))
                .render(area, buf);
        }
        Pane::Connections => connections(m, f, area.width).render(area, buf),
        Pane::Rdma => rc_qps(f).render(area, buf),
    }
}

/// The RC queue pairs: state, peer, PSNs, queues and the counters that
/// tell a healthy QP from a struggling one.
fn rc_qps(f: &Frame) -> Table<'static> {
    let head = Row::new([
        "QPN",
        "STATE",
        "PEER",
        "MTU",
        "NEXT PSN",
        "UNA PSN",
        "EXP PSN",
        "SQ",
        "RQ",
        "READS",
        "TX PKTS",
        "RX PKTS",
        "RETRANS",
        "TIMEOUTS",
        "RNR IN/OUT",
        "SEQ NAK IN/OUT",
        "DUPS",
    ])
    .style(Style::new().add_modifier(Modifier::BOLD));
    let rows: Vec<Row> = f
        .rc_qps
        .iter()
        .map(|q| {
            let s = &q.stats;
            Row::new([
                q.qpn.to_string(),
                q.state.to_uppercase(),
                q.dest
                    .as_ref()
                    .map_or("-".into(), |d| format!("{} qpn {}", d.ip, d.qpn)),
                q.mtu.to_string(),
                q.next_psn.to_string(),
                q.una_psn.to_string(),
                q.expected_psn.to_string(),
                q.send_outstanding.to_string(),
                q.recv_posted.to_string(),
                q.reads_outstanding.to_string(),
                human(s.tx_packets as f64),
                human(s.rx_packets as f64),
                human(s.retransmits as f64),
                s.ack_timeouts.to_string(),
                format!("{}/{}", s.rnr_naks_received, s.rnr_naks_sent),
                format!("{}/{}", s.seq_naks_received, s.seq_naks_sent),
                human(s.duplicates as f64),
            ])
        })
        .collect();
    let widths = [6, 6, 24, 5, 9, 9, 9, 5, 5, 6, 9, 9, 9, 9, 11, 15, 7].map(Constraint::Length);
    Table::new(rows, widths)
        .header(head)
        .block(Block::bordered().title(format!(" RDMA RC queue pairs: {} ", f.rc_qps.len())))
}

/// The natural height of a pane in the text frame.
fn pane_height(m: &Monitor, f: &Frame, pane: Pane, width: u16) -> u16 {
    let n = match pane {
        Pane::Pools => f.pools.len() + 1,
        Pane::Ports => {
            let cores = if f.shards.is_empty() {
                0
            } else {
                f.shards.len() + 3
            };
            usize::from(PORT_ROWS + 1).max(f.drops().len() + 1) + cores
        }
        Pane::Protocols => protocol_lines(f, width.saturating_sub(2)).len(),
        Pane::Connections => m.connections().len() + 1,
        Pane::Rdma => f.rc_qps.len() + 1,
    };
    u16::try_from(n + 2).unwrap_or(u16::MAX)
}

impl Monitor {
    /// Every pane, stacked, as plain text (no escape codes): what `--once`
    /// prints.
    pub fn text_frame(&self, width: u16) -> String {
        let Some(f) = &self.frame else {
            return format!("{}\n", self.status_text());
        };
        let heights: Vec<u16> = Pane::ALL
            .iter()
            .map(|p| pane_height(self, f, *p, width))
            .collect();
        let total = 2 + heights.iter().sum::<u16>() + u16::from(self.note.is_some());
        let area = Rect::new(0, 0, width, total);
        let mut buf = Buffer::empty(area);
        title_line(self).render(Rect::new(0, 0, width, 1), &mut buf);
        summary_line(self).render(Rect::new(0, 1, width, 1), &mut buf);
        let mut y = 2;
        for (p, h) in Pane::ALL.iter().zip(&heights) {
            render_pane(self, *p, Rect::new(0, y, width, *h), &mut buf);
            y += h;
        }
        if let Some(n) = &self.note {
            Line::from(n.as_str()).render(Rect::new(0, y, width, 1), &mut buf);
        }
        buffer_text(&buf)
    }
}

/// A buffer's symbols, one line per row, trailing blanks trimmed.
pub fn buffer_text(buf: &Buffer) -> String {
    let a = buf.area;
    let mut out = String::new();
    for y in a.top()..a.bottom() {
        let mut line = String::new();
        for x in a.left()..a.right() {
            line.push_str(buf[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn title_line(m: &Monitor) -> Line<'static> {
    let mut spans = vec![Span::raw(" utop ").reversed(), Span::raw(" ")];
    if let Some(f) = &m.frame {
        spans.push(Span::raw(format!("{} (pid {})", f.name, f.pid)).bold());
        spans.push(Span::raw("  "));
    }
    spans.push(Span::raw(m.source.clone()));
    spans.push(Span::raw("  "));
    let status = Span::raw(m.status_text());
    spans.push(match m.status {
        Status::Gone(_) => status.red().bold(),
        Status::Live => status.green(),
        Status::Waiting => status.yellow(),
    });
    Line::from(spans)
}

fn summary_line(m: &Monitor) -> Line<'static> {
    let Some(f) = &m.frame else {
        return Line::default();
    };
    let (used, cap, fail) = f.pools.iter().fold((0, 0, 0), |(u, c, a), p| {
        (u + p.in_use, c + p.capacity, a + p.alloc_failures)
    });
    let drops: u64 = f.drops().iter().map(|d| d.1).sum();
    let rate = match m.rates.port {
        // Bytes and bits a second: operators think of links in bit/s.
        Some(r) => format!(
            "rx {} pkt/s {}B/s {}bit/s  tx {} pkt/s {}B/s {}bit/s",
            human(r.rx_pps),
            human(r.rx_bps),
            human(r.rx_bps * 8.0),
            human(r.tx_pps),
            human(r.tx_bps),
            human(r.tx_bps * 8.0)
        ),
        None => "rx - pkt/s  tx - pkt/s".into(),
    };
    Line::from(format!(
        " pools {used}/{cap} in use, {fail} alloc failures | {rate} | drops {drops} | tcp {} connections",
        f.connections_total
    ))
}

fn footer_line(m: &Monitor) -> Line<'static> {
    let mut spans = if m.editing {
        vec![
            Span::raw(" filter: ").bold(),
            Span::raw(format!("{}_", m.filter)),
            Span::raw("  (Enter keeps, Esc clears)"),
        ]
    } else {
        vec![Span::raw(
            " q quit  Tab/1-5 pane  s sort  r reverse  / filter  Esc clear  Up/Down scroll",
        )]
    };
    if let Some(n) = &m.note {
        spans.push(Span::raw(format!("  {n}")).red());
    }
    if m.debug_draw {
        let bytes = m.last_draw_bytes.map_or("-".into(), |b| b.to_string());
        spans.push(Span::raw(format!(
            "  | draw: {bytes} bytes last frame, {} frames",
            m.frames_drawn
        )));
    }
    Line::from(spans)
}

fn header(cells: &[&'static str]) -> Row<'static> {
    Row::new(cells.to_vec()).style(Style::new().add_modifier(Modifier::BOLD))
}

fn pools(f: &Frame) -> Table<'static> {
    let rows = f.pools.iter().map(|p| {
        let pct = if p.capacity > 0 {
            format!("{:.1}%", p.in_use as f64 * 100.0 / p.capacity as f64)
        } else {
            "-".into()
        };
        Row::new(vec![
            p.name.clone(),
            p.capacity.to_string(),
            p.in_use.to_string(),
            pct,
            p.alloc_failures.to_string(),
            p.buf_size.to_string(),
        ])
    });
    let name_width = f.pools.iter().map(|p| p.name.len()).max().unwrap_or(0);
    let name_width = u16::try_from(name_width.clamp(8, 48)).unwrap_or(48);
    Table::new(
        rows,
        [
            Constraint::Length(name_width),
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Length(7),
            Constraint::Length(15),
            Constraint::Length(11),
        ],
    )
    .header(header(&[
        "Pool",
        "Capacity",
        "In use",
        "Use",
        "Alloc failures",
        "Buffer size",
    ]))
    .block(Block::bordered().title(" Pools "))
}

/// One row per core of a multi-core stack: its queue's traffic, its
/// connections, and what crossed between cores.
fn cores(f: &Frame) -> Table<'static> {
    let rows = f.shards.iter().map(|s| {
        let drops: u64 = s
            .stack
            .get("drops")
            .and_then(Value::as_object)
            .map_or(0, |d| d.values().filter_map(Value::as_u64).sum());
        Row::new(vec![
            format!("{} of {}", s.shard.index, s.shard.count),
            s.port.rx_packets.to_string(),
            s.port.tx_packets.to_string(),
            s.connections_total.to_string(),
            drops.to_string(),
            s.shard.steered_out.to_string(),
            s.shard.passed_on.to_string(),
            s.shard.arp_replicas_out.to_string(),
            s.shard.mailbox_full.to_string(),
        ])
    });
    Table::new(
        rows,
        [
            Constraint::Length(8),
            Constraint::Length(12),
            Constraint::Length(12),
            Constraint::Length(6),
            Constraint::Length(8),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(9),
        ],
    )
    .header(header(&[
        "Shard",
        "rx pkts",
        "tx pkts",
        "TCP",
        "Drops",
        "Steered",
        "Passed",
        "ARP cp",
        "Mail full",
    ]))
    .block(Block::bordered().title(" Cores (one stack per queue) "))
}

fn ports(m: &Monitor, f: &Frame) -> Table<'static> {
    let p = &f.port;
    let r = m.rates.port;
    let rate = |v: Option<f64>| v.map_or("-".into(), human);
    let drops: u64 = f.drops().iter().map(|d| d.1).sum();
    let rows: [(&str, u64, String); PORT_ROWS as usize] = [
        ("rx packets", p.rx_packets, rate(r.map(|r| r.rx_pps))),
        ("rx bytes", p.rx_bytes, rate(r.map(|r| r.rx_bps))),
        ("tx packets", p.tx_packets, rate(r.map(|r| r.tx_pps))),
        ("tx bytes", p.tx_bytes, rate(r.map(|r| r.tx_bps))),
        ("rx missed", p.rx_missed, String::new()),
        ("rx no-buffer", p.rx_nombuf, String::new()),
        ("tx errors", p.tx_errors, String::new()),
        (
            "eth rx frames",
            f.counter("eth", "rx_frames"),
            String::new(),
        ),
        (
            "eth accepted",
            f.counter("eth", "rx_accepted"),
            String::new(),
        ),
        (
            "eth tx no-buffer",
            f.counter("eth", "tx_no_buffer"),
            String::new(),
        ),
        ("dropped", drops, rate(r.map(|r| r.drops_ps))),
    ];
    let rows = rows
        .into_iter()
        .map(|(n, v, r)| Row::new(vec![n.to_string(), v.to_string(), r]));
    Table::new(
        rows,
        [
            Constraint::Length(17),
            Constraint::Length(16),
            Constraint::Length(9),
        ],
    )
    .header(header(&["Port", "Total", "Per s"]))
    .block(Block::bordered().title(" Port "))
}

fn drops(f: &Frame) -> Table<'static> {
    let d = f.drops();
    let rows: Vec<Row> = if d.is_empty() {
        vec![Row::new(vec!["(none)".to_string(), String::new()])]
    } else {
        d.into_iter()
            .map(|(n, c)| Row::new(vec![n, c.to_string()]))
            .collect()
    };
    Table::new(rows, [Constraint::Length(24), Constraint::Length(14)])
        .header(header(&["Reason", "Count"]))
        .block(Block::bordered().title(" Drops by reason "))
}

fn connections(m: &Monitor, f: &Frame, width: u16) -> Table<'static> {
    let shown = m.connections();
    let order = if m.reverse { "descending" } else { "ascending" };
    let mut title = format!(
        " Connections: {} shown of {}, sorted by {} {order} ",
        shown.len(),
        f.connections_total,
        m.sort.title()
    );
    if !m.filter.is_empty() {
        title.push_str(&format!("filter '{}' ", m.filter));
    }
    // Whole columns that fit, rather than every column cut short.
    let cols = Col::fitting(width.saturating_sub(2), m.sort);
    if cols.len() < Col::ALL.len() {
        title.push_str(&format!("{} of {} columns ", cols.len(), Col::ALL.len()));
    }
    let skip = usize::from(m.scroll).min(shown.len().saturating_sub(1));
    if skip > 0 {
        title.push_str(&format!("from row {} ", skip + 1));
    }
    let rows: Vec<Row> = shown
        .iter()
        .skip(skip)
        .map(|(c, r)| Row::new(cols.iter().map(|col| col.text(c, r)).collect::<Vec<_>>()))
        .collect();
    let head = Row::new(cols.iter().map(|c| {
        let cell = ratatui::widgets::Cell::from(c.title());
        if *c == m.sort {
            cell.style(Style::new().add_modifier(Modifier::REVERSED))
        } else {
            cell
        }
    }))
    .style(Style::new().add_modifier(Modifier::BOLD));
    Table::new(rows, cols.iter().map(|c| Constraint::Length(c.width())))
        .header(head)
        .block(Block::bordered().title(title))
}

/// The protocol counters as `section  key value  key value`, packed into
/// lines of `width`.
fn protocol_lines(f: &Frame, width: u16) -> Vec<Line<'static>> {
    let width = usize::from(width).max(20);
    let mut names: Vec<&str> = SECTIONS
        .iter()
        .copied()
        .filter(|s| f.stack.contains_key(*s))
        .collect();
    let mut rest: Vec<&str> = f
        .stack
        .keys()
        .map(String::as_str)
        .filter(|k| *k != "drops" && !SECTIONS.contains(k))
        .collect();
    rest.sort_unstable();
    names.extend(rest);
    let mut lines = Vec::new();
    for name in names {
        let mut tokens = Vec::new();
        match f.stack.get(name) {
            Some(Value::Object(o)) => flatten("", o, &mut tokens),
            Some(v) => tokens.push(v.to_string()),
            None => {}
        }
        let mut line = format!("{name:<6}");
        let mut first = true;
        for t in tokens {
            if !first && line.len() + 2 + t.len() > width {
                lines.push(section_line(std::mem::replace(&mut line, " ".repeat(6))));
                first = true;
            }
            line.push_str(if first { " " } else { "  " });
            line.push_str(&t);
            first = false;
        }
        lines.push(section_line(line));
    }
    lines
}

fn section_line(text: String) -> Line<'static> {
    // The first six bytes, backed off to a character boundary (names come
    // from the wire and may hold any UTF-8).
    let mut at = 6.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let (head, tail) = text.split_at(at);
    Line::from(vec![
        Span::raw(head.to_string()).bold(),
        Span::raw(tail.to_string()),
    ])
}

fn flatten(prefix: &str, o: &Map<String, Value>, out: &mut Vec<String>) {
    for (k, v) in o {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Object(inner) => flatten(&key, inner, out),
            Value::Number(n) => out.push(format!("{key} {n}")),
            other => out.push(format!("{key} {other}")),
        }
    }
}

#[cfg(test)]
mod section_line_test {
    use super::section_line;

    /// Found by the telemetry_line fuzz target: a name with a multi-byte
    /// character across byte 6 panicked in `split_at`.
    #[test]
    fn multibyte_names_do_not_panic() {
        let l = section_line("e\u{fffd}\u{fffd}th rx 1".to_string());
        let text: String = l.spans.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "e\u{fffd}\u{fffd}th rx 1");
        let l = section_line("ab".to_string());
        assert_eq!(l.spans.len(), 2);
    }
}
