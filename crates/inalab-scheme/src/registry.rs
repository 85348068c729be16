//! The registry: the only list of schemes. A new scheme adds its line here.

use crate::plan::{JobSpec, PlanError, Scheme};
use serde_json::Value;

static SCHEMES: [&dyn Scheme; 11] = [
    &crate::ring::Ring { hierarchical: false },
    &crate::ring::Ring { hierarchical: true },
    &crate::ps::Ps { sharded: false },
    &crate::ps::Ps { sharded: true },
    &crate::atp::Atp,
    &crate::switchml::SwitchMl,
    &crate::dsa::Dsa,
    &crate::canary::Canary,
    &crate::static_tree::StaticTree,
    &crate::rina::Rina,
    &crate::grid::Grid,
];

/// Every scheme, in the order users see them.
pub fn schemes() -> &'static [&'static dyn Scheme] {
    &SCHEMES
}

/// The scheme called `name`, or an error listing the allowed names.
pub fn by_name(name: &str) -> Result<&'static dyn Scheme, PlanError> {
    SCHEMES.iter().copied().find(|s| s.name() == name).ok_or_else(|| {
        let names: Vec<String> = SCHEMES.iter().map(|s| format!("{:?}", s.name())).collect();
        PlanError::new("scheme", format!("unknown scheme {name:?}; allowed values: {}", names.join(", ")))
    })
}

/// The scheme a configuration names in its `scheme` key.
pub fn scheme_of(config: &Value) -> Result<&'static dyn Scheme, PlanError> {
    match config.get("scheme").and_then(Value::as_str) {
        Some(name) => by_name(name),
        None => Err(PlanError::new("scheme", "missing; a job's configuration names its scheme")),
    }
}

impl JobSpec {
    pub fn scheme(&self) -> Result<&'static dyn Scheme, PlanError> {
        scheme_of(&self.config)
    }
}
