//! An encoded protobuf message split at one repeated field, without decoding it: a route
//! table's routes are decoded and translated only where their bytes changed.

/// An encoded message's occurrences of one length-delimited field (each the bytes of one
/// element), and the bytes of every other field, in their order: decoded, `rest` is the
/// message without that field.
#[derive(Debug)]
pub(crate) struct Split<'a> {
    pub(crate) parts: Vec<&'a [u8]>,
    pub(crate) rest: Vec<u8>,
}

const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LENGTH_DELIMITED: u64 = 2;
const FIXED32: u64 = 5;

/// `None` when `encoded` is not a well-formed message, or holds a group (deprecated, used by
/// no xDS message): the caller decodes it whole, which names what is wrong or takes the
/// group. An occurrence of `field` that is not length-delimited stays in `rest`, where
/// decoding refuses it.
pub(crate) fn split(encoded: &[u8], field: u32) -> Option<Split<'_>> {
    let mut parts = Vec::new();
    let mut rest = Vec::new();
    let mut at = 0;
    while at < encoded.len() {
        let start = at;
        let key = varint(encoded, &mut at)?;
        let (number, wire) = (key >> 3, key & 7);
        let mut body = at;
        let len = match wire {
            VARINT => {
                varint(encoded, &mut at)?;
                0
            }
            FIXED64 => 8,
            LENGTH_DELIMITED => {
                let len = usize::try_from(varint(encoded, &mut at)?).ok()?;
                body = at;
                len
            }
            FIXED32 => 4,
            _ => return None,
        };
        at = at.checked_add(len).filter(|&end| end <= encoded.len())?;
        if number == u64::from(field) && wire == LENGTH_DELIMITED {
            parts.push(&encoded[body..at]);
        } else {
            rest.extend_from_slice(&encoded[start..at]);
        }
    }
    Some(Split { parts, rest })
}

/// A base-128 varint at `*at`, which moves past it. As prost reads one: at most ten bytes,
/// the tenth holding the 64th bit alone.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        if shift == 63 && byte > 1 {
            return None;
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
    use prost::Message;

    fn route(name: &str) -> Route {
        Route {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_message_splits_into_its_elements_and_the_rest() {
        let host = VirtualHost {
            name: "web".into(),
            domains: vec!["a.example".into(), "b.example".into()],
            routes: vec![route("one"), route("two"), route("")],
            include_request_attempt_count: true,
            ..Default::default()
        };
        let encoded = host.encode_to_vec();
        let split = split(&encoded, 3).expect("well formed");
        let routes: Vec<Route> = (split.parts.iter())
            .map(|p| Route::decode(*p).expect("a route"))
            .collect();
        assert_eq!(routes, host.routes);
        let rest = VirtualHost::decode(split.rest.as_slice()).expect("the rest");
        assert_eq!(
            rest,
            VirtualHost {
                routes: Vec::new(),
                ..host
            }
        );
    }

    #[test]
    fn a_malformed_message_does_not_split() {
        let config = RouteConfiguration {
            name: "routes".into(),
            virtual_hosts: vec![VirtualHost::default()],
            ..Default::default()
        };
        let encoded = config.encode_to_vec();
        // Cut short inside the name, and before the host's length.
        assert!(split(&encoded[..3], 2).is_none());
        assert!(split(&encoded[..encoded.len() - 1], 2).is_none());
        assert!(split(&encoded, 2).is_some());
        let truncated_length = [0x12, 0x05, 0x0a];
        assert!(split(&truncated_length, 2).is_none());
        // A varint that never ends, one of ten bytes past 64 bits (whose key would name the
        // hosts), and a group (wire type 3).
        assert!(split(&[0x08, 0xff, 0xff], 2).is_none());
        let overlong = [
            0x92, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02, 0x00,
        ];
        assert!(split(&overlong, 2).is_none());
        assert!(RouteConfiguration::decode(overlong.as_slice()).is_err());
        let longest = [
            0x88, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0x00,
        ];
        let mut at = 0;
        assert_eq!(varint(&longest, &mut at), Some((1 << 63) | 0x08));
        assert!(split(&[0x0b], 2).is_none());
        // The field with another wire type stays in the rest, which decoding refuses.
        let varint_for_hosts = [0x10, 0x01];
        let split = split(&varint_for_hosts, 2).expect("well formed");
        assert!(split.parts.is_empty());
        assert!(RouteConfiguration::decode(split.rest.as_slice()).is_err());
    }
}
