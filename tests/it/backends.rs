//! Tests: backends.
