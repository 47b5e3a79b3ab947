//! Living alongside other CUDA libraries.
//!
//! Raw handles come in through `unsafe` constructors on the runtime types themselves:
//! [`Stream::from_raw`](crate::Stream::from_raw), [`Function::from_raw`](crate::Function::from_raw)
//! and [`DeviceBuffer::from_raw`](crate::DeviceBuffer::from_raw), each with an owner value the
//! crate keeps alive for as long as anything uses the handle. The [`cudarc`] module (feature
//! `cudarc`) adapts cudarc's safe types on top of them.

pub mod cudarc;
