//! The register layout a stub describes in `qXfer:features:read:target.xml`
//! (and the files it includes): register numbers for `p` requests, in
//! document order, numbered from 0 unless a `regnum` attribute says
//! otherwise (GDB's rules).

use super::protocol::{Connection, GdbError};
use std::collections::HashMap;

/// One register: its number for `p`/`P` and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Register {
    pub number: u32,
    pub bits: u32,
}

/// Registers by name, and the `<architecture>` the stub named.
#[derive(Clone, Debug, Default)]
pub struct RegisterMap {
    pub registers: HashMap<String, Register>,
    pub architecture: Option<String>,
}

/// Value of `name="..."` in a tag's text.
fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=");
    let mut rest = tag;
    while let Some(i) = rest.find(&key) {
        // Only whole attribute names (not `regnum=` when looking for `num=`).
        let before = rest[..i].chars().last();
        let after = &rest[i + key.len()..];
        if before.is_none_or(|c| c.is_whitespace()) {
            let quote = after.chars().next()?;
            if quote == '"' || quote == '\'' {
                let v = &after[1..];
                return v.find(quote).map(|end| &v[..end]);
            }
        }
        rest = after;
    }
    None
}

impl RegisterMap {
    /// Fetch target.xml and everything it includes, in order.
    pub fn fetch(conn: &mut Connection) -> Result<RegisterMap, GdbError> {
        let mut map = RegisterMap::default();
        let mut next = 0u32;
        map.add_document(conn, "target.xml", &mut next, 0)?;
        if map.registers.is_empty() {
            return Err(GdbError::Malformed("the target description names no registers".into()));
        }
        Ok(map)
    }

    fn add_document(&mut self, conn: &mut Connection, annex: &str, next: &mut u32, depth: u32) -> Result<(), GdbError> {
        if depth > 8 {
            return Err(GdbError::Malformed("target description includes nest too deeply".into()));
        }
        let xml = conn.qxfer("features", annex)?;
        let xml = String::from_utf8_lossy(&xml).into_owned();
        // Includes are expanded where they stand, continuing the numbering.
        self.parse(&xml, next, &mut |annex, next| self_include(conn, annex, next, depth))
    }

    /// Walk the tags of one document; `include` expands an `<xi:include>` in place.
    fn parse(
        &mut self,
        xml: &str,
        next: &mut u32,
        include: &mut dyn FnMut(&str, &mut u32) -> Result<RegisterMap, GdbError>,
    ) -> Result<(), GdbError> {
        let mut rest = xml;
        while let Some(open) = rest.find('<') {
            let after = &rest[open + 1..];
            let close = after.find('>').ok_or_else(|| GdbError::Malformed("unterminated tag in target.xml".into()))?;
            let tag = &after[..close];
            if tag.starts_with("reg ") || tag.starts_with("reg\t") {
                let name = attribute(tag, "name")
                    .ok_or_else(|| GdbError::Malformed(format!("register without a name: <{tag}>")))?;
                let bits = attribute(tag, "bitsize").and_then(|b| b.parse().ok()).unwrap_or(0);
                if let Some(n) = attribute(tag, "regnum").and_then(|n| n.parse().ok()) {
                    *next = n;
                }
                self.registers.insert(name.to_string(), Register { number: *next, bits });
                *next += 1;
            } else if tag.starts_with("xi:include") {
                let href = attribute(tag, "href")
                    .ok_or_else(|| GdbError::Malformed(format!("include without href: <{tag}>")))?;
                let sub = include(href, next)?;
                self.registers.extend(sub.registers);
                if self.architecture.is_none() {
                    self.architecture = sub.architecture;
                }
            } else if tag == "architecture" {
                let text = &after[close + 1..];
                if let Some(end) = text.find('<') {
                    self.architecture = Some(text[..end].trim().to_string());
                }
            }
            rest = &after[close + 1..];
        }
        Ok(())
    }

    /// Byte offset of `r` in a `g` reply: registers are laid out in number order.
    pub fn g_offset(&self, r: Register) -> usize {
        self.registers.values().filter(|o| o.number < r.number).map(|o| o.bits as usize / 8).sum()
    }

    pub fn get(&self, name: &str) -> Result<Register, GdbError> {
        self.registers
            .get(name)
            .copied()
            .ok_or_else(|| GdbError::Malformed(format!("the target description has no register {name:?}")))
    }
}

/// Fetch and parse an included document, continuing the numbering.
fn self_include(conn: &mut Connection, annex: &str, next: &mut u32, depth: u32) -> Result<RegisterMap, GdbError> {
    let mut sub = RegisterMap::default();
    sub.add_document(conn, annex, next, depth + 1)?;
    Ok(sub)
}

/// A register value from `p` reply bytes in the target's byte order.
pub fn value(bytes: &[u8], big_endian: bool) -> Result<u64, GdbError> {
    if bytes.is_empty() || bytes.len() > 8 {
        return Err(GdbError::Malformed(format!("register value of {} bytes", bytes.len())));
    }
    let mut v = 0u64;
    if big_endian {
        for &b in bytes {
            v = v << 8 | b as u64;
        }
    } else {
        for &b in bytes.iter().rev() {
            v = v << 8 | b as u64;
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_registers_in_document_order() {
        let mut map = RegisterMap::default();
        let mut next = 0;
        let xml = r#"<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd">
            <target><architecture>powerpc:common64</architecture>
            <xi:include href="core.xml"/>
            <feature name="x"><reg name="pc" bitsize="64" type="code_ptr" regnum="64"/>
            <reg name="msr" bitsize="64"/></feature></target>"#;
        let mut include = |annex: &str, next: &mut u32| {
            assert_eq!(annex, "core.xml");
            let mut sub = RegisterMap::default();
            sub.parse(
                r#"<feature><reg name="r0" bitsize="64"/><reg name="r1" bitsize="64"/></feature>"#,
                next,
                &mut |_, _| unreachable!(),
            )?;
            Ok(sub)
        };
        map.parse(xml, &mut next, &mut include).unwrap();
        assert_eq!(map.get("r0").unwrap(), Register { number: 0, bits: 64 });
        assert_eq!(map.get("r1").unwrap().number, 1);
        assert_eq!(map.get("pc").unwrap().number, 64);
        assert_eq!(map.get("msr").unwrap().number, 65);
        assert_eq!(map.architecture.as_deref(), Some("powerpc:common64"));
        assert!(map.get("lr").is_err());
        assert!(map.parse("<reg name=\"x\"", &mut next, &mut include).is_err());
    }

    #[test]
    fn register_values_in_target_byte_order() {
        assert_eq!(value(&[0x10, 0, 0, 0, 0, 0, 0, 0], false).unwrap(), 0x10);
        assert_eq!(value(&[0, 0, 0, 0, 0x10, 0, 0x01, 0x10], true).unwrap(), 0x1000_0110);
        assert_eq!(value(&[0x00, 0x90, 0x04, 0x08], false).unwrap(), 0x0804_9000);
        assert!(value(&[], true).is_err());
    }
}
