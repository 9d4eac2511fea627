//! Byte sizes as people write them: `4096`, `4k`, `1m`, `64KiB`, `2 GiB`.
//!
//! As in fio (with its default `kb_base=1024`), every suffix is binary: `k`, `kb` and
//! `kib` all mean 1024. Only whole numbers are accepted.

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error(
        "size {text:?}: expected a whole number of bytes, optionally followed by k, m, g, t or p"
    )]
    BadNumber { text: String },
    #[error(
        "size {text:?}: unknown unit {unit:?} (use b, k, m, g, t, p, optionally with B or iB)"
    )]
    UnknownUnit { text: String, unit: String },
    #[error("size {text:?} does not fit in 64 bits")]
    Overflow { text: String },
}

/// Parses a size in bytes. Zero is a valid size here; callers that need a positive size
/// (block sizes, capacities) check it themselves with their own error.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    if num.is_empty() {
        return Err(SizeError::BadNumber { text: t.into() });
    }
    let unit = unit.trim_start();
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ if unit.starts_with(['.', ',']) => return Err(SizeError::BadNumber { text: t.into() }),
        _ => {
            return Err(SizeError::UnknownUnit {
                text: t.into(),
                unit: unit.into(),
            })
        }
    };
    let n: u64 = num
        .parse()
        .map_err(|_| SizeError::Overflow { text: t.into() })?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow { text: t.into() })
}

/// Formats bytes with the largest binary unit that divides them exactly (`65536` ->
/// `64KiB`), so that a printed size parses back to the same number.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ];
    if bytes == 0 {
        return "0".into();
    }
    for (name, shift) in UNITS {
        if bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{name}", bytes >> shift);
        }
    }
    format!("{bytes}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_common_spellings() {
        let cases = [
            ("4096", 4096),
            ("4k", 4096),
            ("4K", 4096),
            ("4KB", 4096),
            ("64KiB", 65536),
            ("64 KiB", 65536),
            ("1m", 1 << 20),
            ("1M", 1 << 20),
            ("2GiB", 2 << 30),
            ("1t", 1 << 40),
            ("0", 0),
            ("512b", 512),
            (" 8k ", 8192),
        ];
        for (s, want) in cases {
            assert_eq!(parse_size(s), Ok(want), "{s}");
        }
    }

    #[test]
    fn rejects_nonsense_with_the_right_error() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        assert!(matches!(
            parse_size("4x"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(parse_size("k"), Err(SizeError::BadNumber { .. })));
        assert!(matches!(
            parse_size("-4k"),
            Err(SizeError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_size("1.5m"),
            Err(SizeError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_size("4kk"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            parse_size("16384p"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("99999999999999999999999"),
            Err(SizeError::Overflow { .. })
        ));
    }

    #[test]
    fn format_round_trips() {
        for b in [0u64, 1, 512, 4096, 65536, 1 << 20, 3 << 30, 4097, 1 << 50] {
            assert_eq!(parse_size(&format_size(b)), Ok(b), "{b}");
        }
        assert_eq!(format_size(65536), "64KiB");
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,12}") {
            let _ = parse_size(&s);
        }
    }
}
