//! Log lines, captured per thread. One global subscriber, installed by
//! the first [`capture`], writes each event into the buffer of the
//! thread that emitted it (a test's own, on a current-thread runtime). A
//! scoped subscriber per test was flaky: it missed events whose callsite
//! another test's thread had registered first.

use std::{cell::RefCell, io::Write, sync::Once};

thread_local! {
    static LINES: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

struct ThreadBuffer;

impl Write for ThreadBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LINES.with(|l| l.borrow_mut().extend_from_slice(buf));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// From now on, this thread's log lines are kept (and the earlier
/// ones forgotten).
pub fn capture() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_max_level(tracing::Level::INFO)
            .with_writer(|| ThreadBuffer)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in the unit tests");
    });
    LINES.with(|l| l.borrow_mut().clear());
}

/// This thread's lines since [`capture`] that contain `what`.
pub fn lines(what: &str) -> Vec<String> {
    LINES.with(|l| {
        String::from_utf8_lossy(&l.borrow())
            .lines()
            .filter(|line| line.contains(what))
            .map(str::to_string)
            .collect()
    })
}
