//! The terminal: raw mode and the alternate screen, the event loop, and
//! drawing only when something shown changed.

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam::channel::{Receiver, TryRecvError};
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event};
use ratatui::crossterm::terminal::{
    Clear, ClearType, EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::crossterm::{cursor, execute};
use ratatui::layout::Rect;
use ratatui::{Terminal, TerminalOptions, Viewport};

use crate::feed::Update;
use crate::monitor::{Action, Monitor, Status};

/// How long the loop waits for a key before looking at the feed again.
const TICK: Duration = Duration::from_millis(50);

/// A writer that counts the bytes written through it: the terminal's
/// output per frame.
#[derive(Debug)]
pub struct CountingWriter<W> {
    inner: W,
    written: Arc<AtomicU64>,
}

impl<W: Write> CountingWriter<W> {
    pub fn new(inner: W) -> Self {
        CountingWriter {
            inner,
            written: Arc::default(),
        }
    }
    /// A handle on the count of bytes written so far.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.written.clone()
    }
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A ratatui terminal over a [`CountingWriter`].
#[derive(Debug)]
pub struct Drawer<W: Write> {
    term: Terminal<CrosstermBackend<CountingWriter<W>>>,
    written: Arc<AtomicU64>,
}

impl<W: Write> Drawer<W> {
    /// Draw on `out`: the whole terminal, or `fixed` (tests, no terminal).
    pub fn new(out: W, fixed: Option<Rect>) -> io::Result<Self> {
        let out = CountingWriter::new(out);
        let written = out.counter();
        let backend = CrosstermBackend::new(out);
        let term = match fixed {
            Some(area) => Terminal::with_options(
                backend,
                TerminalOptions {
                    viewport: Viewport::Fixed(area),
                },
            )?,
            None => Terminal::new(backend)?,
        };
        Ok(Drawer { term, written })
    }

    /// Bytes written to the terminal so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Draw a frame if anything shown changed since the last one: ratatui
    /// diffs it against the previous buffer and writes only changed cells.
    /// Returns the bytes the frame wrote, or `None` when no frame was needed.
    pub fn draw_if_dirty(&mut self, m: &mut Monitor) -> io::Result<Option<u64>> {
        if !m.take_dirty() {
            return Ok(None);
        }
        let before = self.written();
        self.term.draw(|f| f.render_widget(&*m, f.area()))?;
        let bytes = self.written() - before;
        m.note_drawn(bytes);
        Ok(Some(bytes))
    }
}

/// Raw mode and the alternate screen, undone on drop (also on panic).
struct Screen;

impl Screen {
    fn enter() -> io::Result<Screen> {
        enable_raw_mode()?;
        let screen = Screen;
        execute!(
            io::stdout(),
            EnterAlternateScreen,
            Clear(ClearType::All),
            cursor::Hide
        )?;
        Ok(screen)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
        let _ = disable_raw_mode();
    }
}

/// Run the monitor on the terminal until the user quits (q, Ctrl-C),
/// or, with `exit_when_gone`, until the stack goes away. Returns the monitor
/// as it ended.
pub fn run(
    updates: &Receiver<Update>,
    mut m: Monitor,
    exit_when_gone: bool,
) -> io::Result<Monitor> {
    let _screen = Screen::enter()?;
    let mut drawer = Drawer::new(io::stdout(), None)?;
    loop {
        drawer.draw_if_dirty(&mut m)?;
        if event::poll(TICK)? {
            match event::read()? {
                Event::Key(k) if m.on_key(k) == Action::Quit => break,
                Event::Resize(..) => m.mark_dirty(),
                _ => {}
            }
        }
        loop {
            match updates.try_recv() {
                Ok(u) => m.on_update(u),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if !matches!(m.status(), Status::Gone(_)) {
                        m.on_update(Update::Gone("the feed ended".into()));
                    }
                    break;
                }
            }
        }
        if exit_when_gone && matches!(m.status(), Status::Gone(_)) {
            break;
        }
    }
    Ok(m)
}
