//! A header named in a format (access log lines, span names): Envoy's `%REQ(...)%` and
//! `%RESP(...)%` operators.

/// A header a format shows (Envoy's `%REQ(...)%` and `%RESP(...)%`): `name`, or
/// `alternative` where the message has no `name`, cut to `max_len` bytes. Names are
/// lowercase; a request's pseudo-headers (`:method`, `:path`, `:authority`, `:scheme`) are
/// its method, path with query, host and scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    pub name: String,
    pub alternative: Option<String>,
    pub max_len: Option<usize>,
}

impl HeaderField {
    /// `NAME?ALTERNATIVE):MAX` after `REQ(` or `RESP(`.
    pub(crate) fn parse(operator: &str, args: &str, request: bool) -> Result<HeaderField, String> {
        let (inside, rest) = args
            .split_once(')')
            .ok_or_else(|| format!("`%{operator}(...)%` has no closing `)`"))?;
        let max_len = match rest {
            "" => None,
            _ => Some(
                rest.strip_prefix(':')
                    .and_then(|n| n.parse::<usize>().ok())
                    .ok_or_else(|| {
                        format!("`%{operator}({inside}){rest}%`: expected `:LENGTH` after `)`")
                    })?,
            ),
        };
        let (name, alternative) = match inside.split_once('?') {
            Some((name, alternative)) => (name, Some(alternative)),
            None => (inside, None),
        };
        let check = |name: &str| -> Result<String, String> {
            let lower = name.trim().to_ascii_lowercase();
            let pseudo = [":method", ":path", ":authority", ":scheme"];
            let valid = if lower.starts_with(':') {
                request && pseudo.contains(&lower.as_str())
            } else {
                http::HeaderName::from_bytes(lower.as_bytes()).is_ok()
            };
            if valid {
                Ok(lower)
            } else {
                Err(format!(
                    "`%{operator}({inside})%`: `{name}` is not a header it can show"
                ))
            }
        };
        Ok(HeaderField {
            name: check(name)?,
            alternative: alternative.map(check).transpose()?,
            max_len,
        })
    }

    pub(crate) fn text(&self, operator: &str) -> String {
        let mut text = format!("{operator}({}", self.name);
        if let Some(alternative) = &self.alternative {
            text.push('?');
            text.push_str(alternative);
        }
        text.push(')');
        if let Some(max) = self.max_len {
            text.push_str(&format!(":{max}"));
        }
        text
    }
}
