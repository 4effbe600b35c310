//! `printf` for templates as Go's `fmt.Sprintf` behaves, where gtmpl's differs or panics.

/// `printf` as Go's where gtmpl's differs: `%%` is a literal `%` (gtmpl prints `%%`), and a
/// plain `%q` of a string quotes it as `strconv.Quote` does (gtmpl leaves the quotes out), so
/// `"subnet": {{printf "%q" .PodCIDR}}` renders the same JSON as with containerd. Each other
/// verb is formatted by gtmpl, one at a time; formats this cannot split (see [`format_pieces`])
/// or with too few or too many values go to gtmpl as they are.
pub(super) fn go_printf(args: &[gtmpl::Value]) -> Result<gtmpl::Value, gtmpl::FuncError> {
    if let Some(gtmpl::Value::String(format)) = args.first()
        && let Some(n) = oversized_width(format)
    {
        return Err(gtmpl::FuncError::Generic(format!(
            "printf: width or precision {n} in {format:?} is larger than {}",
            u16::MAX
        )));
    }
    let Some((gtmpl::Value::String(format), values)) = args.split_first() else {
        return gtmpl::funcs::printf(args);
    };
    let Some(pieces) = format_pieces(format) else {
        return gtmpl::funcs::printf(args);
    };
    let verbs = pieces
        .iter()
        .filter(|p| matches!(p, FormatPiece::Verb(_)))
        .count();
    if verbs != values.len() {
        return gtmpl::funcs::printf(args);
    }
    let mut out = String::new();
    let mut values = values.iter();
    for piece in pieces {
        match piece {
            FormatPiece::Text(text) => out.push_str(&text),
            FormatPiece::Verb(verb) => {
                let Some(value) = values.next() else {
                    return gtmpl::funcs::printf(args);
                };
                match value {
                    gtmpl::Value::String(text) if verb == "%q" => out.push_str(&go_quote(text)),
                    _ => {
                        let one =
                            gtmpl::funcs::printf(&[gtmpl::Value::String(verb), value.clone()])?;
                        out.push_str(&one.to_string());
                    }
                }
            }
        }
    }
    Ok(gtmpl::Value::String(out))
}

/// A width or precision in a printf format that gtmpl would hand to Rust's formatter, which
/// panics above `u16::MAX` (found by the `template` fuzz target: `%2010201s`).
fn oversized_width(format: &str) -> Option<u64> {
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' || chars.next_if_eq(&'%').is_some() {
            continue;
        }
        let mut number = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_ascii_alphabetic() && *c != '%') {
            if c.is_ascii_digit() {
                number.push(c);
                continue;
            }
            if let Some(n) = too_large(&number) {
                return Some(n);
            }
            number.clear();
        }
        if let Some(n) = too_large(&number) {
            return Some(n);
        }
    }
    None
}

fn too_large(digits: &str) -> Option<u64> {
    let n = digits.parse::<u64>().unwrap_or(u64::MAX);
    (!digits.is_empty() && n > u64::from(u16::MAX)).then_some(n)
}

#[derive(Debug, PartialEq)]
enum FormatPiece {
    /// Literal text (`%%` already turned into `%`).
    Text(String),
    /// One verb with its flags, width and precision, e.g. `%-8.3s`.
    Verb(String),
}

/// Splits a printf format into literal text and verbs; `None` when it is not one this can
/// split (a `*` width or precision, an explicit argument index `[n]`, a `%` without a verb).
fn format_pieces(format: &str) -> Option<Vec<FormatPiece>> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.next_if_eq(&'%').is_some() {
            text.push('%');
            continue;
        }
        let mut verb = String::from("%");
        loop {
            let next = chars.next()?;
            if next == '*' || next == '[' {
                return None;
            }
            verb.push(next);
            if next.is_ascii_alphabetic() {
                break;
            }
        }
        if !text.is_empty() {
            pieces.push(FormatPiece::Text(std::mem::take(&mut text)));
        }
        pieces.push(FormatPiece::Verb(verb));
    }
    if !text.is_empty() {
        pieces.push(FormatPiece::Text(text));
    }
    Some(pieces)
}

/// Go's `strconv.Quote`: double quotes, with `"`, `\` and control characters escaped as Go
/// escapes them (other characters Go deems unprintable, e.g. U+00A0, are kept as they are).
fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if u32::from(c) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
#[expect(clippy::unwrap_used, reason = "tests fail loudly on unexpected input")]
mod tests {
    use super::super::render_template;
    use super::super::tests::cidrs;
    use super::{FormatPiece, format_pieces, go_quote, oversized_width};

    #[test]
    fn widths_above_u16_max_are_found_and_nothing_else() {
        assert_eq!(oversized_width("%65535d"), None);
        assert_eq!(oversized_width("%65536d"), Some(65_536));
        assert_eq!(oversized_width("%-8.70000s"), Some(70_000));
        // Digits that are not a width: after a literal `%%`, after a verb, in plain text.
        assert_eq!(oversized_width("%%70000d"), None);
        assert_eq!(oversized_width("%d 70000"), None);
        assert_eq!(oversized_width("width 70000 px"), None);
    }

    #[test]
    fn printf_q_quotes_like_go() {
        let out = render_template(
            r#"{{printf "%q" .PodCIDR}} {{printf "%q|%s|%d%%" .PodCIDR .PodCIDR 7}} {{printf "%v" 1}}"#,
            &cidrs("10.244.1.0/24"),
        )
        .unwrap();
        assert_eq!(out, r#""10.244.1.0/24" "10.244.1.0/24"|10.244.1.0/24|7% 1"#);
        assert_eq!(go_quote("a\"b\\c\n\u{1}\u{7}"), r#""a\"b\\c\n\x01\a""#);
        // A space is printable; a C1 control character is escaped as Go does.
        assert_eq!(go_quote("a b\u{7f}\u{85}"), r#""a b\x7f\u0085""#);
        let out = render_template(
            r#"[{{printf "%-6s|%5.1f" "ab" 2.25}}]"#,
            &cidrs("10.0.0.0/8"),
        );
        assert_eq!(out.unwrap(), "[ab    |  2.2]");
    }

    #[test]
    fn printf_formats_are_split_into_text_and_verbs() {
        use FormatPiece::{Text, Verb};
        assert_eq!(
            format_pieces("a%%b%-8.2fc%q"),
            Some(vec![
                Text("a%b".into()),
                Verb("%-8.2f".into()),
                Text("c".into()),
                Verb("%q".into())
            ])
        );
        assert_eq!(format_pieces("100%"), None);
        assert_eq!(format_pieces("%*d"), None);
        assert_eq!(format_pieces("%[1]d"), None);
    }

    /// A printf width above `u16::MAX` made gtmpl's printf panic in the rendering thread (found
    /// by the `template` fuzz target).
    #[test]
    fn printf_with_a_huge_width_is_an_error_not_a_panic() {
        let nets = cidrs("10.244.1.0/24");
        for format in ["%2010201s", "%-1.70000s", "%d %99999999999999999999999s"] {
            let text = format!("{{{{printf \"{format}\" 12 .PodCIDR}}}}");
            let err = render_template(&text, &nets).unwrap_err().to_string();
            assert!(err.contains("larger than 65535"), "{format}: {err}");
        }
        assert_eq!(
            render_template("{{printf \"%.3s|%d%%\" .PodCIDR 7}}", &nets).unwrap(),
            "10.|7%"
        );
    }
}
