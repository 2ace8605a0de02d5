//! SETTINGS parameters (RFC 9113 section 6.5.2, and RFC 8441's extended CONNECT).

use bytes::{BufMut, BytesMut};

use super::{DEFAULT_MAX_FRAME_SIZE, FrameError, MAX_MAX_FRAME_SIZE, MAX_WINDOW, Reason};

/// Parameter identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Setting {
    HeaderTableSize = 0x1,
    EnablePush = 0x2,
    MaxConcurrentStreams = 0x3,
    InitialWindowSize = 0x4,
    MaxFrameSize = 0x5,
    MaxHeaderListSize = 0x6,
    EnableConnectProtocol = 0x8,
}

/// The parameters one SETTINGS frame carries; those it leaves out are `None` (unchanged).
/// Unknown identifiers are ignored, as RFC 9113 section 6.5.2 requires.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    pub header_table_size: Option<u32>,
    pub enable_push: Option<bool>,
    pub max_concurrent_streams: Option<u32>,
    pub initial_window_size: Option<u32>,
    pub max_frame_size: Option<u32>,
    pub max_header_list_size: Option<u32>,
    pub enable_connect_protocol: Option<bool>,
}

impl Settings {
    /// Reads a SETTINGS payload; a later value for one identifier replaces an earlier one.
    pub fn parse(payload: &[u8]) -> Result<Self, FrameError> {
        if !payload.len().is_multiple_of(6) {
            return Err(FrameError::connection(
                Reason::FRAME_SIZE_ERROR,
                "SETTINGS not a multiple of 6 bytes long",
            ));
        }
        let mut settings = Settings::default();
        for pair in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([pair[0], pair[1]]);
            let value = u32::from_be_bytes([pair[2], pair[3], pair[4], pair[5]]);
            let flag = |what| match value {
                0 => Ok(false),
                1 => Ok(true),
                _ => Err(FrameError::connection(Reason::PROTOCOL_ERROR, what)),
            };
            match id {
                0x1 => settings.header_table_size = Some(value),
                0x2 => settings.enable_push = Some(flag("SETTINGS_ENABLE_PUSH not 0 or 1")?),
                0x3 => settings.max_concurrent_streams = Some(value),
                0x4 => {
                    if value > MAX_WINDOW {
                        return Err(FrameError::connection(
                            Reason::FLOW_CONTROL_ERROR,
                            "SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1",
                        ));
                    }
                    settings.initial_window_size = Some(value);
                }
                0x5 => {
                    if !(DEFAULT_MAX_FRAME_SIZE..=MAX_MAX_FRAME_SIZE).contains(&value) {
                        return Err(FrameError::connection(
                            Reason::PROTOCOL_ERROR,
                            "SETTINGS_MAX_FRAME_SIZE outside 2^14 to 2^24-1",
                        ));
                    }
                    settings.max_frame_size = Some(value);
                }
                0x6 => settings.max_header_list_size = Some(value),
                0x8 => {
                    settings.enable_connect_protocol =
                        Some(flag("SETTINGS_ENABLE_CONNECT_PROTOCOL not 0 or 1")?);
                }
                _ => {}
            }
        }
        Ok(settings)
    }

    /// The parameters that are set, as (identifier, value) in identifier order.
    pub fn pairs(&self) -> impl Iterator<Item = (Setting, u32)> {
        [
            (Setting::HeaderTableSize, self.header_table_size),
            (Setting::EnablePush, self.enable_push.map(u32::from)),
            (Setting::MaxConcurrentStreams, self.max_concurrent_streams),
            (Setting::InitialWindowSize, self.initial_window_size),
            (Setting::MaxFrameSize, self.max_frame_size),
            (Setting::MaxHeaderListSize, self.max_header_list_size),
            (
                Setting::EnableConnectProtocol,
                self.enable_connect_protocol.map(u32::from),
            ),
        ]
        .into_iter()
        .filter_map(|(id, value)| value.map(|v| (id, v)))
    }

    /// Writes the payload.
    pub(super) fn encode_payload(&self, out: &mut BytesMut) {
        for (id, value) in self.pairs() {
            out.put_u16(id as u16);
            out.put_u32(value);
        }
    }
}
