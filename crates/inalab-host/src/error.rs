use std::fmt;

/// A protocol was constructed with an invalid group or configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid host protocol configuration: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Returns `Err(ConfigError)` with a formatted message when `cond` is false.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::ConfigError(format!($($msg)+)));
        }
    };
}
pub(crate) use ensure;
