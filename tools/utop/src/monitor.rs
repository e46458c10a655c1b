//! The monitor's state: the latest snapshot, rates from the last two, the
//! view (pane, sort, filter), and whether anything shown changed since the
//! last frame was drawn.

use std::collections::HashMap;
use std::net::SocketAddrV4;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::feed::Update;
use crate::model::{Conn, Frame};

/// The panes, in key order (1-5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Pools,
    Ports,
    Protocols,
    Connections,
    Rdma,
}

impl Pane {
    pub const ALL: [Pane; 5] = [
        Pane::Pools,
        Pane::Ports,
        Pane::Protocols,
        Pane::Connections,
        Pane::Rdma,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Pane::Pools => "Pools",
            Pane::Ports => "Ports",
            Pane::Protocols => "Protocols",
            Pane::Connections => "Connections",
            Pane::Rdma => "RDMA",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where the monitor stands with its stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Attached, no snapshot yet.
    Waiting,
    Live,
    /// The stack went away (the text says which); the last snapshot stays.
    Gone(String),
}

/// Per-second rates of the port.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PortRates {
    pub rx_pps: f64,
    pub rx_bps: f64,
    pub tx_pps: f64,
    pub tx_bps: f64,
    pub drops_ps: f64,
}

/// Per-second rates of one connection (bytes and segments).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ConnRate {
    pub in_bps: f64,
    pub out_bps: f64,
    pub pps: f64,
}

/// Rates between two successive snapshots of the same stack.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    /// `None` until two snapshots are in.
    pub port: Option<PortRates>,
    pub conns: HashMap<(String, String), ConnRate>,
}

impl Rates {
    /// Rates from `prev` to `cur`; empty when they are not successive
    /// snapshots of one process.
    pub fn between(prev: &Frame, cur: &Frame) -> Rates {
        if prev.pid != cur.pid || cur.at_ns <= prev.at_ns {
            return Rates::default();
        }
        let secs = (cur.at_ns - prev.at_ns) as f64 / 1e9;
        let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        let (p, c) = (&prev.port, &cur.port);
        let drops = |f: &Frame| f.drops().iter().map(|d| d.1).sum::<u64>();
        let port = PortRates {
            rx_pps: per(p.rx_packets, c.rx_packets),
            rx_bps: per(p.rx_bytes, c.rx_bytes),
            tx_pps: per(p.tx_packets, c.tx_packets),
            tx_bps: per(p.tx_bytes, c.tx_bytes),
            drops_ps: per(drops(prev), drops(cur)),
        };
        let before: HashMap<_, _> = prev.connections.iter().map(|c| (c.key(), c)).collect();
        let conns = cur
            .connections
            .iter()
            .map(|c| {
                let r = match before.get(&c.key()) {
                    Some(b) => ConnRate {
                        in_bps: per(b.stats.bytes_in, c.stats.bytes_in),
                        out_bps: per(b.stats.bytes_out, c.stats.bytes_out),
                        pps: per(
                            b.stats.segs_in + b.stats.segs_out,
                            c.stats.segs_in + c.stats.segs_out,
                        ),
                    },
                    None => ConnRate::default(),
                };
                (c.key(), r)
            })
            .collect();
        Rates {
            port: Some(port),
            conns,
        }
    }
}

/// Columns of the connection table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Col {
    Local,
    Remote,
    State,
    Cwnd,
    Ssthresh,
    SndWnd,
    RcvWnd,
    Srtt,
    Retx,
    BytesIn,
    BytesOut,
    InRate,
    OutRate,
    Pps,
    Ooo,
    Pids,
}

impl Col {
    pub const ALL: [Col; 16] = [
        Col::Local,
        Col::Remote,
        Col::State,
        Col::Cwnd,
        Col::Ssthresh,
        Col::SndWnd,
        Col::RcvWnd,
        Col::Srtt,
        Col::Retx,
        Col::BytesIn,
        Col::BytesOut,
        Col::InRate,
        Col::OutRate,
        Col::Pps,
        Col::Ooo,
        Col::Pids,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Col::Local => "Local",
            Col::Remote => "Remote",
            Col::State => "State",
            Col::Cwnd => "Cwnd",
            Col::Ssthresh => "Ssthr",
            Col::SndWnd => "Swnd",
            Col::RcvWnd => "Rwnd",
            Col::Srtt => "SRTT",
            Col::Retx => "Retx",
            Col::BytesIn => "RxB",
            Col::BytesOut => "TxB",
            Col::InRate => "RxB/s",
            Col::OutRate => "TxB/s",
            Col::Pps => "Pkt/s",
            Col::Ooo => "OOO",
            Col::Pids => "Pids",
        }
    }

    /// Addresses and the state in full; numbers are at most 5 characters
    /// ([`human`]), so the table fits 130 columns.
    pub fn width(self) -> u16 {
        match self {
            Col::Local | Col::Remote => 21,
            Col::State => 11,
            Col::Srtt => 6,
            Col::Pids => 13,
            _ => 5,
        }
    }

    /// The columns that fit `width` cells, in table order: the least
    /// telling go first when the terminal is narrow (80 columns keeps the
    /// addresses, state, RTT and both rates), and the sort column stays.
    pub fn fitting(width: u16, sort: Col) -> Vec<Col> {
        // Dropped in this order.
        const LEAST_FIRST: [Col; 13] = [
            Col::Pids,
            Col::Ooo,
            Col::Ssthresh,
            Col::Pps,
            Col::SndWnd,
            Col::BytesOut,
            Col::BytesIn,
            Col::Retx,
            Col::Cwnd,
            Col::RcvWnd,
            Col::Remote,
            Col::OutRate,
            Col::InRate,
        ];
        let mut cols: Vec<Col> = Col::ALL.to_vec();
        let need = |cols: &[Col]| cols.iter().map(|c| c.width() + 1).sum::<u16>();
        for drop in LEAST_FIRST {
            if need(&cols) <= width {
                break;
            }
            if drop != sort {
                cols.retain(|c| *c != drop);
            }
        }
        cols
    }

    /// The cell text.
    pub fn text(self, c: &Conn, r: &ConnRate) -> String {
        match self {
            Col::Local => c.local.clone(),
            Col::Remote => c.remote.clone(),
            Col::State => c.state_label(),
            Col::Cwnd => human(c.cwnd as f64),
            // Before the first loss ssthresh is "infinite" (usize::MAX).
            Col::Ssthresh if c.ssthresh >= 1 << 48 => "inf".into(),
            Col::Ssthresh => human(c.ssthresh as f64),
            Col::SndWnd => human(c.snd_wnd as f64),
            Col::RcvWnd => human(c.rcv_wnd as f64),
            Col::Srtt => c.srtt_us.map_or("-".into(), micros),
            Col::Retx => human(c.stats.retransmits as f64),
            Col::BytesIn => human(c.stats.bytes_in as f64),
            Col::BytesOut => human(c.stats.bytes_out as f64),
            Col::InRate => human(r.in_bps),
            Col::OutRate => human(r.out_bps),
            Col::Pps => human(r.pps),
            Col::Ooo => human(c.ooo_bytes as f64),
            // The processes holding it (a stack several processes share).
            Col::Pids if c.holders.is_empty() => "-".into(),
            Col::Pids => c
                .holders
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// The sort key: numbers for numeric columns, addresses by value.
    fn key(self, c: &Conn, r: &ConnRate) -> (f64, String) {
        let addr = |s: &str| {
            s.parse::<SocketAddrV4>().map_or(f64::MAX, |a| {
                ((u64::from(a.ip().to_bits()) << 16) | u64::from(a.port())) as f64
            })
        };
        let n = |v: u64| (v as f64, String::new());
        match self {
            Col::Local => (addr(&c.local), c.local.clone()),
            Col::Remote => (addr(&c.remote), c.remote.clone()),
            Col::State => (0.0, c.state_label()),
            Col::Cwnd => n(c.cwnd),
            Col::Ssthresh => n(c.ssthresh),
            Col::SndWnd => n(c.snd_wnd),
            Col::RcvWnd => n(c.rcv_wnd),
            Col::Srtt => n(c.srtt_us.unwrap_or(0)),
            Col::Retx => n(c.stats.retransmits),
            Col::BytesIn => n(c.stats.bytes_in),
            Col::BytesOut => n(c.stats.bytes_out),
            Col::InRate => (r.in_bps, String::new()),
            Col::OutRate => (r.out_bps, String::new()),
            Col::Pps => (r.pps, String::new()),
            Col::Ooo => n(c.ooo_bytes),
            Col::Pids => n(u64::from(c.holders.first().copied().unwrap_or(0))),
        }
    }
}

/// A count with an SI suffix, at most 5 characters: `999`, `1.23K`, `45.6M`.
pub fn human(v: f64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut v = v.max(0.0);
    let mut i = 0;
    while v >= 999.5 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    match (i, v) {
        (0, _) => format!("{v:.0}"),
        (_, v) if v < 9.995 => format!("{v:.2}{}", UNITS[i]),
        (_, v) if v < 99.95 => format!("{v:.1}{}", UNITS[i]),
        _ => format!("{v:.0}{}", UNITS[i]),
    }
}

/// Microseconds as `850us`, `12.3ms`, `1.20s`.
fn micros(us: u64) -> String {
    match us {
        0..1000 => format!("{us}us"),
        1000..1_000_000 => format!("{:.1}ms", us as f64 / 1e3),
        _ => format!("{:.2}s", us as f64 / 1e6),
    }
}

/// What a key asks of the program around the monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    Quit,
}

/// The monitor of one stack.
#[derive(Debug)]
pub struct Monitor {
    /// What the monitor watches, for messages ("stack at PATH exited").
    pub source: String,
    pub(crate) frame: Option<Frame>,
    pub(crate) rates: Rates,
    pub(crate) status: Status,
    pub(crate) pane: Pane,
    pub(crate) sort: Col,
    pub(crate) reverse: bool,
    pub(crate) filter: String,
    pub(crate) editing: bool,
    pub(crate) debug_draw: bool,
    /// Bytes written to the terminal by the last frame drawn.
    pub(crate) last_draw_bytes: Option<u64>,
    pub(crate) frames_drawn: u64,
    pub(crate) note: Option<String>,
    /// Lines scrolled off the top of the Protocols and Connections panes.
    pub(crate) scroll: u16,
    dirty: bool,
}

impl Monitor {
    pub fn new(source: impl Into<String>) -> Monitor {
        Monitor {
            source: source.into(),
            frame: None,
            rates: Rates::default(),
            status: Status::Waiting,
            pane: Pane::Connections,
            sort: Col::Local,
            reverse: false,
            filter: String::new(),
            editing: false,
            debug_draw: false,
            last_draw_bytes: None,
            frames_drawn: 0,
            note: None,
            scroll: 0,
            dirty: true,
        }
    }

    /// Show the bytes each frame writes (`--debug-draw`).
    pub fn with_debug_draw(mut self, on: bool) -> Monitor {
        self.debug_draw = on;
        self
    }

    pub fn frame(&self) -> Option<&Frame> {
        self.frame.as_ref()
    }
    pub fn status(&self) -> &Status {
        &self.status
    }
    pub fn rates(&self) -> &Rates {
        &self.rates
    }
    pub fn pane(&self) -> Pane {
        self.pane
    }
    pub fn set_pane(&mut self, p: Pane) {
        if p != self.pane {
            self.pane = p;
            self.dirty = true;
        }
    }

    /// Take in what the feed reports; marks the view dirty only when
    /// something shown changed.
    pub fn on_update(&mut self, u: Update) {
        match u {
            Update::Frame(f) => {
                let rates = match &self.frame {
                    Some(p) => Rates::between(p, &f),
                    None => Rates::default(),
                };
                let changed = self.status != Status::Live
                    || self.note.is_some()
                    || rates != self.rates
                    || self.frame.as_ref().is_none_or(|p| !p.same_counters(&f));
                self.frame = Some(*f);
                self.rates = rates;
                self.status = Status::Live;
                self.note = None;
                self.dirty |= changed;
            }
            Update::Attached => {
                self.status = Status::Waiting;
                self.dirty = true;
            }
            Update::Gone(why) => {
                self.status = Status::Gone(why);
                self.rates = Rates::default();
                self.dirty = true;
            }
            Update::Garbled(why) => {
                self.note = Some(why);
                self.dirty = true;
            }
        }
    }

    /// Handle a key press.
    pub fn on_key(&mut self, k: KeyEvent) -> Action {
        if k.kind == KeyEventKind::Release {
            return Action::Continue;
        }
        if k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL) {
            return Action::Quit;
        }
        if self.editing {
            match k.code {
                KeyCode::Enter => self.editing = false,
                KeyCode::Esc => {
                    self.editing = false;
                    self.filter.clear();
                }
                KeyCode::Backspace => {
                    self.filter.pop();
                }
                KeyCode::Char(c) => self.filter.push(c),
                _ => return Action::Continue,
            }
            self.dirty = true;
            return Action::Continue;
        }
        let pane = self.pane.index();
        match k.code {
            KeyCode::Char('q') => return Action::Quit,
            // Esc clears a kept filter and otherwise does nothing (htop's
            // habit): a user pressing it after Enter must not stop the
            // daemon behind `ustack run --tui`.
            KeyCode::Esc if !self.filter.is_empty() => self.filter.clear(),
            KeyCode::Esc => return Action::Continue,
            // Long panes scroll (at 80x24 neither the protocol counters
            // nor many connections fit).
            KeyCode::Down | KeyCode::Char('j') => self.scroll = self.scroll.saturating_add(1),
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::PageDown => self.scroll = self.scroll.saturating_add(10),
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(10),
            KeyCode::Home => self.scroll = 0,
            KeyCode::Tab => self.pane = Pane::ALL[(pane + 1) % Pane::ALL.len()],
            KeyCode::BackTab => {
                self.pane = Pane::ALL[(pane + Pane::ALL.len() - 1) % Pane::ALL.len()];
            }
            KeyCode::Char(c @ '1'..='5') => self.pane = Pane::ALL[usize::from(c as u8 - b'1')],
            KeyCode::Char('s') => {
                let i = Col::ALL.iter().position(|c| *c == self.sort).unwrap_or(0);
                self.sort = Col::ALL[(i + 1) % Col::ALL.len()];
                self.pane = Pane::Connections;
            }
            KeyCode::Char('r') => {
                self.reverse = !self.reverse;
                self.pane = Pane::Connections;
            }
            KeyCode::Char('/') => {
                self.editing = true;
                self.pane = Pane::Connections;
            }
            _ => return Action::Continue,
        }
        self.dirty = true;
        Action::Continue
    }

    /// Whether a frame must be drawn; clears the flag.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    /// Force the next frame (terminal resized).
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// Record what the frame just drawn wrote to the terminal.
    pub fn note_drawn(&mut self, bytes: u64) {
        self.last_draw_bytes = Some(bytes);
        self.frames_drawn += 1;
    }

    /// The connections shown: filtered and sorted, with their rates.
    pub fn connections(&self) -> Vec<(&Conn, ConnRate)> {
        let Some(f) = &self.frame else {
            return Vec::new();
        };
        let needle = self.filter.to_ascii_lowercase();
        let mut rows: Vec<(&Conn, ConnRate)> = f
            .connections
            .iter()
            .filter(|c| {
                needle.is_empty()
                    || c.local.contains(&needle)
                    || c.remote.contains(&needle)
                    || c.state_label().to_ascii_lowercase().contains(&needle)
            })
            .map(|c| {
                (
                    c,
                    self.rates.conns.get(&c.key()).copied().unwrap_or_default(),
                )
            })
            .collect();
        let col = self.sort;
        rows.sort_by(|a, b| {
            let (ka, kb) = (col.key(a.0, &a.1), col.key(b.0, &b.1));
            ka.0.total_cmp(&kb.0)
                .then_with(|| ka.1.cmp(&kb.1))
                .then_with(|| a.0.local.cmp(&b.0.local))
        });
        if self.reverse {
            rows.reverse();
        }
        rows
    }

    /// The status line's text.
    pub fn status_text(&self) -> String {
        match &self.status {
            Status::Waiting => format!("attached to {}, waiting for a snapshot", self.source),
            Status::Live => "live".into(),
            Status::Gone(why) => format!("{why} - waiting for it to come back (q quits)"),
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn human_numbers_stay_short() {
        assert_eq!(human(0.0), "0");
        assert_eq!(human(999.0), "999");
        assert_eq!(human(1234.0), "1.23K");
        assert_eq!(human(45_600_000.0), "45.6M");
        assert_eq!(human(999_999.0), "1.00M");
        assert_eq!(human(3.2e9), "3.20G");
        assert_eq!(micros(850), "850us");
        assert_eq!(micros(12_345), "12.3ms");
    }

    fn key(c: KeyCode) -> KeyEvent {
        KeyEvent::new(c, KeyModifiers::NONE)
    }

    #[test]
    fn keys_switch_panes_sort_filter_and_quit() {
        let mut m = Monitor::new("x");
        assert_eq!(m.pane(), Pane::Connections);
        m.on_key(key(KeyCode::Char('1')));
        assert_eq!(m.pane(), Pane::Pools);
        m.on_key(key(KeyCode::Tab));
        assert_eq!(m.pane(), Pane::Ports);
        m.on_key(key(KeyCode::BackTab));
        m.on_key(key(KeyCode::BackTab));
        assert_eq!(m.pane(), Pane::Rdma, "BackTab wraps to the last pane");
        m.on_key(key(KeyCode::BackTab));
        assert_eq!(m.pane(), Pane::Connections);
        m.on_key(key(KeyCode::Char('5')));
        assert_eq!(m.pane(), Pane::Rdma);
        m.on_key(key(KeyCode::Char('4')));
        m.on_key(key(KeyCode::Char('s')));
        assert_eq!(m.sort, Col::Remote);
        m.on_key(key(KeyCode::Char('r')));
        assert!(m.reverse);
        m.on_key(key(KeyCode::Char('/')));
        for c in "q10".chars() {
            assert_eq!(m.on_key(key(KeyCode::Char(c))), Action::Continue);
        }
        m.on_key(key(KeyCode::Backspace));
        m.on_key(key(KeyCode::Enter));
        assert_eq!(m.filter, "q1");
        assert_eq!(m.on_key(key(KeyCode::Char('q'))), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        m.on_key(key(KeyCode::Char('/')));
        assert_eq!(m.on_key(ctrl_c), Action::Quit);
    }

    /// Esc clears or cancels, never quits (htop's habit): `q` quits.
    #[test]
    fn esc_after_keeping_a_filter_clears_it_and_does_not_quit() {
        let mut m = Monitor::new("x");
        m.on_key(key(KeyCode::Char('/')));
        for c in "10.0".chars() {
            m.on_key(key(KeyCode::Char(c)));
        }
        m.on_key(key(KeyCode::Enter));
        assert_eq!(m.filter, "10.0");
        // The Esc a user presses right after keeping the filter.
        assert_eq!(m.on_key(key(KeyCode::Esc)), Action::Continue);
        assert_eq!(m.filter, "", "Esc clears the kept filter");
        // A second Esc with nothing to clear does nothing either.
        assert_eq!(m.on_key(key(KeyCode::Esc)), Action::Continue);
        // Esc while typing cancels the edit.
        m.on_key(key(KeyCode::Char('/')));
        m.on_key(key(KeyCode::Char('9')));
        assert_eq!(m.on_key(key(KeyCode::Esc)), Action::Continue);
        assert!(!m.editing && m.filter.is_empty());
        assert_eq!(m.on_key(key(KeyCode::Char('q'))), Action::Quit);
    }
}
