use std::fmt;

/// Why a byte buffer could not be decoded. Receivers count these and drop the packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The buffer ended before the named field.
    Truncated { what: &'static str },
    /// A field held a value outside its allowed set.
    BadValue { what: &'static str, value: u64 },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::Truncated { what } => write!(f, "packet truncated before field `{what}`"),
            WireError::BadValue { what, value } => write!(f, "field `{what}` has invalid value {value}"),
        }
    }
}

impl std::error::Error for WireError {}
