#![doc = include_str!("../README.md")]

mod binder;
mod conn;
mod crd;
mod delete;
mod error;
mod events;
mod fault;
mod fields;
mod http;
mod kubeconfig;
mod load;
mod meta;
mod ops;
mod patch;
mod rbac;
mod requests;
mod resources;
mod selector;
mod shared;
mod sim;
mod status;
mod store;
mod strategic;
mod validation;
pub mod wait;

pub use crate::error::{Error, Result};
pub use crate::fault::{FaultRule, Verb};
pub use crate::load::{Cost, LoadModel, RequestCount};
pub use crate::requests::RequestRecord;
pub use crate::sim::{Builder, INITIAL_NAMESPACES, KubeSim};
pub use crate::validation::PV_SOURCES;
