//! The matrix runner: the tuning plan's test levels (smoke, kernel path, correctness,
//! stress, performance, regression) over a list of presets, unattended and resumable, with
//! a markdown report and SVG charts; quick A/B alternation of two presets; and sparkrun /
//! Spark Arena recipe import and export. Levels, ordering, resume and the report:
//! docs/matrix.md.

pub mod ab;
pub mod cli;
pub mod plan;
pub mod progress;
pub mod recipe;
pub mod report;
pub mod run;
pub mod state;
