//! Text that came from outside the daemon (the kernel's comm and file names, paths, interface
//! names, what a runtime or a socket caller said), made safe to print or log: a control
//! character (a newline, a terminal escape) is written as an escape sequence, so that such a
//! name can neither forge a line of its own nor drive the reader's terminal.

use std::borrow::Cow;
use std::fmt;

/// Whether `c` must not reach a terminal or a line-oriented log as it is: C0 and C1 controls
/// and DEL, and the Unicode marks that reorder or hide what follows them (bidirectional
/// overrides and isolates, line and paragraph separators).
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// `text` with each unsafe character written as `\n`, `\t`, `\r` or `\u{1b}`; borrowed when
/// there is none (the usual case).
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if unsafe_char(c) => out.push_str(&c.escape_unicode().to_string()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Displays its text [`escaped`].
pub struct Escaped<'a>(pub &'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&escaped(self.0))
    }
}

/// Each line of `text` [`escaped`], the line breaks kept: for a multi-line rendering whose own
/// line breaks are structure and whose lines hold outside text.
pub fn escaped_lines(text: &str) -> String {
    text.split('\n')
        .map(|line| escaped(line).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_cannot_forge_a_line_or_reach_the_terminal() {
        assert!(matches!(escaped("containerd"), Cow::Borrowed("containerd")));
        assert_eq!(
            escaped("true\n2026-12-06T00:00:00.000Z VERDICT SKIPPED pod forged"),
            "true\\n2026-12-06T00:00:00.000Z VERDICT SKIPPED pod forged"
        );
        assert_eq!(escaped("\u{1b}[2Jx\r\t"), "\\u{1b}[2Jx\\r\\t");
        assert_eq!(
            escaped("a\u{202e}b\u{9b}c\u{7f}"),
            "a\\u{202e}b\\u{9b}c\\u{7f}"
        );
        assert_eq!(escaped("pod-ü ok"), "pod-ü ok");
        assert_eq!(Escaped("a\nb").to_string(), "a\\nb");
        assert_eq!(escaped_lines("one\u{1b}\n  two\n"), "one\\u{1b}\n  two\n");
    }
}
