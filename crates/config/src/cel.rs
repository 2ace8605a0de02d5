//! The part of CEL (Common Expression Language) that control planes write to pick requests:
//! Envoy Gateway's access-log `expression: response.code >= 400` and
//! `request.url_path.contains('v1beta3')`. Parsed and type-checked once at load; an
//! expression outside this part is refused by name, never treated as true.
//!
//! ```text
//! expr    := and ('||' and)*
//! and     := unary ('&&' unary)*
//! unary   := '!' unary | primary
//! primary := '(' expr ')' | operand (cmp operand)? | operand '.' method '(' string ')'
//! operand := response.code | request.path | request.url_path | request.host
//!          | request.method | request.scheme | request.headers['name'] | INT | STRING | true | false
//! cmp     := == | != | < | <= | > | >=
//! method  := contains | startsWith | endsWith | matches
//! ```
//!
//! As in CEL, a value that is not there (a header not sent, no response code) is an error,
//! which `&&` and `||` absorb where the other side decides; an expression that ends in an
//! error does not hold.

use std::fmt;

/// A checked expression.
#[derive(Debug, Clone)]
pub struct Expr {
    node: Node,
    /// As written, for `/config_dump` and errors.
    text: String,
}

impl PartialEq for Expr {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Expr {}

impl serde::Serialize for Expr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What an expression reads of an exchange.
pub trait Attributes {
    /// The response's status; `None` before there is one.
    fn response_code(&self) -> Option<u16>;
    /// The path with its query.
    fn path(&self) -> Option<&str>;
    fn host(&self) -> Option<&str>;
    fn method(&self) -> Option<&str>;
    fn scheme(&self) -> Option<&str>;
    /// A request header by its lowercase name (the first value).
    fn request_header(&self, name: &str) -> Option<&[u8]>;
}

#[derive(Debug, Clone)]
enum Node {
    Or(Box<Node>, Box<Node>),
    And(Box<Node>, Box<Node>),
    Not(Box<Node>),
    Compare(Operand, Cmp, Operand),
    Call(Operand, Method, String),
    /// `true`, `false`, or an attribute read as a boolean would be: only literals here.
    Bool(bool),
}

#[derive(Debug, Clone, PartialEq)]
enum Operand {
    ResponseCode,
    Path,
    UrlPath,
    Host,
    Method,
    Scheme,
    Header(String),
    Int(i64),
    Str(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone)]
enum Method {
    Contains,
    StartsWith,
    EndsWith,
    Matches(regex::bytes::Regex),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Int,
    Str,
}

impl Operand {
    fn kind(&self) -> Kind {
        match self {
            Operand::ResponseCode | Operand::Int(_) => Kind::Int,
            _ => Kind::Str,
        }
    }

    /// `None`: not there (a CEL error).
    fn int(&self, a: &dyn Attributes) -> Option<i64> {
        match self {
            Operand::ResponseCode => a.response_code().map(i64::from),
            Operand::Int(v) => Some(*v),
            _ => None,
        }
    }

    fn bytes<'a>(&'a self, a: &'a dyn Attributes) -> Option<&'a [u8]> {
        match self {
            Operand::Path => a.path().map(str::as_bytes),
            Operand::UrlPath => a
                .path()
                .map(|p| p.split_once('?').map_or(p, |(path, _)| path).as_bytes()),
            Operand::Host => a.host().map(str::as_bytes),
            Operand::Method => a.method().map(str::as_bytes),
            Operand::Scheme => a.scheme().map(str::as_bytes),
            Operand::Header(name) => a.request_header(name),
            Operand::Str(s) => Some(s.as_bytes()),
            _ => None,
        }
    }
}

impl Expr {
    /// Parses and type-checks `text`.
    pub fn parse(text: &str) -> Result<Expr, String> {
        if text.len() > MAX_LEN {
            return Err(format!("an expression of over {MAX_LEN} bytes"));
        }
        let tokens = tokenize(text)?;
        let mut parser = Parser {
            tokens,
            at: 0,
            depth: 0,
        };
        let node = parser.or()?;
        if let Some(token) = parser.tokens.get(parser.at) {
            return Err(format!("unexpected `{token}` in `{text}`"));
        }
        Ok(Expr {
            node,
            text: text.to_owned(),
        })
    }

    /// Whether the expression holds for `a` (an error does not).
    pub fn holds(&self, a: &dyn Attributes) -> bool {
        eval(&self.node, a) == Some(true)
    }

    /// The request headers it reads, `:authority` for the host and `:scheme` for the scheme.
    pub fn headers(&self) -> Vec<&str> {
        fn walk<'a>(node: &'a Node, out: &mut Vec<&'a str>) {
            let mut operand = |o: &'a Operand| match o {
                Operand::Header(name) => out.push(name),
                Operand::Host => out.push(":authority"),
                Operand::Scheme => out.push(":scheme"),
                _ => {}
            };
            match node {
                Node::Or(l, r) | Node::And(l, r) => {
                    walk(l, out);
                    walk(r, out);
                }
                Node::Not(n) => walk(n, out),
                Node::Compare(l, _, r) => {
                    operand(l);
                    operand(r);
                }
                Node::Call(o, _, _) => operand(o),
                Node::Bool(_) => {}
            }
        }
        let mut out = Vec::new();
        walk(&self.node, &mut out);
        out
    }
}

/// `None`: an error (a value not there).
fn eval(node: &Node, a: &dyn Attributes) -> Option<bool> {
    match node {
        Node::Bool(b) => Some(*b),
        Node::Not(n) => eval(n, a).map(|b| !b),
        // CEL's `&&` and `||` are commutative over errors: the side that decides wins.
        Node::And(l, r) => match (eval(l, a), eval(r, a)) {
            (Some(false), _) | (_, Some(false)) => Some(false),
            (Some(true), Some(true)) => Some(true),
            _ => None,
        },
        Node::Or(l, r) => match (eval(l, a), eval(r, a)) {
            (Some(true), _) | (_, Some(true)) => Some(true),
            (Some(false), Some(false)) => Some(false),
            _ => None,
        },
        Node::Compare(l, cmp, r) => {
            let order = match l.kind() {
                Kind::Int => l.int(a)?.cmp(&r.int(a)?),
                Kind::Str => l.bytes(a)?.cmp(r.bytes(a)?),
            };
            Some(match cmp {
                Cmp::Eq => order.is_eq(),
                Cmp::Ne => order.is_ne(),
                Cmp::Lt => order.is_lt(),
                Cmp::Le => order.is_le(),
                Cmp::Gt => order.is_gt(),
                Cmp::Ge => order.is_ge(),
            })
        }
        Node::Call(o, method, arg) => {
            let value = o.bytes(a)?;
            let arg = arg.as_bytes();
            Some(match method {
                Method::Contains => arg.is_empty() || value.windows(arg.len()).any(|w| w == arg),
                Method::StartsWith => value.starts_with(arg),
                Method::EndsWith => value.ends_with(arg),
                Method::Matches(re) => re.is_match(value),
            })
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Int(i64),
    Str(String),
    Op(&'static str),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Ident(s) => f.write_str(s),
            Token::Int(v) => write!(f, "{v}"),
            Token::Str(s) => write!(f, "'{s}'"),
            Token::Op(op) => f.write_str(op),
        }
    }
}

const OPERATORS: [&str; 14] = [
    "&&", "||", "==", "!=", "<=", ">=", "<", ">", "!", "(", ")", "[", "]", ".",
];

fn tokenize(text: &str) -> Result<Vec<Token>, String> {
    let mut tokens = Vec::new();
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c.is_whitespace() {
            rest = &rest[c.len_utf8()..];
        } else if c == '\'' || c == '"' {
            let body = &rest[1..];
            let end = body
                .find(c)
                .ok_or_else(|| format!("a string without its closing {c} in `{text}`"))?;
            if body[..end].contains('\\') {
                return Err(format!("escapes in strings are not supported: `{text}`"));
            }
            tokens.push(Token::Str(body[..end].to_owned()));
            rest = &body[end + 1..];
        } else if c.is_ascii_digit() {
            let end = rest
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(rest.len());
            let value = rest[..end]
                .parse()
                .map_err(|_| format!("`{}` is out of range", &rest[..end]))?;
            tokens.push(Token::Int(value));
            rest = &rest[end..];
        } else if c.is_ascii_alphabetic() || c == '_' {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            tokens.push(Token::Ident(rest[..end].to_owned()));
            rest = &rest[end..];
        } else {
            let op = OPERATORS
                .iter()
                .find(|op| rest.starts_with(**op))
                .ok_or_else(|| format!("`{c}` is not supported in `{text}`"))?;
            tokens.push(Token::Op(op));
            rest = &rest[op.len()..];
        }
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    /// How deep `!` and `(` nest here: bounded, so a hostile expression cannot exhaust the
    /// stack (parsing, evaluating, dropping).
    depth: usize,
}

/// The deepest nesting of `!` and `(` taken.
const MAX_DEPTH: usize = 32;
/// The longest expression taken.
const MAX_LEN: usize = 4096;

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Result<Token, String> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token.ok_or_else(|| "the expression ends too soon".to_owned())
    }

    fn eat(&mut self, op: &str) -> bool {
        if matches!(self.peek(), Some(Token::Op(found)) if *found == op) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, op: &str) -> Result<(), String> {
        match self.next()? {
            Token::Op(found) if found == op => Ok(()),
            other => Err(format!("expected `{op}`, found `{other}`")),
        }
    }

    /// `parse` one level deeper.
    fn nested(&mut self, parse: fn(&mut Self) -> Result<Node, String>) -> Result<Node, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(format!("`!` and `(` nested over {MAX_DEPTH} deep"));
        }
        let node = parse(self);
        self.depth -= 1;
        node
    }

    fn or(&mut self) -> Result<Node, String> {
        let mut node = self.and()?;
        while self.eat("||") {
            node = Node::Or(Box::new(node), Box::new(self.and()?));
        }
        Ok(node)
    }

    fn and(&mut self) -> Result<Node, String> {
        let mut node = self.unary()?;
        while self.eat("&&") {
            node = Node::And(Box::new(node), Box::new(self.unary()?));
        }
        Ok(node)
    }

    fn unary(&mut self) -> Result<Node, String> {
        if self.eat("!") {
            let inner = self.nested(Self::unary)?;
            return Ok(Node::Not(Box::new(inner)));
        }
        if self.eat("(") {
            let node = self.nested(Self::or)?;
            self.expect(")")?;
            return Ok(node);
        }
        if let Some(Token::Ident(word)) = self.peek()
            && (word == "true" || word == "false")
        {
            let value = word == "true";
            self.at += 1;
            return Ok(Node::Bool(value));
        }
        let left = self.operand()?;
        // A method call on a string.
        if self.eat(".") {
            let Token::Ident(name) = self.next()? else {
                return Err("expected a method name after `.`".into());
            };
            self.expect("(")?;
            let Token::Str(arg) = self.next()? else {
                return Err(format!("`{name}` takes one string"));
            };
            self.expect(")")?;
            if left.kind() != Kind::Str {
                return Err(format!("`{name}` is a method of strings"));
            }
            let method = match name.as_str() {
                "contains" => Method::Contains,
                "startsWith" => Method::StartsWith,
                "endsWith" => Method::EndsWith,
                "matches" => Method::Matches(
                    regex::bytes::Regex::new(&arg).map_err(|e| format!("`{arg}`: {e}"))?,
                ),
                other => {
                    return Err(format!(
                        "the method `{other}` (contains, startsWith, endsWith and matches only)"
                    ));
                }
            };
            return Ok(Node::Call(left, method, arg));
        }
        let cmp = match self.peek() {
            Some(Token::Op("==")) => Cmp::Eq,
            Some(Token::Op("!=")) => Cmp::Ne,
            Some(Token::Op("<")) => Cmp::Lt,
            Some(Token::Op("<=")) => Cmp::Le,
            Some(Token::Op(">")) => Cmp::Gt,
            Some(Token::Op(">=")) => Cmp::Ge,
            _ => return Err("expected a comparison or a method call".into()),
        };
        self.at += 1;
        let right = self.operand()?;
        if left.kind() != right.kind() {
            return Err("a comparison of an integer with a string".into());
        }
        Ok(Node::Compare(left, cmp, right))
    }

    fn operand(&mut self) -> Result<Operand, String> {
        match self.next()? {
            Token::Int(v) => Ok(Operand::Int(v)),
            Token::Str(s) => Ok(Operand::Str(s)),
            Token::Ident(root) if root == "request" || root == "response" => {
                self.expect(".")?;
                let Token::Ident(field) = self.next()? else {
                    return Err(format!("expected a field of `{root}`"));
                };
                match (root.as_str(), field.as_str()) {
                    ("response", "code") => Ok(Operand::ResponseCode),
                    ("request", "path") => Ok(Operand::Path),
                    ("request", "url_path") => Ok(Operand::UrlPath),
                    ("request", "host") => Ok(Operand::Host),
                    ("request", "method") => Ok(Operand::Method),
                    ("request", "scheme") => Ok(Operand::Scheme),
                    ("request", "headers") => {
                        self.expect("[")?;
                        let Token::Str(name) = self.next()? else {
                            return Err("expected a header name in quotes".into());
                        };
                        self.expect("]")?;
                        Ok(Operand::Header(name.to_ascii_lowercase()))
                    }
                    (root, field) => Err(format!(
                        "the attribute `{root}.{field}` (response.code, request.path, request.url_path, request.host, request.method, request.scheme and request.headers only)"
                    )),
                }
            }
            other => Err(format!("`{other}` is not an attribute or a literal")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Exchange {
        code: Option<u16>,
        path: Option<&'static str>,
        header: Option<(&'static str, &'static str)>,
    }

    impl Attributes for Exchange {
        fn response_code(&self) -> Option<u16> {
            self.code
        }
        fn path(&self) -> Option<&str> {
            self.path
        }
        fn host(&self) -> Option<&str> {
            Some("example.com")
        }
        fn method(&self) -> Option<&str> {
            Some("GET")
        }
        fn scheme(&self) -> Option<&str> {
            Some("http")
        }
        fn request_header(&self, name: &str) -> Option<&[u8]> {
            self.header
                .filter(|(n, _)| *n == name)
                .map(|(_, v)| v.as_bytes())
        }
    }

    fn holds(text: &str, exchange: &Exchange) -> bool {
        Expr::parse(text).unwrap().holds(exchange)
    }

    #[test]
    fn what_envoy_gateway_writes_is_evaluated() {
        let error = Exchange {
            code: Some(503),
            path: Some("/api/v1beta3/x?q=1"),
            ..Default::default()
        };
        let fine = Exchange {
            code: Some(200),
            path: Some("/api/v1/x?q=v1beta3"),
            ..Default::default()
        };
        assert!(holds("response.code >= 400", &error));
        assert!(!holds("response.code >= 400", &fine));
        assert!(holds("request.url_path.contains('v1beta3')", &error));
        // The query is not part of `url_path`, but is of `path`.
        assert!(!holds("request.url_path.contains('v1beta3')", &fine));
        assert!(holds("request.path.contains(\"v1beta3\")", &fine));
        assert!(holds(
            "response.code >= 501 && response.code <= 511 || response.code == 200",
            &fine
        ));
        assert!(holds(
            "!(response.code == 200) || request.method == 'GET'",
            &fine
        ));
        assert!(holds(
            "request.host.endsWith('.com') && request.scheme == 'http'",
            &fine
        ));
        assert!(holds("request.url_path.matches('^/api/v[0-9]+/')", &fine));
    }

    #[test]
    fn a_value_not_there_is_an_error_the_other_side_can_decide() {
        let none = Exchange::default();
        assert!(!holds("response.code < 400", &none));
        assert!(!holds("!(response.code < 400)", &none));
        assert!(holds("response.code < 400 || true", &none));
        assert!(!holds(
            "request.headers['x-tenant'] == 'blue' && true",
            &none
        ));
        let blue = Exchange {
            header: Some(("x-tenant", "blue")),
            ..Default::default()
        };
        assert!(holds("request.headers['X-Tenant'] == 'blue'", &blue));
        assert_eq!(
            Expr::parse("request.headers['X-Tenant'] == 'blue'")
                .unwrap()
                .headers(),
            ["x-tenant"]
        );
    }

    #[test]
    fn what_is_outside_this_part_is_refused_by_name() {
        for (text, error) in [
            ("response.flags == 1", "the attribute `response.flags`"),
            ("response.code == 'x'", "an integer with a string"),
            ("request.path.size() > 1", "`size` takes one string"),
            ("request.path.lower('a')", "the method `lower`"),
            ("response.code in [1]", "expected a comparison"),
            ("response.code >= 400 &&", "ends too soon"),
            ("response.code >= 400)", "unexpected `)`"),
            ("connection.mtls", "`connection` is not an attribute"),
            ("request.path.matches('(')", "`(`:"),
            (&*"!".repeat(40), "nested over 32 deep"),
        ] {
            let found = Expr::parse(text).unwrap_err();
            assert!(found.contains(error), "{text}: {found}");
        }
    }
}
