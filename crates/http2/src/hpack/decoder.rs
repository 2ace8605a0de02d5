//! Header blocks read (RFC 7541 sections 3 and 6), with the table bounded by the size this
//! side announced and the fields handed on bounded by the header list size.

use bytes::{Bytes, BytesMut};

use super::huffman::{self, HuffmanError};
use super::static_table::STATIC;
use super::table::{DynamicTable, ENTRY_OVERHEAD, Entry};

/// Why a header block could not be read. All but [`DecodeError::HeaderListTooLarge`] leave
/// the two sides' tables out of step: the connection ends with `COMPRESSION_ERROR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("index {0} is in neither table")]
    InvalidIndex(usize),
    #[error("an integer of more than 4 continuation bytes")]
    IntegerOverflow,
    #[error("the block ends inside a representation")]
    Truncated,
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
    #[error("a dynamic table size update after a field")]
    SizeUpdateNotFirst,
    #[error("a dynamic table size update to {asked} bytes, over the {limit} allowed")]
    SizeUpdateOverLimit { asked: usize, limit: usize },
    #[error("the block does not start with the table size update the smaller limit needs")]
    SizeUpdateMissing,
    /// The fields are over the limit: the block was read to its end (the table is in step)
    /// but not all of it was handed on. The stream is refused; the connection goes on.
    #[error("header list over {limit} bytes")]
    HeaderListTooLarge { limit: usize },
}

impl DecodeError {
    /// Whether the connection must end (`COMPRESSION_ERROR`) rather than one stream.
    pub fn is_connection_error(&self) -> bool {
        !matches!(self, DecodeError::HeaderListTooLarge { .. })
    }
}

/// One field of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: Bytes,
    pub value: Bytes,
    /// Sent as never indexed (RFC 7541 section 6.2.3): a proxy passes it on as such.
    pub never_indexed: bool,
}

impl Field {
    /// Its size as the header list size counts it (RFC 9113 section 6.5.2).
    pub fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

/// A connection's HPACK decoder.
#[derive(Debug)]
pub struct Decoder {
    table: DynamicTable,
    /// The table size this side allows (its `SETTINGS_HEADER_TABLE_SIZE`, once acknowledged).
    limit: usize,
    /// The limit was lowered below the table's size: the next block must say so first.
    update_due: bool,
}

impl Decoder {
    /// A decoder whose table may grow to `limit` bytes. Until the peer acknowledges this
    /// side's SETTINGS it encodes for HTTP/2's default, 4,096: a connection starts its
    /// decoder at that and calls [`Decoder::set_limit`] with its own on the
    /// acknowledgement.
    pub fn new(limit: usize) -> Self {
        Decoder {
            table: DynamicTable::new(limit),
            limit,
            update_due: false,
        }
    }

    /// A new limit, in effect once the peer has acknowledged the setting that announced it.
    pub fn set_limit(&mut self, limit: usize) {
        if limit < self.table.max_size() {
            self.update_due = true;
        }
        self.limit = limit;
    }

    /// The dynamic table's entries and their size, for tests and stats.
    pub fn table_len(&self) -> usize {
        self.table.len()
    }

    /// Reads `block` (a whole header block: HEADERS and its CONTINUATIONs), handing each
    /// field to `emit` while the list stays within `max_list_size` bytes. The block is read to
    /// its end either way, so that the table stays in step with the encoder's.
    pub fn decode(
        &mut self,
        block: &Bytes,
        max_list_size: usize,
        mut emit: impl FnMut(Field),
    ) -> Result<(), DecodeError> {
        let mut reader = Reader { block, at: 0 };
        let mut list_size = 0usize;
        let mut over = false;
        let mut first = true;
        // Huffman-coded strings not added to the table are decoded into one buffer per
        // block, split off as they are read.
        let mut decoded = BytesMut::new();
        while let Some(&byte) = block.get(reader.at) {
            let field = if byte & 0x80 != 0 {
                let index = reader.integer(7)?;
                let (name, value) = self.entry(index)?;
                Field {
                    name,
                    value,
                    never_indexed: false,
                }
            } else if byte & 0xc0 == 0x40 {
                let (name, value) = self.literal(&mut reader, 6, &mut decoded)?;
                // Added in one allocation of its own, so that the table keeps no frame
                // buffer alive.
                let mut both = BytesMut::with_capacity(name.len() + value.len());
                both.extend_from_slice(&name);
                both.extend_from_slice(&value);
                let mut both = both.freeze();
                let name = both.split_to(name.len());
                let entry = Entry { name, value: both };
                self.table.insert(entry.clone());
                Field {
                    name: entry.name,
                    value: entry.value,
                    never_indexed: false,
                }
            } else if byte & 0xe0 == 0x20 {
                if !first {
                    return Err(DecodeError::SizeUpdateNotFirst);
                }
                let asked = reader.integer(5)?;
                if asked > self.limit {
                    return Err(DecodeError::SizeUpdateOverLimit {
                        asked,
                        limit: self.limit,
                    });
                }
                self.table.set_max_size(asked);
                self.update_due = false;
                continue;
            } else {
                // 0001xxxx never indexed, 0000xxxx without indexing.
                let never_indexed = byte & 0x10 != 0;
                let (name, value) = self.literal(&mut reader, 4, &mut decoded)?;
                Field {
                    name,
                    value,
                    never_indexed,
                }
            };
            if first && self.update_due {
                return Err(DecodeError::SizeUpdateMissing);
            }
            first = false;
            list_size = list_size.saturating_add(field.size());
            if list_size > max_list_size {
                over = true;
            }
            if !over {
                emit(field);
            }
        }
        if first && self.update_due {
            // An empty block still had to carry the update.
            return Err(DecodeError::SizeUpdateMissing);
        }
        if over {
            return Err(DecodeError::HeaderListTooLarge {
                limit: max_list_size,
            });
        }
        Ok(())
    }

    /// The name and value at `index` (1-61 static, then dynamic newest first).
    fn entry(&self, index: usize) -> Result<(Bytes, Bytes), DecodeError> {
        match index {
            0 => Err(DecodeError::InvalidIndex(0)),
            1..=61 => {
                let (name, value) = STATIC[index - 1];
                Ok((Bytes::from_static(name), Bytes::from_static(value)))
            }
            _ => self
                .table
                .get(index - 62)
                .map(|e| (e.name.clone(), e.value.clone()))
                .ok_or(DecodeError::InvalidIndex(index)),
        }
    }

    /// A literal representation whose name index has a `prefix`-bit prefix.
    fn literal(
        &self,
        reader: &mut Reader<'_>,
        prefix: u8,
        decoded: &mut BytesMut,
    ) -> Result<(Bytes, Bytes), DecodeError> {
        let index = reader.integer(prefix)?;
        let name = if index == 0 {
            reader.string(decoded)?
        } else {
            self.entry(index)?.0
        };
        let value = reader.string(decoded)?;
        Ok((name, value))
    }
}

struct Reader<'a> {
    block: &'a Bytes,
    at: usize,
}

impl Reader<'_> {
    /// An integer with an `n`-bit prefix (RFC 7541 section 5.1), from the current byte.
    fn integer(&mut self, n: u8) -> Result<usize, DecodeError> {
        let max = (1usize << n) - 1;
        let first = *self.block.get(self.at).ok_or(DecodeError::Truncated)?;
        self.at += 1;
        let mut value = usize::from(first) & max;
        if value < max {
            return Ok(value);
        }
        let mut shift = 0;
        loop {
            let byte = *self.block.get(self.at).ok_or(DecodeError::Truncated)?;
            self.at += 1;
            value += usize::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 21 {
                return Err(DecodeError::IntegerOverflow);
            }
        }
        Ok(value)
    }

    /// A string literal (RFC 7541 section 5.2): a slice of the block, or decoded into
    /// `decoded` when Huffman-coded.
    fn string(&mut self, decoded: &mut BytesMut) -> Result<Bytes, DecodeError> {
        let huffman = *self.block.get(self.at).ok_or(DecodeError::Truncated)? & 0x80 != 0;
        let len = self.integer(7)?;
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.block.len())
            .ok_or(DecodeError::Truncated)?;
        let raw = self.block.slice(self.at..end);
        self.at = end;
        if !huffman {
            return Ok(raw);
        }
        if decoded.capacity() - decoded.len() < len * 8 / 5 {
            // Room for the rest of the block's strings at once (at most 8 symbols for 5 bytes).
            decoded.reserve((self.block.len() - self.at + len) * 8 / 5);
        }
        huffman::decode(&raw, decoded)?;
        Ok(decoded.split().freeze())
    }
}
