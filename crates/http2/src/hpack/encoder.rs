//! Header blocks written (RFC 7541 sections 4 and 6). Fields whose values repeat across
//! messages go into the dynamic table; those unique to one message (paths, lengths, dates,
//! validators) are written without indexing so that they do not push the others out, and
//! credentials are never indexed (RFC 7541 section 7.1.3).

use std::cell::RefCell;

use bytes::{BufMut, Bytes, BytesMut};

use super::huffman;
use super::static_table::{self, StaticMatch};
use super::table::{DynamicTable, Entry};

/// How a field is written, as RFC 7541 section 6.2 names the literal forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Indexing {
    Incremental,
    Without,
    Never,
}

/// A connection's HPACK encoder.
#[derive(Debug)]
pub struct Encoder {
    table: DynamicTable,
    /// The most of the peer's table this side uses (less than it allows keeps the state per
    /// connection small).
    cap: usize,
    /// Size updates owed at the next block's start: the smallest since the last block,
    /// then the one in force (RFC 7541 section 4.2).
    pending: Option<(usize, usize)>,
    /// For each of the last block's first fields, the index it was written as, whole (0: it
    /// was not). A connection's messages mostly repeat their fields, in the same order: the
    /// next block's field at the same place is compared with that one entry first, before
    /// it is classified and looked for in both tables.
    hints: [u8; HINTED],
}

/// How many of a block's fields have a hint: more than a typical message has.
const HINTED: usize = 16;

/// HTTP/2's initial `SETTINGS_HEADER_TABLE_SIZE`.
pub const DEFAULT_TABLE_SIZE: usize = 4096;

impl Encoder {
    /// An encoder that uses at most `cap` bytes of the peer's table.
    pub fn new(cap: usize) -> Self {
        let size = cap.min(DEFAULT_TABLE_SIZE);
        Encoder {
            table: DynamicTable::new(size),
            cap,
            // The decoder starts at the default: a smaller table is announced first.
            pending: (size != DEFAULT_TABLE_SIZE).then_some((size, size)),
            hints: [0; HINTED],
        }
    }

    /// The peer's `SETTINGS_HEADER_TABLE_SIZE`.
    pub fn set_peer_limit(&mut self, limit: usize) {
        let size = limit.min(self.cap);
        if size == self.table.max_size() && self.pending.is_none() {
            return;
        }
        self.table.set_max_size(size);
        let smallest = self.pending.map_or(size, |(low, _)| low.min(size));
        self.pending = Some((smallest, size));
    }

    /// Writes `fields` (name, value, sensitive) as one header block. Names are written as
    /// given: HTTP/2 wants them in lowercase.
    pub fn encode<'a>(
        &mut self,
        fields: impl IntoIterator<Item = (&'a [u8], &'a [u8], bool)>,
        out: &mut BytesMut,
    ) {
        if let Some((smallest, last)) = self.pending.take() {
            integer(smallest, 5, 0x20, out);
            if last != smallest {
                integer(last, 5, 0x20, out);
            }
        }
        for (at, (name, value, sensitive)) in fields.into_iter().enumerate() {
            let Some(hint) = self.hints.get_mut(at) else {
                self.field(name, value, sensitive, out);
                continue;
            };
            // A field the encoder wrote whole was no credential (those are never indexed);
            // the same name and value are none now, unless the caller says so.
            if !sensitive && holds(&self.table, *hint, name, value) {
                integer(usize::from(*hint), 7, 0x80, out);
                continue;
            }
            let whole = self.field(name, value, sensitive, out);
            // An index past a byte's range (only in a table of several KiB) keeps no hint.
            self.hints[at] = whole
                .and_then(|index| u8::try_from(index).ok())
                .unwrap_or(0);
        }
    }

    /// Writes one field: the index it was written as whole, if it was.
    fn field(
        &mut self,
        name: &[u8],
        value: &[u8],
        sensitive: bool,
        out: &mut BytesMut,
    ) -> Option<usize> {
        let indexing = indexing(name, value, sensitive, self.table.max_size());
        let found = static_table::find(name, value);
        if indexing != Indexing::Never {
            if let Some(StaticMatch::Field(index)) = found {
                integer(index, 7, 0x80, out);
                return Some(index);
            }
            // Only a field written with incremental indexing is looked for in the table: a
            // date's or a length's never went in. (One that went in before the peer shrank
            // the table, and is now too large to index, is written as a literal: as valid,
            // a few bytes longer.)
            if indexing == Indexing::Incremental
                && let Some(at) = self
                    .table
                    .entries()
                    .position(|e| e.name == name && e.value == value)
            {
                integer(62 + at, 7, 0x80, out);
                return Some(62 + at);
            }
        }
        let name_index = match found {
            Some(StaticMatch::Field(index) | StaticMatch::Name(index)) => Some(index),
            None => self
                .table
                .entries()
                .position(|e| e.name == name)
                .map(|at| 62 + at),
        };
        let (prefix, flag) = match indexing {
            Indexing::Incremental => (6, 0x40),
            Indexing::Without => (4, 0x00),
            Indexing::Never => (4, 0x10),
        };
        match name_index {
            Some(index) => integer(index, prefix, flag, out),
            None => {
                out.put_u8(flag);
                string(name, out);
            }
        }
        if name == b"date" {
            date_string(value, out);
        } else {
            string(value, out);
        }
        if indexing == Indexing::Incremental {
            self.table.insert(Entry {
                name: Bytes::copy_from_slice(name),
                value: Bytes::copy_from_slice(value),
            });
        }
        None
    }
}

/// Whether the entry at `index` (in the static table, then the dynamic one; 0 is none) is
/// `name: value`.
fn holds(table: &DynamicTable, index: u8, name: &[u8], value: &[u8]) -> bool {
    match usize::from(index) {
        0 => false,
        index @ 1..=61 => static_table::STATIC[index - 1] == (name, value),
        index => (table.get(index - 62)).is_some_and(|e| e.name == name && e.value == value),
    }
}

/// Which literal form a field not found whole in a table takes.
fn indexing(name: &[u8], value: &[u8], sensitive: bool, table_size: usize) -> Indexing {
    // Credentials: never in a table, where a later field could probe for them. A short
    // cookie is as easily guessed (RFC 7541 section 7.1.3).
    let credential = matches!(name, b"authorization" | b"proxy-authorization")
        || (name == b"cookie" && value.len() < 20);
    if sensitive || credential {
        return Indexing::Never;
    }
    // One message's own values: indexing them would only evict fields that repeat.
    let unique = matches!(
        name,
        b":path"
            | b"content-length"
            | b"date"
            | b"age"
            | b"etag"
            | b"last-modified"
            | b"if-modified-since"
            | b"if-none-match"
            | b"location"
            | b"set-cookie"
            | b"x-request-id"
            | b"traceparent"
    );
    // A field over three quarters of the table would empty it for little gain.
    if unique || (name.len() + value.len() + 32) * 4 > table_size * 3 {
        Indexing::Without
    } else {
        Indexing::Incremental
    }
}

/// An integer with an `n`-bit prefix, the prefix's other bits set to `flag`.
fn integer(value: usize, n: u8, flag: u8, out: &mut BytesMut) {
    let max = (1usize << n) - 1;
    if value < max {
        out.put_u8(flag | value as u8);
        return;
    }
    out.put_u8(flag | max as u8);
    let mut rest = value - max;
    while rest >= 0x80 {
        out.put_u8((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.put_u8(rest as u8);
}

/// The longest `date` value whose coding is kept: an IMF-fixdate is 29 bytes.
const DATE_KEPT: usize = 32;

/// The last `date` value a thread wrote, and its string literal.
struct LastDate {
    value: [u8; DATE_KEPT],
    value_len: usize,
    /// At most a length byte and the value itself: `string` writes the shorter form.
    literal: [u8; DATE_KEPT + 1],
    literal_len: usize,
}

/// `date`'s string literal. Every response in a second has the same value, and each would
/// otherwise be Huffman-coded again (most of the coding of a typical response's fields): the
/// thread keeps the last one's literal and copies it while the value lasts.
fn date_string(value: &[u8], out: &mut BytesMut) {
    thread_local! {
        static LAST: RefCell<LastDate> = const {
            RefCell::new(LastDate {
                value: [0; DATE_KEPT],
                value_len: 0,
                literal: [0; DATE_KEPT + 1],
                literal_len: 0,
            })
        };
    }
    if value.len() > DATE_KEPT {
        string(value, out);
        return;
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        // A literal is never empty (its length comes first): none kept yet is no match, even
        // for an empty value.
        if last.literal_len != 0
            && last.value_len == value.len()
            && last.value[..value.len()] == *value
        {
            out.put_slice(&last.literal[..last.literal_len]);
            return;
        }
        let start = out.len();
        string(value, out);
        let literal = &out[start..];
        // Always fits (see `literal`); checked all the same, so a wrong guess only costs
        // the copy.
        if literal.len() <= DATE_KEPT + 1 {
            let last = &mut *last;
            last.literal[..literal.len()].copy_from_slice(literal);
            last.literal_len = literal.len();
            last.value[..value.len()].copy_from_slice(value);
            last.value_len = value.len();
        }
    });
}

/// A string literal, Huffman-coded when that is shorter.
fn string(bytes: &[u8], out: &mut BytesMut) {
    let coded = huffman::encoded_len(bytes);
    if coded < bytes.len() {
        integer(coded, 7, 0x80, out);
        huffman::encode(bytes, out);
    } else {
        integer(bytes.len(), 7, 0x00, out);
        out.put_slice(bytes);
    }
}
