//! The address-range registry (placeholder until the registry lands).
