//! Graph memory nodes added explicitly (`cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode`, and
//! memory nodes through the generic `cuGraphAddNode`/`cuGraphAddNode_v2`; the runtime's
//! `cudaGraphAdd*` reach the driver through `cuGetProcAddress`). A graph allocation has its
//! address from the moment the node is made, and keeps it on every launch, so it is registered
//! then (flagged GRAPH, like an allocation captured from a stream, but with no stream); a free
//! node takes it out when the free node is made, as a captured free does.
//!
//! # Safety
//! The parameter pointers are the caller's, passed to the driver unchanged; they are read only
//! where the C API says they are valid (the allocation's output once the call succeeded).
#![allow(unsafe_code)]

use std::ffi::CStr;

use super::abi::{
    GraphNodeParams, MemAllocNodeParams, GRAPH_NODE_MEM_ALLOC, GRAPH_NODE_MEM_FREE,
    MEM_LOCATION_DEVICE,
};
use super::emit::{self, Pending};
use crate::events::flags;

/// After a successful `cuGraphAddMemAllocNode`: register the node's allocation.
///
/// # Safety
/// `params` is null or the parameters the driver just filled in.
pub unsafe fn alloc_node(api: &'static CStr, params: *const MemAllocNodeParams) {
    if params.is_null() {
        return;
    }
    // SAFETY: non-null, filled by the driver (caller). Only the fields needed are read, one by
    // one (the reserved bytes the caller may have left unset are never copied).
    let (location_type, location_id, bytesize, dptr) = unsafe {
        (
            (*params).location_type,
            (*params).location_id,
            (*params).bytesize,
            (*params).dptr,
        )
    };
    let device = (location_type == MEM_LOCATION_DEVICE).then_some(location_id);
    emit::graph_alloc(api, dptr as usize, bytesize, device);
}

/// Before a `cuGraphAddNode*`: a memory free node announces its free (see
/// [`emit::free_before`]); other nodes change nothing.
///
/// # Safety
/// `params` is null or points at the caller's node description.
pub unsafe fn node_before(api: &'static CStr, params: *const GraphNodeParams) -> Pending {
    if params.is_null() {
        return Pending::Nothing;
    }
    // SAFETY: the caller's description (valid for the call); the type is a plain integer.
    if unsafe { (*params).node_type } != GRAPH_NODE_MEM_FREE {
        return Pending::Nothing;
    }
    // SAFETY: a free node's description holds the address first in the union.
    let dptr = unsafe { (*params).body.free };
    emit::free_before(api, dptr as usize, flags::GRAPH, 0).pending()
}

/// After a successful `cuGraphAddNode*`: a memory allocation node's allocation is registered.
///
/// # Safety
/// `params` is null or the node description the driver just filled in.
pub unsafe fn node_after(api: &'static CStr, params: *const GraphNodeParams) {
    if params.is_null() {
        return;
    }
    // SAFETY: as in `node_before`; an allocation node's parameters start the union.
    unsafe {
        if (*params).node_type == GRAPH_NODE_MEM_ALLOC {
            alloc_node(api, &raw const (*params).body.alloc);
        }
    }
}
