//! Envoy's header mutations (`HeaderValueOption` lists and lists of names to remove) as the
//! file writes them: a route configuration's, virtual host's and route's four lists become
//! the `headers` filter's rules at the same three levels (the filter runs last before the
//! router, as Envoy's router applies them); other filters' lists (the headers of a local
//! rate limit's reply) become their mutations.

// Control planes still send the deprecated `append`; it is read, not ignored.
#![allow(deprecated)]

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::common::mutation_rules::v3::HeaderMutation;
use envoy_types::pb::envoy::config::core::v3::HeaderValueOption;

use super::ResourceError;
use crate::{RawHeaderMutations, RawHeaderRules};

/// One level's four lists, as Envoy's messages hold them.
pub(crate) struct Lists {
    pub request_add: Vec<HeaderValueOption>,
    pub request_remove: Vec<String>,
    pub response_add: Vec<HeaderValueOption>,
    pub response_remove: Vec<String>,
}

/// The level's rules; `None` when it changes no header.
pub(crate) fn rules(
    lists: Lists,
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<RawHeaderRules>, ResourceError> {
    let at = crate::field_path::FieldPath::of(&at);
    let request = mutations(
        lists.request_add,
        lists.request_remove,
        &at.field("request_headers_to_add"),
    )?;
    let response = mutations(
        lists.response_add,
        lists.response_remove,
        &at.field("response_headers_to_add"),
    )?;
    if request.is_none() && response.is_none() {
        return Ok(None);
    }
    Ok(Some(RawHeaderRules {
        request,
        response,
        most_specific_wins: None,
    }))
}

/// One direction's additions and removals; `None` when there are none.
pub(crate) fn mutations(
    add: Vec<HeaderValueOption>,
    remove: Vec<String>,
    at: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<RawHeaderMutations>, ResourceError> {
    if add.is_empty() && remove.is_empty() {
        return Ok(None);
    }
    let mut out = RawHeaderMutations {
        remove,
        ..Default::default()
    };
    for (i, option) in add.into_iter().enumerate() {
        let at = format!("{at}[{i}]");
        let header = option.header.unwrap_or_default();
        let value = if header.raw_value.is_empty() {
            header.value
        } else {
            String::from_utf8(header.raw_value).map_err(|_| {
                ResourceError::invalid(format!("{at}.header.raw_value"), "expected UTF-8 text")
            })?
        };
        // Envoy skips a header whose value is empty unless told to keep it.
        if value.is_empty() && !option.keep_empty_value {
            continue;
        }
        let key = header.key.to_ascii_lowercase();
        // `append_action` is the current field; the deprecated `append` (true when unset)
        // speaks only where the action is left at its default.
        let action = match (option.append_action, option.append.map(|a| a.value)) {
            (0, Some(false)) => 2,
            (action, _) => action,
        };
        match action {
            // APPEND_IF_EXISTS_OR_ADD: two values of one name become one list, as a
            // comma-separated value means the same (RFC 9110 5.3), except for cookies.
            0 => match out.add.get_mut(&key) {
                Some(_) if key == "set-cookie" => {
                    return Err(ResourceError::Unsupported {
                        at,
                        fields: vec!["a second set-cookie value".into()],
                    });
                }
                Some(values) => {
                    values.push(',');
                    values.push_str(&value);
                }
                None => {
                    out.add.insert(key, value);
                }
            },
            // ADD_IF_ABSENT: the first one given is the one added.
            1 => {
                out.add_if_absent.entry(key).or_insert(value);
            }
            // OVERWRITE_IF_EXISTS_OR_ADD: the last one given stays.
            2 => {
                out.set.insert(key, value);
            }
            3 => {
                return Err(ResourceError::Unsupported {
                    at: format!("{at}.append_action"),
                    fields: vec!["OVERWRITE_IF_EXISTS".into()],
                });
            }
            other => {
                return Err(ResourceError::invalid(
                    format!("{at}.append_action"),
                    format!("unknown action {other}"),
                ));
            }
        }
    }
    let empty = |m: &BTreeMap<String, String>| m.is_empty();
    if out.remove.is_empty() && empty(&out.add) && empty(&out.set) && empty(&out.add_if_absent) {
        return Ok(None);
    }
    Ok(Some(out))
}

/// A list of Envoy's `HeaderMutation`s (early header mutations, the `header_mutation`
/// filter), which apply one by one in order. Here they apply as the `headers` rules do
/// (removals, removals by pattern, overwrites, appends, adds-if-absent), so a list that
/// changes one header out of that order is refused rather than applied differently.
pub(crate) fn ordered(
    list: Vec<HeaderMutation>,
    at: &str,
) -> Result<Option<RawHeaderMutations>, ResourceError> {
    use envoy_types::pb::envoy::config::common::mutation_rules::v3::header_mutation::Action;
    let (mut add, mut remove, mut remove_matching) = (Vec::new(), Vec::new(), Vec::new());
    // Each header's place in the order the rules apply: remove, set, add, add if absent.
    let mut ranks: BTreeMap<String, u8> = BTreeMap::new();
    for (j, m) in list.into_iter().enumerate() {
        let at = format!("{at}[{j}]");
        let (names, rank) = match m.action {
            Some(Action::Remove(name)) => {
                remove.push(name.clone());
                (vec![name], 0)
            }
            Some(Action::Append(option)) => {
                let name = option
                    .header
                    .as_ref()
                    .map(|h| h.key.clone())
                    .unwrap_or_default();
                let rank = match (option.append_action, option.append.map(|a| a.value)) {
                    (2, _) | (0, Some(false)) => 1,
                    (1, _) => 3,
                    _ => 2,
                };
                add.push(option);
                (vec![name], rank)
            }
            Some(Action::RemoveOnMatch(on_match)) => {
                let at = format!("{at}.remove_on_match.key_matcher");
                let matcher = on_match
                    .key_matcher
                    .ok_or_else(|| ResourceError::invalid(&at, "expected a key_matcher"))?;
                let raw = super::matchers::string_match(String::new(), matcher, &at)?;
                let pattern = crate::matchers::string_match(&raw, &at)
                    .map_err(|e| ResourceError::invalid(&at, e.to_string()))?
                    .ok_or_else(|| ResourceError::invalid(&at, "expected a pattern"))?;
                // The headers changed so far that it would remove.
                let hits = ranks
                    .keys()
                    .filter(|name| pattern.matches(name.as_bytes()))
                    .cloned()
                    .collect();
                remove_matching.push(crate::RawStringMatch {
                    exact: raw.exact,
                    prefix: raw.prefix,
                    suffix: raw.suffix,
                    contains: raw.contains,
                    regex: raw.regex,
                });
                (hits, 0)
            }
            None => return Err(ResourceError::invalid(at, "expected an action")),
        };
        for name in names {
            let name = name.to_ascii_lowercase();
            let last = ranks.entry(name.clone()).or_insert(rank);
            if rank < *last {
                return Err(ResourceError::Unsupported {
                    at,
                    fields: vec![format!(
                        "`{name}` changed again after a later kind of change (removals, overwrites, appends, adds-if-absent apply in that order here)"
                    )],
                });
            }
            *last = rank;
        }
    }
    let mut out = mutations(add, remove, at)?;
    if !remove_matching.is_empty() {
        out.get_or_insert_with(Default::default).remove_matching = remove_matching;
    }
    Ok(out)
}

/// An `Http1ProtocolOptions`' `header_key_format`, taken out of it: whether names keep the
/// case they came with (the `preserve_case` stateful formatter). Other formats are refused.
pub(crate) fn preserve_case(
    h1: &mut envoy_types::pb::envoy::config::core::v3::Http1ProtocolOptions,
    at: &str,
) -> Result<bool, ResourceError> {
    use envoy_types::pb::envoy::config::core::v3::http1_protocol_options::header_key_format::HeaderFormat;
    use envoy_types::pb::envoy::extensions::http::header_formatters::preserve_case::v3::PreserveCaseFormatterConfig;
    const PRESERVE_CASE: &str = "type.googleapis.com/envoy.extensions.http.header_formatters.preserve_case.v3.PreserveCaseFormatterConfig";
    let at = format!("{at}.header_key_format");
    let unsupported = |what: &str| ResourceError::Unsupported {
        at: at.clone(),
        fields: vec![what.to_owned()],
    };
    match h1.header_key_format.take().and_then(|f| f.header_format) {
        None => Ok(false),
        Some(HeaderFormat::StatefulFormatter(formatter)) => {
            let any = formatter
                .typed_config
                .filter(|a| a.type_url == PRESERVE_CASE)
                .ok_or_else(|| unsupported("stateful_formatter (preserve_case only)"))?;
            let config: PreserveCaseFormatterConfig =
                super::decode(&any, PRESERVE_CASE, "a PreserveCaseFormatterConfig")?;
            if config.forward_reason_phrase || config.formatter_type_on_envoy_headers != 0 {
                return Err(unsupported(
                    "forward_reason_phrase, formatter_type_on_envoy_headers",
                ));
            }
            Ok(true)
        }
        Some(HeaderFormat::ProperCaseWords(_)) => Err(unsupported("proper_case_words")),
    }
}
