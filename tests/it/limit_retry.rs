//! Tests: limit_retry.
