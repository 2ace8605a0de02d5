//! Which virtual host a request's host picks: exact domains by hash, then wildcards by hash
//! per length (longest first), as Envoy does; a few hash lookups whatever the number of hosts.

use foldhash::fast::RandomState;

use config::{Domain, VirtualHostConfig};

/// Keys come from the config; requests only look up, so a fast hash is safe here.
type HashMap<K, V> = std::collections::HashMap<K, V, RandomState>;

/// Wildcard domains of one length, by the text beside their `*`.
struct ByLength {
    len: usize,
    hosts: HashMap<Box<str>, u32>,
}

pub(super) struct HostIndex {
    exact: HashMap<Box<str>, u32>,
    /// Longest first.
    suffixes: Vec<ByLength>,
    /// Longest first.
    prefixes: Vec<ByLength>,
    any: Option<u32>,
    /// Whether some domain names a port: only then is the host tried with its port.
    ports: bool,
}

impl HostIndex {
    pub(super) fn new(hosts: &[VirtualHostConfig]) -> Self {
        let mut index = HostIndex {
            exact: HashMap::default(),
            suffixes: Vec::new(),
            prefixes: Vec::new(),
            any: None,
            ports: false,
        };
        for (i, host) in hosts.iter().enumerate() {
            // Tables past 4 billion hosts are not a concern.
            let i = i as u32;
            for domain in &host.domains {
                // Validation refused duplicates; the first would win anyway.
                match domain {
                    Domain::Exact(name) => {
                        index.ports |= has_port(name);
                        index.exact.entry(name.as_str().into()).or_insert(i);
                    }
                    Domain::Suffix(suffix) => {
                        index.ports |= has_port(suffix);
                        insert(&mut index.suffixes, suffix, i);
                    }
                    Domain::Prefix(prefix) => insert(&mut index.prefixes, prefix, i),
                    Domain::Any => {
                        index.any.get_or_insert(i);
                    }
                }
            }
        }
        index
    }

    /// The virtual host for `host` (lowercase, with its port if it came with one); `bare` is
    /// `host` without its port.
    pub(super) fn find(&self, host: &str, bare: &str) -> Option<usize> {
        // The host with its port is tried first, against the domains that name one.
        let with_port = (self.ports && bare.len() < host.len()).then_some(host);
        let forms = with_port.into_iter().chain([bare]);
        let found = forms
            .clone()
            .find_map(|h| self.exact.get(h).copied())
            .or_else(|| {
                forms.clone().find_map(|h| {
                    let ported = h.len() > bare.len();
                    self.suffixes.iter().find_map(|s| {
                        h.len()
                            .checked_sub(s.len)
                            .filter(|&at| at > 0)
                            .and_then(|at| h.get(at..))
                            .filter(|end| !ported || has_port(end))
                            .and_then(|end| s.hosts.get(end).copied())
                    })
                })
            })
            .or_else(|| {
                // A prefix wildcard is matched against the host as sent: `api.*` takes
                // `api.example.com:8443` too.
                self.prefixes.iter().find_map(|p| {
                    (host.len() > p.len)
                        .then(|| host.get(..p.len))
                        .flatten()
                        .and_then(|start| p.hosts.get(start).copied())
                })
            })
            .or(self.any);
        found.map(|i| i as usize)
    }
}

fn has_port(domain: &str) -> bool {
    super::strip_port(domain).len() < domain.len()
}

fn insert(tables: &mut Vec<ByLength>, text: &str, host: u32) {
    let at = match tables.binary_search_by(|t| text.len().cmp(&t.len)) {
        Ok(at) => at,
        Err(at) => {
            tables.insert(
                at,
                ByLength {
                    len: text.len(),
                    hosts: HashMap::default(),
                },
            );
            at
        }
    };
    tables[at].hosts.entry(text.into()).or_insert(host);
}

/// [`HostIndex::find`] by trying every domain: what the index must agree with.
pub(super) fn find_by_scan(hosts: &[VirtualHostConfig], host: &str) -> Option<usize> {
    let bare = super::strip_port(host);
    // The host with its port, against domains that name one; then the host without it.
    let both = [host, bare];
    let forms = if bare.len() < host.len() {
        &both[..]
    } else {
        &both[1..]
    };
    let fits = |text: &str, form: &str| form.len() == bare.len() || has_port(text);
    let domains = || {
        hosts
            .iter()
            .enumerate()
            .flat_map(|(i, h)| h.domains.iter().map(move |d| (i, d)))
    };
    let longest = |form: &str, matches: &dyn Fn(&Domain, &str) -> Option<usize>| {
        domains()
            .filter_map(|(i, d)| matches(d, form).map(|len| (len, i)))
            .max_by_key(|&(len, i)| (len, std::cmp::Reverse(i)))
            .map(|(_, i)| i)
    };
    let exact = |d: &Domain, h: &str| matches!(d, Domain::Exact(name) if name == h).then_some(0);
    let suffix = |d: &Domain, h: &str| match d {
        Domain::Suffix(s) if h.len() > s.len() && h.ends_with(s.as_str()) && fits(s, h) => {
            Some(s.len())
        }
        _ => None,
    };
    let prefix = |d: &Domain, h: &str| match d {
        Domain::Prefix(p) if h.len() > p.len() && h.starts_with(p.as_str()) => Some(p.len()),
        _ => None,
    };
    forms
        .iter()
        .find_map(|f| longest(f, &exact))
        .or_else(|| forms.iter().find_map(|f| longest(f, &suffix)))
        .or_else(|| longest(host, &prefix))
        .or_else(|| domains().find(|(_, d)| **d == Domain::Any).map(|(i, _)| i))
}
