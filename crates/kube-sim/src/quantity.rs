//! A parser for the Kubernetes quantity grammar (`resource.Quantity`), enough to validate
//! storage sizes and tell their sign.
//!
//! ```text
//! quantity      ::= signedNumber suffix
//! signedNumber  ::= number | "+" number | "-" number
//! number        ::= digits | digits "." digits | digits "." | "." digits
//! suffix        ::= binarySI | decimalExponent | decimalSI
//! binarySI      ::= Ki | Mi | Gi | Ti | Pi | Ei
//! decimalSI     ::= m | "" | k | M | G | T | P | E
//! decimalExponent ::= "e" signedNumber | "E" signedNumber
//! ```

/// The message the real server gives for a string that is not a quantity.
pub(crate) const QUANTITY_FORMAT: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";

/// A parsed quantity: its value as a float (enough to compare with zero).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Quantity {
    pub(crate) value: f64,
}

fn split_number(s: &str) -> Option<(&str, &str)> {
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
        .map_or(s.len(), |(i, _)| i);
    let (num, rest) = s.split_at(end);
    let dots = num.matches('.').count();
    if num.is_empty() || num == "." || dots > 1 {
        return None;
    }
    Some((num, rest))
}

/// Parses `s`; `None` when it is not a quantity.
pub(crate) fn parse(s: &str) -> Option<Quantity> {
    let (sign, body) = match s.as_bytes().first()? {
        b'+' => (1.0, &s[1..]),
        b'-' => (-1.0, &s[1..]),
        _ => (1.0, s),
    };
    let (num, suffix) = split_number(body)?;
    let base: f64 = if num.ends_with('.') {
        num.trim_end_matches('.').parse().ok()?
    } else if num.starts_with('.') {
        format!("0{num}").parse().ok()?
    } else {
        num.parse().ok()?
    };
    let factor = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exp => {
            let digits = exp.strip_prefix('e').or_else(|| exp.strip_prefix('E'))?;
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let e: i32 = digits.parse().ok()?;
            10f64.powi(e)
        }
    };
    Some(Quantity {
        value: sign * base * factor,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_grammar() {
        for (s, v) in [
            ("1Gi", 1073741824.0),
            ("500Mi", 524288000.0),
            ("1.5G", 1.5e9),
            ("100", 100.0),
            ("+1k", 1000.0),
            ("-2", -2.0),
            ("1e3", 1000.0),
            ("1E-3", 0.001),
            (".5", 0.5),
            ("5.", 5.0),
            ("250m", 0.25),
        ] {
            let q = parse(s).unwrap_or_else(|| panic!("{s} should parse"));
            assert!((q.value - v).abs() < 1e-6, "{s}: {} != {v}", q.value);
        }
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for s in [
            "", "Gi", "abc", "1GB", "1.2.3", "1 Gi", "1e", "1e+", "--1", "1Ki2", ".",
        ] {
            assert!(parse(s).is_none(), "{s:?} should not parse");
        }
    }
}
