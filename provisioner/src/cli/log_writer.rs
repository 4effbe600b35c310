//! The text log's writer: each event is one line, whatever its message and fields hold. The
//! formatter hands over one event per write; every control character in it but the closing
//! line break is written escaped ([`provisioner::text::escaped`]), so a name from the kernel
//! or a runtime cannot forge a log line. Used when the log is not coloured (the formatter's
//! own colour codes are control characters too): a log read from journald, a file or
//! `kubectl logs`.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// Makes [`OneLinePerEvent`] writers over stderr.
pub struct LineSafeStderr;

impl<'a> MakeWriter<'a> for LineSafeStderr {
    type Writer = OneLinePerEvent<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLinePerEvent(io::stderr())
    }
}

/// Writes each buffer with its control characters escaped, but its final line break.
pub struct OneLinePerEvent<W>(pub W);

impl<W: Write> Write for OneLinePerEvent<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (text.as_ref(), ""),
        };
        let line = provisioner::text::escaped(body);
        self.0.write_all(line.as_bytes())?;
        self.0.write_all(end.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stays_one_line() -> io::Result<()> {
        let mut out = OneLinePerEvent(Vec::new());
        out.write_all(b"WARN exec /tmp/a\n2026-12-06T00:00:00Z VERDICT forged \x1b[2J\n")?;
        let written = String::from_utf8_lossy(&out.0).into_owned();
        assert_eq!(
            written,
            "WARN exec /tmp/a\\n2026-12-06T00:00:00Z VERDICT forged \\u{1b}[2J\n"
        );
        assert_eq!(written.lines().count(), 1);
        Ok(())
    }
}
