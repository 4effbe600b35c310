//! Network config model, validation, template rendering, watching with last-good semantics.
