use std::fmt;

/// An invalid spec, found before simulating. `field` is a dotted path into the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimError {
    pub field: String,
    pub message: String,
}

impl SimError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        SimError { field: field.into(), message: message.into() }
    }
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl std::error::Error for SimError {}

impl From<inalab_topo::TopoError> for SimError {
    fn from(e: inalab_topo::TopoError) -> Self {
        SimError { field: e.field, message: e.message }
    }
}
