//! Host protocols.
