//! Template text that gtmpl cannot lex, found before gtmpl sees it: on such text gtmpl's lexer
//! panics or loops forever, so it is refused here with an error naming its line.

/// The first thing gtmpl cannot lex, with its line. gtmpl's lexer steps back one byte where it
/// means one character, also past the end of the text: a multi-byte character inside an action
/// (outside a quoted string, raw string or character constant), or as the last non-space
/// character before a `{{- ` trim marker, makes its lexer thread panic (the parse then fails with
/// a meaningless error); an action still open at the end of the text (`{{ .PodCIDR `) makes it
/// loop forever and the render hang. Go rejects all of these too, but for a multi-byte
/// character in a variable name. Literals are followed as gtmpl lexes them (a backslash always
/// escapes the next character; a newline ends the lexing with an error).
pub(super) fn gtmpl_unlexable(text: &str) -> Option<(usize, String)> {
    let line = |at: usize| text[..at].matches('\n').count() + 1;
    let found = |at: usize, c: char| {
        Some((
            line(at),
            format!(
                "non-ASCII character {c:?} (U+{:04X}) in an action or right before `{{{{- `: \
                 only quoted strings, comments and text may hold one",
                u32::from(c)
            ),
        ))
    };
    let mut at = 0;
    while let Some(open) = text[at..].find("{{") {
        let before = text[at..at + open].trim_end_matches(char::is_whitespace);
        let rest = &text[at + open + 2..];
        if rest.starts_with("- ")
            && let Some(c) = before.chars().next_back().filter(|c| !c.is_ascii())
        {
            return found(at + before.len() - c.len_utf8(), c);
        }
        let action = at + open;
        at += open + 2;
        let body = rest.strip_prefix("- ").unwrap_or(rest);
        if body.starts_with("/*") {
            let comment = at + (rest.len() - body.len()) + 2;
            at = comment + text[comment..].find("*/")? + 2;
            continue;
        }
        let mut quote = None;
        let mut opened = 0;
        let mut escaped = false;
        let mut closed = false;
        for (i, c) in text[at..].char_indices() {
            match quote {
                Some(q) if c == '\\' && q != '`' => escaped = true,
                Some(q) if c == '\n' && q != '`' => return None,
                Some(q) if c == q && !escaped => {
                    quote = None;
                    if q != '`'
                        && let Some(what) = bad_escape(&text[opened + 1..at + i])
                    {
                        return Some((line(opened), what));
                    }
                }
                Some(_) => escaped = false,
                None if text[at + i..].starts_with("}}") => {
                    at += i + 2;
                    closed = true;
                    break;
                }
                None if matches!(c, '"' | '`' | '\'') => {
                    quote = Some(c);
                    opened = at + i;
                }
                None if !c.is_ascii() => return found(at + i, c),
                None => {}
            }
        }
        if !closed {
            return Some((line(action), "unclosed action".to_owned()));
        }
    }
    None
}

/// An escape in a quoted string or character constant that gtmpl's unquoting cannot take: it
/// loops forever on `\u` or `\x` without their hex digits, reads the four or two bytes after
/// one of them whatever they are (cutting a multi-byte character: a panic), and slices two
/// bytes after any backslash.
fn bad_escape(raw: &str) -> Option<String> {
    let mut chars = raw.chars();
    let mut hex_escapes = false;
    while let Some(c) = chars.next() {
        if c != '\\' {
            continue;
        }
        let digits = match chars.next() {
            Some('b' | 'f' | 'n' | 'r' | 't' | '\'' | '"' | '\\') => 0,
            Some('x') => 2,
            Some('u') => 4,
            Some('U') => 8,
            other => {
                return Some(format!(
                    "escape \\{} in a quoted string is not one of \\b \\f \\n \\r \\t \\' \\\" \\\\ \\x \\u \\U",
                    other.map(String::from).unwrap_or_default()
                ));
            }
        };
        hex_escapes |= digits > 0;
        if !(0..digits).all(|_| chars.next().is_some_and(|c| c.is_ascii_hexdigit())) {
            return Some(format!(
                "escape in quoted string {raw:?} lacks its {digits} hex digits"
            ));
        }
    }
    (hex_escapes && !raw.is_ascii())
        .then(|| format!("quoted string {raw:?} with a \\x or \\u escape must be ASCII"))
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::super::render_template;
    use super::super::tests::cidrs;

    /// gtmpl's lexer steps back one byte, not one character: a non-ASCII character inside an
    /// action (a no-break space pasted after `.PodCIDR`, a letter) or right before `{{- ` made
    /// its thread panic and the render fail with "receiving on a closed channel" (found by the
    /// `template` fuzz target).
    #[test]
    fn non_ascii_in_an_action_is_a_template_error_naming_it() {
        let nets = cidrs("10.244.1.0/24");
        for (text, line) in [
            ("{\"subnet\": \"{{.PodCIDR\u{a0}}}\"}", 1),
            ("{\n\"a\": \"{{range \u{711}, $r := .Routes}}{{end}}\"}", 2),
            ("{{\u{a0}\u{a0}.PodCIDR}}", 1),
            ("\"caf\u{e9}\n\n{{- .PodCIDR}}\"", 1),
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(
                err.contains(&format!("line {line}")) && err.contains("non-ASCII"),
                "{text:?}: {err}"
            );
        }
        // Inside quoted strings, comments and plain text they are fine, as in Go.
        let ok = "{{/* r\u{e9}seau */}}{\"n\u{e9}\": {{printf \"%q\" \"\u{e9}\u{a0}\"}}, \"c\": \"{{.PodCIDR}}\"}";
        assert_eq!(
            render_template(ok, &nets).unwrap(),
            "{\"n\u{e9}\": \"\u{e9}\u{a0}\", \"c\": \"10.244.1.0/24\"}"
        );
    }

    /// An action open at the end of the text made gtmpl's lexer loop forever (it steps back past
    /// the end) and the render hang (found by the `template` fuzz target).
    #[test]
    fn an_action_open_at_the_end_is_an_error_not_a_hang() {
        let nets = cidrs("10.244.1.0/24");
        for text in [
            "{\"subnet\": \"{{ .PodCIDR ",
            "{}\n{{+",
            "{}\n\n{{ 1.",
            // gtmpl's quoted string does not end at `\\"`: the action goes on to the end.
            "{{\"\\\\\"}}\" 1.",
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(err.contains("unclosed action"), "{text:?}: {err}");
        }
        let line = render_template("{}\n\n{{ 1.", &nets)
            .unwrap_err()
            .to_string();
        assert!(line.contains("line 3"), "{line}");
    }

    /// gtmpl's unquoting looped forever on `\u` without its four hex digits (found by the
    /// `template` fuzz target) and panics on a backslash before a multi-byte character.
    #[test]
    fn a_bad_escape_in_a_quoted_string_is_an_error_not_a_hang() {
        let nets = cidrs("10.244.1.0/24");
        for text in [
            "{{printf \"%s\\ub  \" .PodCIDR}}",
            "{{print \"\\x4\"}}",
            "{{print \"\\\u{e9}\"}}",
            "{{print \"\\x41a\u{e9}\"}}",
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(
                err.contains("line 1") && err.contains("quoted string"),
                "{text:?}: {err}"
            );
        }
        assert_eq!(
            render_template("{{print \"\\u00e9\\t\\\"\"}}", &nets).unwrap(),
            "\u{e9}\t\""
        );
    }

    #[test]
    fn a_non_ascii_character_before_a_trim_marker_is_named_on_its_line() {
        let nets = cidrs("10.244.1.0/24");
        let err = render_template("{}\n\nx\u{e9} {{- .PodCIDR}}", &nets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3") && err.contains("U+00E9"), "{err}");
    }

    #[test]
    fn comments_are_skipped_exactly_to_their_end() {
        let nets = cidrs("10.244.1.0/24");
        // What follows a comment is still checked, with its line.
        for (text, line) in [
            ("{{/**/}}{{.PodCIDR\u{a0}}}", 1),
            ("{{/* a much longer comment */}}{{.PodCIDR\u{a0}}}", 1),
            ("{{/* a */}}\n{{.PodCIDR\u{a0}}}", 2),
            ("{{- /* a\nb */ -}}\n{{.PodCIDR\u{a0}}}", 3),
        ] {
            let err = render_template(text, &nets).unwrap_err().to_string();
            assert!(
                err.contains(&format!("line {line}")) && err.contains("non-ASCII"),
                "{text:?}: {err}"
            );
        }
        // Whatever a comment holds (even `{{` and a non-ASCII character) is not an action.
        for text in [
            "{{/*/ {{ caf\u{e9} */}}\"{{.PodCIDR}}\"",
            "{{- /*/ {{ caf\u{e9} */ -}} \"{{.PodCIDR}}\"",
        ] {
            assert_eq!(
                render_template(text, &nets).unwrap(),
                "\"10.244.1.0/24\"",
                "{text:?}"
            );
        }
    }

    #[test]
    fn an_escaped_quote_does_not_end_a_quoted_string() {
        let nets = cidrs("10.244.1.0/24");
        assert_eq!(
            render_template("{{print \"a\\\"\u{e9}\"}}", &nets).unwrap(),
            "a\"\u{e9}"
        );
    }

    #[test]
    fn an_action_is_still_checked_after_a_quoted_string() {
        let nets = cidrs("10.244.1.0/24");
        let err = render_template("{{print \"a\" .PodCIDR\u{a0}}}", &nets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1") && err.contains("non-ASCII"), "{err}");
    }

    #[test]
    fn a_newline_in_a_quoted_string_is_the_error_reported() {
        // gtmpl's lexer stops there: what follows is not checked, the string is the error.
        let nets = cidrs("10.244.1.0/24");
        let err = render_template("{{print \"a\n\" \u{e9}}}", &nets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unterminated quoted string"), "{err}");
    }
}
