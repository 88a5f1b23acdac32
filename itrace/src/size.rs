//! Sizes on the command line (`65536`, `64K`, `8M`, `1G`: powers of 1024) and in messages.

/// Parse a byte size with an optional K, M or G suffix.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m: usize = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("unknown size unit '{c}' in '{s}' (use K, M or G)")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: usize = num.trim().parse().map_err(|_| format!("'{s}' is not a size (examples: 65536, 64K, 8M, 1G)"))?;
    n.checked_mul(mult).filter(|&v| v > 0).ok_or_else(|| format!("size '{s}' is out of range"))
}

pub use itrace_format::human_size;

#[cfg(test)]
mod tests {
    use super::{human_size, parse_size};

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(0), "0 bytes");
        assert_eq!(human_size(1023), "1023 bytes");
        assert_eq!(human_size(65536), "64.0 KiB");
        assert_eq!(human_size(1_021_852_956), "974.5 MiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
    }

    #[test]
    fn units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("8m"), Ok(8 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("-5K").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }
}
