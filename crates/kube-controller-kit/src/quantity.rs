//! Kubernetes resource quantities (`resource.Quantity`: `1Gi`, `500M`, `1.5e9`, `250m`),
//! parsed exactly, as the API server does.
//!
//! [`k8s_openapi`]'s `Quantity` is the string as written; this module gives it a value, for a
//! controller that must compare sizes (a volume's capacity against a claim's request) or
//! turn one into whole units (MiB for a storage backend):
//!
//! ```
//! use kube_controller_kit::quantity::Quantity;
//!
//! let request: Quantity = "1Gi".parse()?;
//! let capacity: Quantity = "1073741824".parse()?;
//! assert_eq!(request, capacity);
//! assert!("1G".parse::<Quantity>()? < request);
//! assert_eq!(request.units_rounded_up(1 << 20), 1024);
//! assert!("1GB".parse::<Quantity>().unwrap_err().to_string().contains("\"1GB\""));
//! # Ok::<(), kube_controller_kit::quantity::QuantityError>(())
//! ```
//!
//! The grammar (the Go package's):
//!
//! ```text
//! quantity        ::= signedNumber suffix
//! signedNumber    ::= number | "+" number | "-" number
//! number          ::= digits | digits "." digits | digits "." | "." digits
//! suffix          ::= binarySI | decimalExponent | decimalSI
//! binarySI        ::= Ki | Mi | Gi | Ti | Pi | Ei
//! decimalSI       ::= n | u | m | "" | k | M | G | T | P | E
//! decimalExponent ::= "e" signedNumber | "E" signedNumber   (an integer exponent)
//! ```
//!
//! Like the API server, a parsed value keeps nano precision: a fraction finer than `1n` is
//! rounded up (away from zero), and magnitudes above 2^63 - 1 are capped at that value
//! ([`Quantity::MAX`]). Values are compared exactly, whatever suffix they were written with.

use std::fmt;
use std::str::FromStr;

/// Nano-units per unit.
const NANOS: i128 = 1_000_000_000;
/// The largest magnitude, in nano-units: (2^63 - 1) units, the API server's cap.
const MAX_NANOS: i128 = i64::MAX as i128 * NANOS;
/// Binary suffixes go up to 2^60 < 10^19: a number times 10^19 bounds it times any suffix.
const MAX_BINARY_DIGITS: i64 = 19;

/// A parsed Kubernetes quantity: a signed value with nano precision.
///
/// Parse one with [`str::parse`] (or [`Quantity::parse`]); compare with `<`, `==`, ...
/// (`"1Gi"` equals `"1073741824"`); convert with [`Quantity::units_rounded_up`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    /// Zero.
    pub const ZERO: Self = Self { nanos: 0 };
    /// The largest quantity the API server keeps (2^63 - 1); larger ones are capped to it.
    pub const MAX: Self = Self { nanos: MAX_NANOS };

    /// Parses `text` (see the [module docs](self) for the grammar); the error names `text`.
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        parse(text)
    }

    /// A whole number of units (bytes, for a storage size).
    pub fn from_units(units: i64) -> Self {
        Self {
            nanos: i128::from(units) * NANOS,
        }
    }

    /// The value in nano-units (10^-9), exact.
    pub fn as_nanos(self) -> i128 {
        self.nanos
    }

    /// Whether the value is greater than zero.
    pub fn is_positive(self) -> bool {
        self.nanos > 0
    }

    /// Whether the value is less than zero.
    pub fn is_negative(self) -> bool {
        self.nanos < 0
    }

    /// Whether the value is zero.
    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    /// How many `unit`s (in units: `1 << 20` for MiB of a byte quantity) it takes to hold the
    /// value, rounded up (towards positive infinity): `"1G"` is 954 MiB. Go's
    /// `Quantity.Value()` is `units_rounded_up(1)`.
    ///
    /// # Panics
    /// When `unit` is zero.
    pub fn units_rounded_up(self, unit: u64) -> i128 {
        assert!(
            unit > 0,
            "Quantity::units_rounded_up: the unit must not be zero"
        );
        let divisor = i128::from(unit) * NANOS;
        let quotient = self.nanos / divisor;
        if self.nanos % divisor > 0 {
            quotient + 1
        } else {
            quotient
        }
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        parse(text)
    }
}

/// Why a string is not a Kubernetes quantity. Each error names the string.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuantityError {
    /// No number where one belongs: empty, a bare sign or dot, two dots, a bare suffix.
    Malformed {
        /// The text as given.
        value: String,
    },
    /// The number is followed by something that is no suffix (`1GB`, `1gi`, `1 Gi`, `1e`).
    UnknownSuffix {
        /// The text as given.
        value: String,
        /// What follows the number.
        suffix: String,
    },
    /// An exponent (`1e99999999999`) too large to be read, as in Go (a 32-bit integer).
    ExponentOutOfRange {
        /// The text as given.
        value: String,
    },
}

impl QuantityError {
    /// The text that is not a quantity.
    pub fn value(&self) -> &str {
        match self {
            Self::Malformed { value }
            | Self::UnknownSuffix { value, .. }
            | Self::ExponentOutOfRange { value } => value,
        }
    }
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed { value } => write!(
                f,
                "{value:?} is not a quantity: expected a number (such as 1, 1.5 or .5, with an \
                 optional sign) and a suffix"
            ),
            Self::UnknownSuffix { value, suffix } => write!(
                f,
                "{value:?} is not a quantity: unknown suffix {suffix:?} (expected one of Ki, Mi, \
                 Gi, Ti, Pi, Ei, n, u, m, k, M, G, T, P, E, or an exponent such as e3)"
            ),
            Self::ExponentOutOfRange { value } => {
                write!(
                    f,
                    "{value:?} is not a quantity: its exponent is out of range"
                )
            }
        }
    }
}

impl std::error::Error for QuantityError {}

/// The powers of ten and of two a suffix stands for; `Ok(None)` for an exponent too large.
fn suffix_exponents(suffix: &str) -> Option<Result<(i64, u32), ()>> {
    Some(Ok(match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        _ => {
            let exponent = suffix.strip_prefix(['e', 'E'])?;
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            match exponent.parse::<i32>() {
                Ok(value) => (i64::from(value), 0),
                Err(_) => return Some(Err(())),
            }
        }
    }))
}

fn parse(text: &str) -> Result<Quantity, QuantityError> {
    let malformed = || QuantityError::Malformed {
        value: text.to_owned(),
    };
    let (negative, rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let (number, suffix) = rest.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(malformed());
    }
    let (exp10, exp2) = match suffix_exponents(suffix) {
        Some(Ok(exponents)) => exponents,
        Some(Err(())) => {
            return Err(QuantityError::ExponentOutOfRange {
                value: text.to_owned(),
            });
        }
        None => {
            return Err(QuantityError::UnknownSuffix {
                value: text.to_owned(),
                suffix: suffix.to_owned(),
            });
        }
    };
    // value = digits * 10^exp10 * 2^exp2, with digits an integer (no leading zeros).
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    let fraction_len = i64::try_from(fraction.len()).map_err(|_| malformed())?;
    let magnitude = nanos(digits, exp10 - fraction_len + 9, exp2);
    Ok(Quantity {
        nanos: if negative { -magnitude } else { magnitude },
    })
}

/// `digits * 10^exp10 * 2^exp2` nano-units, rounded up to a whole one and capped at
/// [`MAX_NANOS`]. `digits` has no leading zeros (empty is zero).
fn nanos(digits: &str, exp10: i64, exp2: u32) -> i128 {
    if digits.is_empty() {
        return 0;
    }
    let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    // The value is in [10^(order - 1), 10^(order + 19)).
    let order = len.saturating_add(exp10);
    if order > 29 {
        // At least 10^29 nano-units, above the cap (about 9.2 * 10^27).
        return MAX_NANOS;
    }
    if order.saturating_add(MAX_BINARY_DIGITS) <= 0 {
        // Less than one nano-unit, but not zero.
        return 1;
    }
    // Now exp10 lies within [-(len + 19), 29 - len]: the loops below are bounded by the
    // number of digits plus a constant.
    let mut value = Big::default();
    for digit in digits.bytes() {
        value.mul_add(10, u32::from(digit - b'0'));
    }
    for _ in 0..exp2 {
        value.mul_add(2, 0);
    }
    let mut inexact = false;
    if exp10 >= 0 {
        for _ in 0..exp10 {
            value.mul_add(10, 0);
        }
    } else {
        for _ in 0..exp10.unsigned_abs() {
            inexact |= value.div_rem(10) != 0;
        }
    }
    match value.to_u128() {
        Some(v) if v <= MAX_NANOS as u128 => {
            let v = v as i128 + i128::from(inexact);
            v.min(MAX_NANOS)
        }
        _ => MAX_NANOS,
    }
}

/// A non-negative integer of any size (little-endian base 2^32 limbs), for exact parsing.
#[derive(Default)]
struct Big {
    limbs: Vec<u32>,
}

impl Big {
    /// `self = self * factor + add`.
    fn mul_add(&mut self, factor: u32, add: u32) {
        let mut carry = u64::from(add);
        for limb in &mut self.limbs {
            let product = u64::from(*limb) * u64::from(factor) + carry;
            *limb = product as u32;
            carry = product >> 32;
        }
        if carry > 0 {
            self.limbs.push(carry as u32);
        }
    }

    /// `self /= divisor`, returning the remainder.
    fn div_rem(&mut self, divisor: u32) -> u32 {
        let mut remainder = 0u64;
        for limb in self.limbs.iter_mut().rev() {
            let current = (remainder << 32) | u64::from(*limb);
            *limb = (current / u64::from(divisor)) as u32;
            remainder = current % u64::from(divisor);
        }
        while self.limbs.last() == Some(&0) {
            self.limbs.pop();
        }
        remainder as u32
    }

    fn to_u128(&self) -> Option<u128> {
        if self.limbs.len() > 4 {
            return None;
        }
        Some(
            self.limbs
                .iter()
                .rev()
                .fold(0u128, |acc, limb| (acc << 32) | u128::from(*limb)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        text.parse()
            .unwrap_or_else(|e| panic!("{text:?} should parse: {e}"))
    }

    #[test]
    fn accepts_the_grammar() {
        // (text, value in nano-units)
        let cases: [(&str, i128); 17] = [
            ("1Gi", 1_073_741_824 * NANOS),
            ("500Mi", 524_288_000 * NANOS),
            ("1.5G", 1_500_000_000 * NANOS),
            ("100", 100 * NANOS),
            ("+1k", 1000 * NANOS),
            ("-2", -2 * NANOS),
            ("1e3", 1000 * NANOS),
            ("1E-3", NANOS / 1000),
            ("1e+9", 1_000_000_000 * NANOS),
            (".5", NANOS / 2),
            ("5.", 5 * NANOS),
            ("250m", NANOS / 4),
            ("3u", 3000),
            ("7n", 7),
            ("0001Gi", 1_073_741_824 * NANOS),
            (
                "1.000000000000000000000000000000000000000Gi",
                1_073_741_824 * NANOS,
            ),
            ("0.5Gi", 536_870_912 * NANOS),
        ];
        for (text, nanos) in cases {
            assert_eq!(q(text).as_nanos(), nanos, "{text}");
        }
    }

    #[test]
    fn rejects_what_is_not_a_quantity_naming_it() {
        let malformed = |v: &str| QuantityError::Malformed { value: v.into() };
        let suffix = |v: &str, s: &str| QuantityError::UnknownSuffix {
            value: v.into(),
            suffix: s.into(),
        };
        let cases = [
            ("", malformed("")),
            (".", malformed(".")),
            ("+", malformed("+")),
            ("--1", malformed("--1")),
            ("Gi", malformed("Gi")),
            ("1..5Gi", malformed("1..5Gi")),
            ("1.2.3", malformed("1.2.3")),
            ("abc", malformed("abc")),
            ("1GB", suffix("1GB", "GB")),
            ("1Gb", suffix("1Gb", "Gb")),
            ("1gi", suffix("1gi", "gi")),
            ("1 Gi", suffix("1 Gi", " Gi")),
            ("1e", suffix("1e", "e")),
            ("1e+", suffix("1e+", "e+")),
            ("1ex", suffix("1ex", "ex")),
            ("1Ki2", suffix("1Ki2", "Ki2")),
            (
                "1e99999999999",
                QuantityError::ExponentOutOfRange {
                    value: "1e99999999999".into(),
                },
            ),
        ];
        for (text, error) in cases {
            let got = text.parse::<Quantity>().unwrap_err();
            assert_eq!(got, error, "{text:?}");
            assert_eq!(got.value(), text);
            assert!(
                got.to_string()
                    .starts_with(&format!("{text:?} is not a quantity")),
                "{got}"
            );
        }
    }

    #[test]
    fn values_compare_exactly_across_suffixes() {
        assert_eq!(q("1Gi"), q("1073741824"));
        assert_eq!(q("1Gi"), q("1024Mi"));
        assert_eq!(q("1k"), q("1e3"));
        assert_eq!(q("1"), q("1000m"));
        assert!(q("1G") < q("1Gi"));
        assert!(q("1073741823") < q("1Gi"));
        assert!(q("1073741824001m") > q("1Gi"));
        assert!(q("-1Gi") < q("0"));
        assert!(q("0").is_zero() && q("0Gi").is_zero() && q("-0").is_zero());
        assert!(q("1n").is_positive() && q("-1n").is_negative());
    }

    #[test]
    fn finer_than_nano_rounds_up_and_huge_values_are_capped() {
        assert_eq!(q("1e-40").as_nanos(), 1);
        assert_eq!(q("1.5n").as_nanos(), 2);
        assert_eq!(q("-1.5n").as_nanos(), -2, "rounded away from zero");
        assert_eq!(q("0.0000000001").as_nanos(), 1);
        assert_eq!(q("0.000000001").as_nanos(), 1);
        assert_eq!(q("1e30"), Quantity::MAX);
        assert_eq!(q("1e99999"), Quantity::MAX);
        assert_eq!(q("8Ei"), Quantity::MAX, "2^63 is just above the cap");
        assert_eq!(q("9223372036854775807"), Quantity::MAX);
        assert_eq!(
            q("9223372036854775806").units_rounded_up(1),
            9_223_372_036_854_775_806
        );
        assert_eq!(q("1234567890123456789012345678901234567890"), Quantity::MAX);
        assert_eq!(q("-1e30").as_nanos(), -MAX_NANOS);
        assert_eq!(q("1Ei").units_rounded_up(1), 1 << 60);
    }

    #[test]
    fn whole_units_round_up() {
        let mib = 1 << 20;
        let cases = [
            ("1Mi", 1),
            ("1Gi", 1024),
            ("1.5Gi", 1536),
            ("1Ki", 1),
            ("1025Ki", 2),
            ("1048576", 1),
            ("1048577", 2),
            ("1G", 954),
            ("500M", 477),
            ("1T", 953_675),
            ("10e-1", 1),
            ("1e-40", 1),
            ("0", 0),
            ("-1Mi", -1),
            ("-1.5Mi", -1),
        ];
        for (text, units) in cases {
            assert_eq!(q(text).units_rounded_up(mib), units, "{text}");
        }
        assert_eq!(Quantity::from_units(5), q("5"));
        assert_eq!(q("1.2").units_rounded_up(1), 2);
    }
}
