//! Function names as a person types them, matched as gdb and perf match them: the one matcher
//! of every command that takes a function name (`report --callers/--callees`, `annotate`,
//! `replay -F`, `--after`, `record --start/--stop`).
//!
//! A function's name is its demangled name as reports show it (`geo::Rect::area() const`,
//! `int geo::biggest<int>(int, int)`). A name typed matches it:
//! - whole: the full signature, or the mangled name (`_ZNK3geo4Rect4areaEv`);
//! - qualified: the name without return type, parameters and qualifiers (`geo::Rect::area`),
//!   with or without template arguments (`geo::biggest` and `geo::biggest<int>`): every
//!   overload and instance matches;
//! - by its trailing part (`Rect::area`, `area`), at a `::`: only when one qualified name has
//!   it; when several have it, the name is ambiguous and the error lists them.
//!
//! A whole or qualified match wins over trailing parts: `area` names the global `area(int)`
//! when there is one, even if `geo::Rect::area` also ran (as gdb's `break area` would not, and
//! perf's exact symbol names would).

use crate::symbols::demangle;

/// How well a function's name matches what was typed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Match {
    /// The trailing part of the qualified name (held here): unique only if one qualified name has it.
    Tail(String),
    /// The whole name, the mangled name, or the qualified name (every overload).
    Whole,
}

/// A function name typed by a person.
#[derive(Clone, Debug)]
pub struct FunctionQuery {
    text: String,
    /// The demangled form of a mangled name typed.
    demangled: Option<String>,
    /// Typed with a parameter list: a signature, matched whole.
    signature: bool,
    /// Typed with template arguments: matched against names that keep theirs.
    templated: bool,
}

/// Why a name typed names no single function.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("no function named {0}")]
    NotFound(String),
    #[error("{query} is ambiguous: it names {} (give one of these)", .candidates.join(", "))]
    Ambiguous { query: String, candidates: Vec<String> },
}

impl FunctionQuery {
    pub fn new(text: &str) -> Self {
        let text = text.trim();
        let demangled = demangle::demangle(text);
        FunctionQuery {
            text: text.to_string(),
            demangled,
            signature: params_start(text).is_some_and(|open| !text[..open].ends_with("operator")),
            templated: text.contains('<') && !text.contains("operator<"),
        }
    }

    /// What was typed.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// How `name` (a demangled function name) matches, if it does.
    pub fn matches(&self, name: &str) -> Option<Match> {
        if name == self.text || self.demangled.as_deref() == Some(name) {
            return Some(Match::Whole);
        }
        if self.signature {
            // A signature is matched whole, spaces aside (`f(int,int)` is `f(int, int)`).
            // A template function's return type may be left out (`geo::biggest<int>(int, int)`).
            let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
            let same = |a: &str, b: &str| squeeze(a) == squeeze(b);
            let matched = same(name, &self.text) || same(without_return_type(name), without_return_type(&self.text));
            return matched.then_some(Match::Whole);
        }
        let qualified = qualified_name(name);
        let plain;
        let candidate = if self.templated {
            qualified
        } else {
            plain = without_template_args(qualified);
            plain.as_str()
        };
        if candidate == self.text {
            return Some(Match::Whole);
        }
        let tail = candidate.strip_suffix(self.text.as_str())?;
        tail.ends_with("::").then(|| Match::Tail(candidate.to_string()))
    }

    /// The items of `candidates` (an item and its function name) this name selects: every
    /// whole match, else the trailing-part matches if they share one qualified name.
    pub fn select<T>(&self, candidates: impl IntoIterator<Item = (T, String)>) -> Result<Vec<T>, NameError> {
        let mut whole = Vec::new();
        let mut tails: Vec<(T, String)> = Vec::new();
        for (item, name) in candidates {
            match self.matches(&name) {
                Some(Match::Whole) => whole.push(item),
                Some(Match::Tail(q)) => tails.push((item, q)),
                None => {}
            }
        }
        if !whole.is_empty() {
            return Ok(whole);
        }
        let mut names: Vec<String> = tails.iter().map(|(_, q)| q.clone()).collect();
        names.sort();
        names.dedup();
        match names.len() {
            0 => Err(NameError::NotFound(self.text.clone())),
            1 => Ok(tails.into_iter().map(|(item, _)| item).collect()),
            _ => Err(NameError::Ambiguous { query: self.text.clone(), candidates: names }),
        }
    }
}

/// The byte index of the `(` that opens the parameter list ending at `name`'s last `)`
/// (balanced over `()`), if `name` ends in one (after qualifiers).
fn params_start(name: &str) -> Option<usize> {
    let end = name.rfind(')')?;
    // What follows the list can only be qualifiers: const, volatile, &, &&, noexcept, an ABI tag.
    let rest = name[end + 1..].trim();
    let qualifiers_only = rest
        .split(|c: char| c.is_whitespace() || c == '&')
        .all(|w| w.is_empty() || matches!(w, "const" | "volatile" | "noexcept" | "&&") || w.starts_with("[abi:"));
    if !qualifiers_only {
        return None;
    }
    let mut depth = 0i32;
    for (i, c) in name[..=end].char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `name` without return type, parameter list, qualifiers and clone suffixes:
/// `int geo::biggest<int>(int, int)` is `geo::biggest<int>`, `geo::Rect::area() const`
/// is `geo::Rect::area`, `geo::V::operator()(int)` is `geo::V::operator()`.
pub fn qualified_name(name: &str) -> &str {
    // GCC's clones (`f(int) [clone .constprop.0]`) and symbol versions are not part of the name.
    let mut name = match name.find(" [clone ") {
        Some(i) => &name[..i],
        None => name,
    };
    if let Some(i) = name.find("@@").or_else(|| name.rfind('@').filter(|&i| !name[i..].contains(')'))) {
        if !name.ends_with("@plt") {
            name = &name[..i];
        }
    }
    if let Some(open) = params_start(name) {
        // `operator()(int)`: the list is the second pair of parentheses.
        name = &name[..open];
    }
    // A return type (template functions) ends at the last space outside brackets before the
    // qualified name, not counting an operator's own (`operator new`, `operator bool`).
    let scan_end = name.rfind("operator").filter(|&i| is_operator_at(name, i)).unwrap_or(name.len());
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in name[..scan_end].char_indices() {
        match c {
            '<' | '(' | '[' | '{' => depth += 1,
            '>' | ')' | ']' | '}' => depth -= 1,
            ' ' if depth == 0 => start = i + 1,
            _ => {}
        }
    }
    &name[start..]
}

/// `name` from its qualified name on: without the return type a template function's
/// demangled name starts with (`int geo::biggest<int>(int, int)`).
fn without_return_type(name: &str) -> &str {
    let qualified = qualified_name(name);
    // The qualified name is a slice of `name` (or of its start, with a clone suffix cut).
    let start = qualified.as_ptr() as usize - name.as_ptr() as usize;
    &name[start..]
}

/// Whether `operator` at byte `i` of `name` is the keyword (not part of a longer identifier).
fn is_operator_at(name: &str, i: usize) -> bool {
    let before = name[..i].chars().next_back();
    let after = name[i + "operator".len()..].chars().next();
    !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// `qualified` with its template argument lists taken out (`geo::Box<int>::get` is
/// `geo::Box::get`), operators' own `<` and `>` kept (`operator<<`, `operator->`).
fn without_template_args(qualified: &str) -> String {
    let mut out = String::with_capacity(qualified.len());
    let mut depth = 0u32;
    let mut rest = qualified;
    while let Some(c) = rest.chars().next() {
        // An operator's symbol is copied as it is (`operator<<`, `operator()`).
        if depth == 0 && rest.starts_with("operator") && is_operator_at(qualified, qualified.len() - rest.len()) {
            let symbol = rest["operator".len()..].find(|c: char| !"<>=!+-*/%^&|~[](),".contains(c));
            let end = "operator".len() + symbol.unwrap_or(rest.len() - "operator".len());
            out.push_str(&rest[..end]);
            rest = &rest[end..];
            continue;
        }
        match c {
            '<' => depth += 1,
            '>' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        assert_eq!(qualified_name("geo::Rect::area() const"), "geo::Rect::area");
        assert_eq!(qualified_name("int geo::biggest<int>(int, int)"), "geo::biggest<int>");
        assert_eq!(qualified_name("geo::V::operator()(int) const"), "geo::V::operator()");
        assert_eq!(qualified_name("geo::operator<<(std::ostream&, geo::V const&)"), "geo::operator<<");
        assert_eq!(qualified_name("geo::V::operator bool() const"), "geo::V::operator bool");
        assert_eq!(qualified_name("main"), "main");
        assert_eq!(qualified_name("f(int) [clone .constprop.0]"), "f");
        assert_eq!(qualified_name("memcpy@@GLIBC_2.14"), "memcpy");
        assert_eq!(qualified_name("printf@plt"), "printf@plt");
        assert_eq!(
            qualified_name("std::vector<int, std::allocator<int> >::push_back(int const&)"),
            "std::vector<int, std::allocator<int> >::push_back"
        );
        assert_eq!(
            without_template_args("std::vector<int, std::allocator<int> >::push_back"),
            "std::vector::push_back"
        );
        assert_eq!(without_template_args("geo::operator<<"), "geo::operator<<");
        assert_eq!(without_template_args("geo::V::operator->"), "geo::V::operator->");
        assert_eq!(without_template_args("geo::V::operator()"), "geo::V::operator()");
        assert_eq!(without_template_args("geo::biggest<int>"), "geo::biggest");
    }

    fn names(v: &[&str]) -> Vec<(String, String)> {
        v.iter().map(|n| (n.to_string(), n.to_string())).collect()
    }

    #[test]
    fn selection() {
        let all = names(&[
            "geo::Rect::area() const",
            "geo::Tri::area() const",
            "geo::total(geo::Shape const**, int)",
            "geo::scale(int)",
            "geo::scale(double)",
            "int geo::biggest<int>(int, int)",
            "double geo::biggest<double>(double, double)",
            "main",
        ]);
        let pick = |q: &str| FunctionQuery::new(q).select(all.clone());
        assert_eq!(pick("geo::Rect::area").unwrap(), ["geo::Rect::area() const"]);
        assert_eq!(pick("Rect::area").unwrap(), ["geo::Rect::area() const"]);
        assert_eq!(pick("geo::Rect::area() const").unwrap(), ["geo::Rect::area() const"]);
        assert_eq!(pick("_ZNK3geo4Rect4areaEv").unwrap(), ["geo::Rect::area() const"]);
        assert_eq!(pick("total").unwrap(), ["geo::total(geo::Shape const**, int)"]);
        assert_eq!(pick("scale").unwrap(), ["geo::scale(int)", "geo::scale(double)"]);
        assert_eq!(pick("geo::scale(double)").unwrap(), ["geo::scale(double)"]);
        assert_eq!(pick("biggest").unwrap().len(), 2);
        assert_eq!(pick("biggest<int>").unwrap(), ["int geo::biggest<int>(int, int)"]);
        assert_eq!(pick("geo::biggest<int>(int,int)").unwrap(), ["int geo::biggest<int>(int, int)"]);
        assert_eq!(pick("int geo::biggest<int>(int, int)").unwrap(), ["int geo::biggest<int>(int, int)"]);
        assert_eq!(pick("main").unwrap(), ["main"]);
        assert_eq!(
            pick("area"),
            Err(NameError::Ambiguous {
                query: "area".into(),
                candidates: vec!["geo::Rect::area".into(), "geo::Tri::area".into()]
            })
        );
        assert_eq!(pick("ect::area"), Err(NameError::NotFound("ect::area".into())));
        assert_eq!(pick("nothing"), Err(NameError::NotFound("nothing".into())));
    }
}
