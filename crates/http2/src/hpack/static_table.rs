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
    // The names with several entries; the rest have one each.
    match name {
        b":method" => return Some((2, 2)),
        b":path" => return Some((4, 2)),
        b":scheme" => return Some((6, 2)),
        b":status" => return Some((8, 7)),
        _ => {}
    }
    // The rest by their length first: a few comparisons, not a scan of the table.
    let candidates: &[usize] = match name.len() {
        3 => &[21, 60],
        4 => &[33, 34, 37, 38, 45, 59],
        5 => &[22, 50],
        6 => &[19, 32, 35, 54],
        7 => &[36, 51, 52],
        8 => &[39, 42, 46],
        10 => &[1, 55, 58],
        11 => &[53],
        12 => &[31, 47],
        13 => &[18, 23, 24, 30, 41, 44],
        14 => &[15, 28],
        15 => &[16, 17],
        16 => &[26, 27, 29, 61],
        17 => &[40, 57],
        18 => &[48],
        19 => &[25, 43, 49],
        25 => &[56],
        27 => &[20],
        _ => &[],
    };
    (candidates.iter())
        .find(|&&index| STATIC[index - 1].0 == name)
        .map(|&index| (index, 1))
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

    #[test]
    fn every_name_is_found_at_its_first_entry() {
        for (index, (name, _)) in STATIC.iter().enumerate() {
            let first = STATIC.iter().position(|(n, _)| n == name).unwrap() + 1;
            let found = find(name, b"no such value");
            assert_eq!(found, Some(StaticMatch::Name(first)), "{index}");
        }
        assert_eq!(find(b"content-lengtx", b""), None);
    }
}
