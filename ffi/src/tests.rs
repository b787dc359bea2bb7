//! Tests through the C entry points.
