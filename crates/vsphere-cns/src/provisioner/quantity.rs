//! Kubernetes resource quantities (`1Gi`, `500M`, `1.5e9`), rounded up to whole MiB.

use std::fmt;

/// Why a quantity cannot be used as a volume size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum QuantityProblem {
    /// Not a Kubernetes quantity at all.
    Malformed,
    /// An unknown suffix, for example `1Gb`.
    UnknownSuffix(String),
    /// Zero or negative.
    NotPositive,
    /// More than a CNS volume can hold (or than we can compute exactly).
    TooLarge,
}

impl fmt::Display for QuantityProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Malformed => f.write_str("not a valid quantity"),
            Self::UnknownSuffix(suffix) => write!(f, "unknown suffix {suffix:?}"),
            Self::NotPositive => f.write_str("must be greater than zero"),
            Self::TooLarge => f.write_str("too large"),
        }
    }
}

const MIB: u128 = 1 << 20;
/// Largest size accepted: 2^63 - 1 MiB would overflow nothing, but no datastore is that big;
/// we stop at 2^40 MiB (1 EiB).
const MAX_MIB: u128 = 1 << 40;
/// Significant digits kept exactly (u128 holds 38).
const MAX_DIGITS: usize = 30;

/// Parses a Kubernetes quantity (binary `Ki`..`Ei`, decimal `n u m k M G T P E`, or an
/// exponent `e3`/`E3`) and returns its size in MiB, rounded up.
pub(crate) fn mib_rounded_up(text: &str) -> Result<u64, QuantityProblem> {
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
        return Err(QuantityProblem::Malformed);
    }
    let (exp10, exp2) = suffix_exponents(suffix)?;
    let mut digits: String = format!("{whole}{fraction}");
    let mut exp10 =
        exp10 - i64::try_from(fraction.len()).map_err(|_| QuantityProblem::Malformed)?;
    // Normalise: no leading zeros, trailing zeros moved into the exponent.
    let trimmed = digits.trim_start_matches('0').len();
    digits.drain(..digits.len() - trimmed);
    while digits.ends_with('0') {
        digits.pop();
        exp10 += 1;
    }
    if digits.is_empty() {
        return Err(QuantityProblem::NotPositive);
    }
    if negative {
        return Err(QuantityProblem::NotPositive);
    }
    if digits.len() > MAX_DIGITS {
        return Err(QuantityProblem::TooLarge);
    }
    let mantissa: u128 = digits.parse().map_err(|_| QuantityProblem::Malformed)?;
    // Every digit string has at most 30 digits, so 10^-exp10 beyond 10^30 makes the value
    // smaller than one byte.
    if exp10 < -(MAX_DIGITS as i64) {
        return Ok(1);
    }
    let (mut numerator, denominator) = if exp10 >= 0 {
        let scale = 10u128
            .checked_pow(u32::try_from(exp10).map_err(|_| QuantityProblem::TooLarge)?)
            .ok_or(QuantityProblem::TooLarge)?;
        (
            mantissa
                .checked_mul(scale)
                .ok_or(QuantityProblem::TooLarge)?,
            1u128,
        )
    } else {
        let scale = 10u128.pow(u32::try_from(-exp10).map_err(|_| QuantityProblem::Malformed)?);
        (mantissa, scale)
    };
    numerator = numerator
        .checked_mul(1u128 << exp2)
        .ok_or(QuantityProblem::TooLarge)?;
    let unit = denominator * MIB;
    let mib = numerator.div_ceil(unit);
    if mib > MAX_MIB {
        return Err(QuantityProblem::TooLarge);
    }
    u64::try_from(mib).map_err(|_| QuantityProblem::TooLarge)
}

/// The powers of ten and of two a suffix stands for.
fn suffix_exponents(suffix: &str) -> Result<(i64, u32), QuantityProblem> {
    let unknown = || QuantityProblem::UnknownSuffix(suffix.to_owned());
    Ok(match suffix {
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
        _ if suffix.len() > 1 && (suffix.starts_with('e') || suffix.starts_with('E')) => {
            let exponent = &suffix[1..];
            let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(unknown());
            }
            let value: i64 = exponent.parse().map_err(|_| QuantityProblem::TooLarge)?;
            if value.abs() > 1000 {
                return Err(QuantityProblem::TooLarge);
            }
            (value, 0)
        }
        _ => return Err(unknown()),
    })
}

/// A canonical quantity for `mib` MiB: `Ti`, `Gi` or `Mi`, whichever is exact.
pub(crate) fn format_mib(mib: u64) -> String {
    if mib.is_multiple_of(1 << 20) {
        format!("{}Ti", mib >> 20)
    } else if mib.is_multiple_of(1 << 10) {
        format!("{}Gi", mib >> 10)
    } else {
        format!("{mib}Mi")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_decimal_and_exponent_quantities_round_up_to_mib() {
        let cases = [
            ("1Mi", 1),
            ("1Gi", 1024),
            ("1.5Gi", 1536),
            ("2Ti", 2 << 20),
            ("1Pi", 1 << 30),
            ("1Ei", 1 << 40),
            ("1Ki", 1),
            ("1025Ki", 2),
            ("1", 1),
            ("1048576", 1),
            ("1048577", 2),
            ("1M", 1),       // 10^6 bytes < 1 MiB
            ("1G", 954),     // 10^9 / 2^20 = 953.67
            ("500M", 477),   // 476.84
            ("1T", 953_675), // 953674.3
            ("1e9", 954),    // exponent form
            ("1E9", 954),    // capital exponent form
            ("1e+9", 954),
            ("10e-1", 1), // one byte
            ("0.5Gi", 512),
            (".5Gi", 512),
            ("5.", 1),
            ("+1Gi", 1024),
            ("1000m", 1), // one byte
            ("1500000000n", 1),
            ("1k", 1),
            ("0001Gi", 1024),
            ("1.000000000000000000000000000000000000000Gi", 1024),
            ("1e-40", 1),
        ];
        for (text, mib) in cases {
            assert_eq!(mib_rounded_up(text), Ok(mib), "{text}");
        }
    }

    #[test]
    fn bad_quantities_say_why() {
        let cases = [
            ("", QuantityProblem::Malformed),
            ("Gi", QuantityProblem::Malformed),
            ("1..5Gi", QuantityProblem::Malformed),
            ("1.5.5", QuantityProblem::Malformed),
            ("1Gb", QuantityProblem::UnknownSuffix("Gb".into())),
            ("1 Gi", QuantityProblem::UnknownSuffix(" Gi".into())),
            ("1gi", QuantityProblem::UnknownSuffix("gi".into())),
            ("1e", QuantityProblem::UnknownSuffix("e".into())),
            ("1ex", QuantityProblem::UnknownSuffix("ex".into())),
            ("0", QuantityProblem::NotPositive),
            ("0Gi", QuantityProblem::NotPositive),
            ("-1Gi", QuantityProblem::NotPositive),
            ("2Ei", QuantityProblem::TooLarge),
            ("1e30", QuantityProblem::TooLarge),
            ("1e99999", QuantityProblem::TooLarge),
            (
                "1234567890123456789012345678901234567890",
                QuantityProblem::TooLarge,
            ),
        ];
        for (text, problem) in cases {
            assert_eq!(mib_rounded_up(text), Err(problem), "{text:?}");
        }
    }

    #[test]
    fn sizes_are_formatted_exactly() {
        assert_eq!(format_mib(1), "1Mi");
        assert_eq!(format_mib(954), "954Mi");
        assert_eq!(format_mib(1024), "1Gi");
        assert_eq!(format_mib(1536), "1536Mi");
        assert_eq!(format_mib(1 << 20), "1Ti");
    }
}
