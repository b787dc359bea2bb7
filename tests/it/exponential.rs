//! Tests: exponential.
