//! The static table of RFC 7541 Appendix A, and the encoder's lookups in it.

/// Entries 1 to 61 (index 0 of this array is entry 1).
pub const STATIC: [(&[u8], &[u8]); 61] = [
    (b":authority", b""),
    (b":method", b"GET"),
    (b":method", b"POST"),
    (b":path", b"/"),
    (b":path", b"/index.html"),
    (b":scheme", b"http"),
    (b":scheme", b"https"),
    (b":status", b"200"),
    (b":status", b"204"),
    (b":status", b"206"),
    (b":status", b"304"),
    (b":status", b"400"),
    (b":status", b"404"),
    (b":status", b"500"),
    (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""),
    (b"accept-ranges", b""),
    (b"accept", b""),
    (b"access-control-allow-origin", b""),
    (b"age", b""),
    (b"allow", b""),
    (b"authorization", b""),
    (b"cache-control", b""),
    (b"content-disposition", b""),
    (b"content-encoding", b""),
    (b"content-language", b""),
    (b"content-length", b""),
    (b"content-location", b""),
    (b"content-range", b""),
    (b"content-type", b""),
    (b"cookie", b""),
    (b"date", b""),
    (b"etag", b""),
    (b"expect", b""),
    (b"expires", b""),
    (b"from", b""),
    (b"host", b""),
    (b"if-match", b""),
    (b"if-modified-since", b""),
    (b"if-none-match", b""),
    (b"if-range", b""),
    (b"if-unmodified-since", b""),
    (b"last-modified", b""),
    (b"link", b""),
    (b"location", b""),
    (b"max-forwards", b""),
    (b"proxy-authenticate", b""),
    (b"proxy-authorization", b""),
    (b"range", b""),
    (b"referer", b""),
    (b"refresh", b""),
    (b"retry-after", b""),
    (b"server", b""),
    (b"set-cookie", b""),
    (b"strict-transport-security", b""),
    (b"transfer-encoding", b""),
    (b"user-agent", b""),
    (b"vary", b""),
    (b"via", b""),
    (b"www-authenticate", b""),
];

/// How a field matches the static table: its entry for name and value, or the first entry
/// with its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaticMatch {
    Field(usize),
    Name(usize),
}

/// The static table's best match for `name: value` (indices from 1).
pub fn find(name: &[u8], value: &[u8]) -> Option<StaticMatch> {
    let (first, count) = name_range(name)?;
    for index in first..first + count {
        if STATIC[index - 1].1 == value {
            return Some(StaticMatch::Field(index));
        }
    }
    Some(StaticMatch::Name(first))
}

/// The first index with this name and how many entries have it.
fn name_range(name: &[u8]) -> Option<(usize, usize)> {
    // The names with several entries; the rest have one each, found by a scan.
    match name {
        b":method" => return Some((2, 2)),
        b":path" => return Some((4, 2)),
        b":scheme" => return Some((6, 2)),
        b":status" => return Some((8, 7)),
        _ => {}
    }
    STATIC
        .iter()
        .position(|(n, _)| *n == name)
        .map(|at| (at + 1, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_several_entries_are_where_the_table_has_them() {
        for (index, (name, value)) in STATIC.iter().enumerate() {
            assert_eq!(find(name, value), Some(StaticMatch::Field(index + 1)));
        }
        assert_eq!(find(b":status", b"418"), Some(StaticMatch::Name(8)));
        assert_eq!(find(b"user-agent", b"curl"), Some(StaticMatch::Name(58)));
        assert_eq!(find(b"x-custom", b""), None);
    }
}
