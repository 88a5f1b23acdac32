//! Demangling of C++ (Itanium ABI) and Rust symbol names.

use cpp_demangle::{DemangleOptions, Symbol};

use super::guarded;

/// The demangled form of `raw`, or `None` when it is not a mangled name.
///
/// Rust is tried first: legacy Rust names are valid Itanium names too, and
/// the C++ demangler would print their hash as a path element. The Rust form
/// is `{:#}`, without the hash.
pub(crate) fn demangle(raw: &str) -> Option<String> {
    // Versioned names from `.symver` ("_Z3fooi@@V1") keep their version.
    let (base, version) = match raw.find('@') {
        Some(i) => raw.split_at(i),
        None => (raw, ""),
    };
    let looks_mangled = ["_Z", "__Z", "_R", "__R"].iter().any(|p| base.starts_with(p));
    if !looks_mangled {
        return None;
    }
    if let Ok(d) = rustc_demangle::try_demangle(base) {
        return Some(format!("{d:#}{version}"));
    }
    if !base.starts_with("_Z") {
        return None;
    }
    let text = guarded(|| demangle_cpp(base))?;
    Some(format!("{text}{version}"))
}

fn demangle_cpp(mangled: &str) -> Option<String> {
    let sym = Symbol::new(mangled).ok()?;
    // Local names (`_ZZ<function>E<entity>`: local classes, lambdas, static
    // locals) are written without the enclosing function's return type,
    // as c++filt does; cpp_demangle would print it for template functions.
    let options =
        if mangled.starts_with("_ZZ") { DemangleOptions::new().no_return_type() } else { DemangleOptions::default() };
    let text = sym.demangle(&options).ok()?;
    let name_only = DemangleOptions::new().no_params().no_return_type();
    match sym.demangle(&name_only) {
        Ok(name) if is_template_ctor(&name) => Some(fix_template_ctor(mangled, &name).unwrap_or(text)),
        _ => Some(text),
    }
}

/// cpp_demangle (0.4 and 0.5) reads the first parameter type of a template
/// constructor as its return type (ctors have none) and drops it from the
/// parameter list (gimli-rs/cpp_demangle#129): `pair<int&, int&>(int&)`
/// for `pair<int&, int&>(int&, int&)`. Inserting a dummy `void` return type
/// right after the name gives it the type it expects and the right output.
/// The end of the name is the first position after an `E` where the
/// insertion leaves the name unchanged: inside the name it would add a
/// template argument or break the parse.
fn fix_template_ctor(mangled: &str, name: &str) -> Option<String> {
    let bytes = mangled.as_bytes();
    let name_only = DemangleOptions::new().no_params().no_return_type();
    for p in 1..bytes.len() {
        if bytes[p - 1] != b'E' {
            continue;
        }
        let candidate = format!("{}v{}", &mangled[..p], &mangled[p..]);
        let Ok(sym) = Symbol::new(candidate.as_str()) else {
            continue;
        };
        if sym.demangle(&name_only).ok().as_deref() == Some(name) {
            return sym.demangle(&DemangleOptions::default()).ok();
        }
    }
    None
}

/// True for names like `ns::Cls<A>::Cls<B>`: a constructor with its own
/// template arguments (the last component, minus its template arguments,
/// repeats the class name).
fn is_template_ctor(name: &str) -> bool {
    if !name.ends_with('>') {
        return false;
    }
    let parts = split_scopes(name);
    let [.., class, ctor] = parts.as_slice() else {
        return false;
    };
    let base = |s: &str| s.split('<').next().unwrap_or("").to_string();
    let ctor_base = base(ctor);
    ctor.len() > ctor_base.len() && !ctor_base.is_empty() && ctor_base == base(class)
}

/// Split at the `::` that are outside `<>`, `()` and `[]`.
fn split_scopes(name: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'<' | b'(' | b'[' => depth += 1,
            b'>' | b')' | b']' => depth -= 1,
            b':' if depth == 0 && bytes.get(i + 1) == Some(&b':') => {
                parts.push(&name[start..i]);
                start = i + 2;
                i += 1;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(&name[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::demangle;

    #[test]
    fn rust_and_cpp() {
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE").as_deref(), Some("core::fmt::write"));
        assert_eq!(demangle("_RNvCs1234_4test4main").as_deref(), Some("test::main"));
        assert_eq!(demangle("_Z3fooi").as_deref(), Some("foo(int)"));
        assert_eq!(demangle("_ZN3foo3barEv").as_deref(), Some("foo::bar()"));
        assert_eq!(demangle("_Z3fooi@@VERS_1").as_deref(), Some("foo(int)@@VERS_1"));
        assert_eq!(demangle("main"), None);
        assert_eq!(demangle("Rabbit"), None);
        assert_eq!(demangle("_Zgarbage"), None);
    }

    #[test]
    fn template_constructor_keeps_its_first_parameter() {
        // c++filt: std::pair<std::_Rb_tree_node_base*, std::_Rb_tree_node_base*>::pair<
        //   std::_Rb_tree_node_base*&, std::_Rb_tree_node_base*&, true>(
        //   std::_Rb_tree_node_base*&, std::_Rb_tree_node_base*&)
        let m = "_ZNSt4pairIPSt18_Rb_tree_node_baseS1_EC2IRS1_S4_Lb1EEEOT_OT0_";
        assert_eq!(
            demangle(m).as_deref(),
            Some(
                "std::pair<std::_Rb_tree_node_base*, std::_Rb_tree_node_base*>::pair<\
                 std::_Rb_tree_node_base*&, std::_Rb_tree_node_base*&, true>(\
                 std::_Rb_tree_node_base*&, std::_Rb_tree_node_base*&)"
            )
        );
        // A template function that is not a constructor is left alone.
        assert_eq!(demangle("_Z5twiceIiET_S0_").as_deref(), Some("int twice<int>(int)"));
    }
}
