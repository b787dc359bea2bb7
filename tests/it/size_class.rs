//! Tests: size_class.
