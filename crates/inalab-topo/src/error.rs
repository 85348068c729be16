use std::fmt;

/// A topology that cannot be built, naming the offending field and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopoError {
    pub field: String,
    pub message: String,
}

impl TopoError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        TopoError { field: field.into(), message: message.into() }
    }
}

impl fmt::Display for TopoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for TopoError {}
