//! Volume sizes from Kubernetes quantities (parsed by [`kube_controller_kit::quantity`]),
//! rounded up to whole MiB, and back.

use std::fmt;

use kube_controller_kit::quantity::{Quantity, QuantityError};

/// Why a quantity cannot be used as a volume size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum QuantityProblem {
    /// Not a Kubernetes quantity at all (the error names the text and says why).
    NotAQuantity(QuantityError),
    /// Zero or negative.
    NotPositive,
    /// More than a CNS volume can hold (1 EiB, [`MAX_MIB`]).
    TooLarge,
}

impl fmt::Display for QuantityProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAQuantity(error) => error.fmt(f),
            Self::NotPositive => f.write_str("must be greater than zero"),
            Self::TooLarge => f.write_str("too large (more than 1Ei)"),
        }
    }
}

const MIB: u64 = 1 << 20;
/// Largest size accepted: no datastore is bigger than 2^40 MiB (1 EiB).
const MAX_MIB: u64 = 1 << 40;

/// Parses a Kubernetes quantity and returns its size in MiB, rounded up.
pub(crate) fn mib_rounded_up(text: &str) -> Result<u64, QuantityProblem> {
    let quantity: Quantity = text.parse().map_err(QuantityProblem::NotAQuantity)?;
    if !quantity.is_positive() {
        return Err(QuantityProblem::NotPositive);
    }
    let mib = quantity.units_rounded_up(MIB);
    u64::try_from(mib)
        .ok()
        .filter(|mib| *mib <= MAX_MIB)
        .ok_or(QuantityProblem::TooLarge)
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
        let not_a_quantity =
            |text: &str| QuantityProblem::NotAQuantity(text.parse::<Quantity>().unwrap_err());
        let cases = [
            ("", not_a_quantity("")),
            ("Gi", not_a_quantity("Gi")),
            ("1..5Gi", not_a_quantity("1..5Gi")),
            ("1Gb", not_a_quantity("1Gb")),
            ("1 Gi", not_a_quantity("1 Gi")),
            ("1e", not_a_quantity("1e")),
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
        let message = mib_rounded_up("1Gb").unwrap_err().to_string();
        assert!(
            message.contains("\"1Gb\"") && message.contains("unknown suffix \"Gb\""),
            "{message}"
        );
        assert_eq!(
            mib_rounded_up("2Ei").unwrap_err().to_string(),
            "too large (more than 1Ei)"
        );
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
