//! The Huffman code of RFC 7541 Appendix B. The code is canonical (codes of one length are
//! consecutive, in symbol order, and shorter codes come first), so the lengths alone define
//! it: the codes and the decoding tables are derived from them at compile time.

use bytes::{BufMut, BytesMut};

/// Code length in bits of each symbol (0-255, then 256 = EOS), from RFC 7541 Appendix B.
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

const MIN_LEN: usize = 5;
const MAX_LEN: usize = 30;
const EOS: u16 = 256;

/// The canonical tables: symbols by (length, symbol), and per length the first code and
/// where its symbols start in that order.
struct Canonical {
    codes: [u32; 257],
    sorted: [u16; 257],
    /// Per length: one past the last code of that length (codes below it that were not
    /// matched at a shorter length have this length).
    limit: [u32; MAX_LEN + 1],
    /// Per length: `sorted`'s index of its first code, minus that code.
    offset: [i64; MAX_LEN + 1],
}

const CANONICAL: Canonical = canonical();

/// The bits looked up at once: every code of up to this many bits (all letters, digits and
/// the usual punctuation) is decoded by one lookup.
const FAST_BITS: usize = 8;

/// Per value of the next [`FAST_BITS`] bits: the symbol whose code they start with and that
/// code's length, or a length of 0 when the code is longer.
const FAST: [(u8, u8); 1 << FAST_BITS] = fast_table();

const fn fast_table() -> [(u8, u8); 1 << FAST_BITS] {
    let codes = CANONICAL.codes;
    let mut table = [(0u8, 0u8); 1 << FAST_BITS];
    let mut s = 0;
    while s < 256 {
        let len = LENGTHS[s] as usize;
        if len <= FAST_BITS {
            let first = (codes[s] as usize) << (FAST_BITS - len);
            let mut i = 0;
            while i < 1 << (FAST_BITS - len) {
                table[first + i] = (s as u8, len as u8);
                i += 1;
            }
        }
        s += 1;
    }
    table
}

const fn canonical() -> Canonical {
    let mut count = [0u32; MAX_LEN + 1];
    let mut s = 0;
    while s < 257 {
        count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let mut first = [0u32; MAX_LEN + 1];
    let mut start = [0usize; MAX_LEN + 1];
    let mut limit = [0u32; MAX_LEN + 1];
    let mut offset = [0i64; MAX_LEN + 1];
    let mut code = 0u32;
    let mut index = 0usize;
    let mut len = 1;
    while len <= MAX_LEN {
        first[len] = code;
        start[len] = index;
        limit[len] = code + count[len];
        offset[len] = index as i64 - code as i64;
        code = (code + count[len]) << 1;
        index += count[len] as usize;
        len += 1;
    }
    let mut codes = [0u32; 257];
    let mut sorted = [0u16; 257];
    let mut next = first;
    let mut at = start;
    let mut len = 1;
    while len <= MAX_LEN {
        let mut s = 0;
        while s < 257 {
            if LENGTHS[s] as usize == len {
                codes[s] = next[len];
                next[len] += 1;
                sorted[at[len]] = s as u16;
                at[len] += 1;
            }
            s += 1;
        }
        len += 1;
    }
    Canonical {
        codes,
        sorted,
        limit,
        offset,
    }
}

/// Why a Huffman-coded string is refused (RFC 7541 section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    #[error("the Huffman padding is longer than 7 bits or is not the EOS code's prefix")]
    Padding,
    #[error("a Huffman-coded string holds the EOS symbol")]
    Eos,
}

/// The length of `bytes` Huffman-coded, in bytes.
pub fn encoded_len(bytes: &[u8]) -> usize {
    let bits: usize = bytes
        .iter()
        .map(|&b| usize::from(LENGTHS[usize::from(b)]))
        .sum();
    bits.div_ceil(8)
}

/// Appends `bytes` Huffman-coded to `out`, padded with the EOS code's leading ones.
pub fn encode(bytes: &[u8], out: &mut BytesMut) {
    // The codes gather in `acc`, its low `bits` bits not yet written; bits above them are
    // written already and never read again. Written four bytes at a time: fewer than 32 bits
    // are left after each, so the next code (30 bits at most) still fits in 64.
    let mut acc: u64 = 0;
    let mut bits: u32 = 0;
    for &b in bytes {
        let len = u32::from(LENGTHS[usize::from(b)]);
        acc = (acc << len) | u64::from(CANONICAL.codes[usize::from(b)]);
        bits += len;
        if bits >= 32 {
            bits -= 32;
            out.put_u32((acc >> bits) as u32);
        }
    }
    while bits >= 8 {
        bits -= 8;
        out.put_u8((acc >> bits) as u8);
    }
    if bits > 0 {
        out.put_u8(((acc << (8 - bits)) as u8) | (0xff >> bits));
    }
}

/// Appends the decoding of the Huffman-coded `bytes` to `out`.
pub fn decode(bytes: &[u8], out: &mut BytesMut) -> Result<(), HuffmanError> {
    out.reserve(bytes.len() * 8 / 5);
    let mut acc: u64 = 0;
    let mut bits: usize = 0;
    let mut input = bytes.iter();
    loop {
        while bits <= 56 {
            match input.next() {
                Some(&b) => {
                    acc = (acc << 8) | u64::from(b);
                    bits += 8;
                }
                None => break,
            }
        }
        if bits >= FAST_BITS {
            let (symbol, len) = FAST[((acc >> (bits - FAST_BITS)) & 0xff) as usize];
            if len != 0 {
                out.put_u8(symbol);
                bits -= usize::from(len);
                acc &= (1 << bits) - 1;
                continue;
            }
        }
        let mut matched = None;
        let mut len = MIN_LEN;
        while len <= MAX_LEN && len <= bits {
            let code = ((acc >> (bits - len)) & ((1 << len) - 1)) as u32;
            if code < CANONICAL.limit[len] {
                let index = i64::from(code) + CANONICAL.offset[len];
                matched = Some((CANONICAL.sorted[index as usize], len));
                break;
            }
            len += 1;
        }
        match matched {
            Some((EOS, _)) => return Err(HuffmanError::Eos),
            Some((symbol, len)) => {
                out.put_u8(symbol as u8);
                bits -= len;
                acc &= (1 << bits) - 1;
            }
            // The input is all read (more bits than any code's length would have matched):
            // what is left is padding, of at most 7 bits, all ones.
            None => {
                let ones = (1u64 << bits) - 1;
                return if bits <= 7 && acc == ones {
                    Ok(())
                } else {
                    Err(HuffmanError::Padding)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_those_of_the_rfc() {
        // A few rows of RFC 7541 Appendix B.
        assert_eq!(CANONICAL.codes[usize::from(b'0')], 0x0);
        assert_eq!(CANONICAL.codes[usize::from(b'a')], 0x3);
        assert_eq!(CANONICAL.codes[usize::from(b' ')], 0x14);
        assert_eq!(CANONICAL.codes[usize::from(b'!')], 0x3f8);
        assert_eq!(CANONICAL.codes[0], 0x1ff8);
        assert_eq!(CANONICAL.codes[255], 0x3ffffee);
        assert_eq!(CANONICAL.codes[256], 0x3fffffff);
    }

    #[test]
    fn the_fast_table_holds_the_short_codes() {
        let short = (0..256)
            .filter(|&s| usize::from(LENGTHS[s]) <= FAST_BITS)
            .count();
        let filled = FAST.iter().filter(|(_, len)| *len != 0).count();
        // Each short code fills 2^(8 - length) entries; the rest are longer codes' prefixes.
        let expected: usize = (0..256)
            .filter(|&s| usize::from(LENGTHS[s]) <= FAST_BITS)
            .map(|s| 1 << (FAST_BITS - usize::from(LENGTHS[s])))
            .sum();
        assert_eq!(filled, expected);
        assert_eq!(short, 74);
        assert_eq!(FAST[0], (b'0', 5));
        assert_eq!(FAST[0xff], (0, 0));
    }

    #[test]
    fn every_byte_goes_through_and_back() {
        let all: Vec<u8> = (0..=255).chain((0..=255).rev()).collect();
        let mut coded = BytesMut::new();
        encode(&all, &mut coded);
        assert_eq!(coded.len(), encoded_len(&all));
        let mut back = BytesMut::new();
        decode(&coded, &mut back).expect("decodes");
        assert_eq!(&back[..], &all[..]);
    }

    #[test]
    fn strings_of_every_length_go_through_and_back() {
        // Short and long codes mixed, so that the four-byte writes fall at every offset.
        let mixed: Vec<u8> = (0..80u8)
            .map(|i| [b'a', 0, b'/', 255, b'7', 200, b'e'][usize::from(i) % 7] ^ (i & 1))
            .collect();
        for n in 0..=mixed.len() {
            let mut coded = BytesMut::new();
            encode(&mixed[..n], &mut coded);
            assert_eq!(coded.len(), encoded_len(&mixed[..n]), "length {n}");
            let mut back = BytesMut::new();
            decode(&coded, &mut back).expect("decodes");
            assert_eq!(&back[..], &mixed[..n], "length {n}");
        }
    }

    #[test]
    fn the_rfc_example_decodes() {
        // RFC 7541 C.4.1: "www.example.com".
        let coded = [
            0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        let mut out = BytesMut::new();
        decode(&coded, &mut out).expect("decodes");
        assert_eq!(&out[..], b"www.example.com");
        let mut again = BytesMut::new();
        encode(b"www.example.com", &mut again);
        assert_eq!(&again[..], &coded[..]);
    }

    #[test]
    fn bad_padding_and_eos_are_refused() {
        // Eight ones: padding longer than 7 bits.
        let mut out = BytesMut::new();
        assert_eq!(decode(&[0xff], &mut out), Err(HuffmanError::Padding));
        // '0' (00000) then padding of zeros.
        assert_eq!(decode(&[0x00], &mut out), Err(HuffmanError::Padding));
        // The EOS code itself (30 ones) then two ones of padding.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut out),
            Err(HuffmanError::Eos)
        );
        // '0' then three ones: fine.
        out.clear();
        decode(&[0x07], &mut out).expect("decodes");
        assert_eq!(&out[..], b"0");
        // Empty is the empty string.
        out.clear();
        decode(&[], &mut out).expect("decodes");
        assert!(out.is_empty());
    }
}
