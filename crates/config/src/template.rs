//! Text with `%NAME%` placeholders, as access log formats and header values write it: read
//! into literal and named parts once at load, and written back the same way for
//! `/config_dump`. `%%` is a literal `%`.

/// Parses `text` into parts: literal runs made by `literal`, and each `%NAME%` as the part
/// `known` gives for it. `kind` names a placeholder in errors ("field", "variable").
pub(crate) fn parse<T: Clone>(
    text: &str,
    known: &[(&str, T)],
    literal: impl Fn(String) -> T,
    kind: &str,
) -> Result<Vec<T>, String> {
    parse_with(text, known, |_| Ok(None), literal, kind)
}

/// As [`parse`], with `operator` trying each placeholder `known` does not name first (for
/// operators with arguments, `%REQ(user-agent)%`): `Ok(None)` when it is not one of its.
pub(crate) fn parse_with<T: Clone>(
    text: &str,
    known: &[(&str, T)],
    operator: impl Fn(&str) -> Result<Option<T>, String>,
    literal: impl Fn(String) -> T,
    kind: &str,
) -> Result<Vec<T>, String> {
    let mut parts = Vec::new();
    let mut run = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('%') {
        run.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let end = after
            .find('%')
            .ok_or_else(|| format!("unterminated `%` in `{text}` (write `%%` for a `%`)"))?;
        let name = &after[..end];
        if name.is_empty() {
            run.push('%');
        } else {
            let part = match known.iter().find(|(n, _)| *n == name) {
                Some((_, part)) => part.clone(),
                None => operator(name)?.ok_or_else(|| {
                    let names: Vec<&str> = known.iter().map(|(n, _)| *n).collect();
                    format!("unknown {kind} `%{name}%`; known: {}", names.join(", "))
                })?,
            };
            if !run.is_empty() {
                parts.push(literal(std::mem::take(&mut run)));
            }
            parts.push(part);
        }
        rest = &after[end + 1..];
    }
    run.push_str(rest);
    if !run.is_empty() {
        parts.push(literal(run));
    }
    Ok(parts)
}

/// The text `parts` were parsed from. `as_literal` gives a literal part's text, `None` for a
/// named one.
pub(crate) fn write<T: PartialEq>(
    parts: &[T],
    known: &[(&str, T)],
    as_literal: impl Fn(&T) -> Option<&str>,
) -> String {
    write_with(parts, known, |_| None, as_literal)
}

/// As [`write`], with `operator` giving the placeholder text of parts `known` does not name.
pub(crate) fn write_with<T: PartialEq>(
    parts: &[T],
    known: &[(&str, T)],
    operator: impl Fn(&T) -> Option<String>,
    as_literal: impl Fn(&T) -> Option<&str>,
) -> String {
    let mut text = String::new();
    for part in parts {
        match as_literal(part) {
            Some(literal) => text.push_str(&literal.replace('%', "%%")),
            None => {
                let name = known
                    .iter()
                    .find(|(_, p)| p == part)
                    .map(|(name, _)| (*name).to_owned())
                    .or_else(|| operator(part));
                if let Some(name) = name {
                    text.push('%');
                    text.push_str(&name);
                    text.push('%');
                }
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    enum Part {
        Text(String),
        Id,
        Host,
    }

    const KNOWN: [(&str, Part); 2] = [("ID", Part::Id), ("HOST", Part::Host)];

    fn literal(part: &Part) -> Option<&str> {
        match part {
            Part::Text(text) => Some(text),
            _ => None,
        }
    }

    #[test]
    fn parses_names_and_literals_and_writes_them_back() {
        let text = "a%ID%%%b%HOST%%ID%";
        let parts = parse(text, &KNOWN, Part::Text, "field").unwrap();
        assert_eq!(
            parts,
            vec![
                Part::Text("a".into()),
                Part::Id,
                Part::Text("%b".into()),
                Part::Host,
                Part::Id
            ]
        );
        assert_eq!(write(&parts, &KNOWN, literal), text);
    }

    #[test]
    fn says_which_placeholder_is_wrong() {
        let unknown = parse("x %NOPE% y", &KNOWN, Part::Text, "variable").unwrap_err();
        assert!(
            unknown.contains("unknown variable `%NOPE%`; known: ID, HOST"),
            "{unknown}"
        );
        let open = parse("50% off", &KNOWN, Part::Text, "field").unwrap_err();
        assert!(open.contains("unterminated"), "{open}");
    }
}
