//! Switch data-plane programs as sans-IO state machines (see `inalab_core::SwitchProgram`).
//! Plain L3 forwarding lives in `inalab-core` as the default program; the INA programs of
//! ATP, SwitchML, DSA, Canary, GRID and Rina are added here by later issues.

pub use inalab_core::L3Forward;
