//! The replayer: a trace through several pool configurations at once, on
//! trace time, over a cost-model allocator.
//!
//! `cost` prices the backing allocator's calls ([`CostModel`],
//! [`ModelledAllocator`]), `config` describes what runs ([`Config`],
//! [`ReplayOptions`]), `replayer` runs it ([`Replayer`]) and `report` says
//! what each configuration did ([`Report`]).

mod config;
mod cost;
mod replayer;
mod report;

pub use config::{Config, PageSize, PolicyKind, ReplayOptions};
pub use cost::{CostCurve, CostModel, ModelledAllocator, OutOfMemory};
pub use replayer::Replayer;
pub use report::{Report, format_table, reports_to_json};
