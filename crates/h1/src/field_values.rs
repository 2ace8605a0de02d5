//! Header field values that requests and responses read alike.

/// `1*DIGIT`, without a sign or spaces, that fits a u64 (`Content-Length`).
pub(crate) fn parse_length(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |len, &d| {
        if !d.is_ascii_digit() {
            return None;
        }
        len.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Whether a comma-separated list holds `token` (case-insensitive): `Connection: close`.
pub(crate) fn has_token(list: &[u8], token: &[u8]) -> bool {
    list.split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}
