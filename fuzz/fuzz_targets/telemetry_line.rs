//! utop's side of telemetry: any lines (what a socket may carry) parsed
//! into frames, fed to the monitor (rates between frames), and the text
//! frame (every pane) drawn wide and narrow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use utop::{Monitor, Pane, Update};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut m = Monitor::new("fuzz");
    for line in text.lines().take(8) {
        let u = Update::from_line(line);
        if let Update::Frame(f) = &u {
            let _ = (f.drops(), f.counter("tcp", "segs_in"), f.same_counters(f));
            for c in &f.connections {
                let _ = (c.state_label(), c.key());
            }
        }
        m.on_update(u);
    }
    // Every pane is in the text frame; the layout solver is slow under the
    // sanitizer, so one wide and one narrow frame.
    m.set_pane(Pane::Connections);
    let _ = m.text_frame(100);
    let _ = m.text_frame(12);
    let _ = m.status_text();
    let _ = m.connections();
});
