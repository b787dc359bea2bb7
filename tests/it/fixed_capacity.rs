//! Tests: fixed_capacity.
