//! Where a value sits in a config (`listeners[0].routes[3].match`), written out only when
//! an error names it.
//!
//! A route table of thousands of routes is checked on every change a management server
//! sends; formatting each field's path up front, for errors that almost never happen, was
//! a fifth of that work. A `FieldPath` borrows its parent and formats on `Display`.

use std::fmt;

/// A path into a config, built one field or list item at a time without allocating.
#[derive(Clone, Copy)]
pub(crate) enum FieldPath<'a> {
    /// A path already written out.
    Text(&'a str),
    /// A path that writes itself out (another kind of path, borrowed).
    Shown(&'a dyn fmt::Display),
    /// `parent.key`
    Field(&'a FieldPath<'a>, &'static str),
    /// `parent.key[index]`
    Item(&'a FieldPath<'a>, &'static str, usize),
}

impl<'a> FieldPath<'a> {
    /// `self.key`
    pub(crate) fn field(&'a self, key: &'static str) -> FieldPath<'a> {
        FieldPath::Field(self, key)
    }

    /// `self.key[index]`
    pub(crate) fn item(&'a self, key: &'static str, index: usize) -> FieldPath<'a> {
        FieldPath::Item(self, key, index)
    }
}

impl<'a> FieldPath<'a> {
    /// Any path that can be written out, as the root of a `FieldPath`.
    pub(crate) fn of(path: &'a dyn fmt::Display) -> Self {
        FieldPath::Shown(path)
    }
}

impl<'a> From<&'a str> for FieldPath<'a> {
    fn from(text: &'a str) -> Self {
        FieldPath::Text(text)
    }
}

impl fmt::Display for FieldPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldPath::Text(text) => f.write_str(text),
            FieldPath::Shown(path) => path.fmt(f),
            FieldPath::Field(parent, key) => write!(f, "{parent}.{key}"),
            FieldPath::Item(parent, key, index) => write!(f, "{parent}.{key}[{index}]"),
        }
    }
}

impl fmt::Debug for FieldPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Errors take their path as a `String`: written out there, once.
impl From<&FieldPath<'_>> for String {
    fn from(path: &FieldPath<'_>) -> String {
        path.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_written_as_its_fields_and_items() {
        let root = FieldPath::from("listener `web`.route_config");
        let host = root.item("virtual_hosts", 2);
        let route = host.item("routes", 10);
        let matcher = route.field("match");
        let prefix = matcher.field("prefix");
        assert_eq!(
            prefix.to_string(),
            "listener `web`.route_config.virtual_hosts[2].routes[10].match.prefix"
        );
        assert_eq!(String::from(&route), format!("{route}"));
    }
}
