//! "Live allocations at exit by call site": the ranges still registered, grouped by the call
//! stack that allocated them (`CUHOOK_STACKS`), each site with its frames as
//! `function (file:line)`. Runs at report time, outside any hook: symbolizing reads each module's
//! DWARF line tables (`crate::stacks::symbolize`).

use std::collections::HashMap;
use std::fmt::Write;

use crate::events::Allocation;
use crate::stacks::module::Modules;
use crate::stacks::symbolize::Symbolizer;
use crate::stacks::{self, StackId};

use super::summary::bytes;

/// Sites listed with their frames, largest first; the rest are summed on one line.
const SITES_SHOWN: usize = 20;

/// What one call site left live.
#[derive(Default)]
struct Site {
    count: u64,
    bytes: u64,
    apis: Vec<&'static str>,
}

/// The section, or `None` when stacks were never recorded.
pub fn render(live: &[Allocation]) -> Option<String> {
    let table = stacks::table()?;
    let mut sites: HashMap<StackId, Site> = HashMap::new();
    for a in live {
        let site = sites.entry(a.stack).or_default();
        site.count += 1;
        site.bytes += a.size as u64;
        let api = a.api.to_str().unwrap_or("?");
        if !site.apis.contains(&api) {
            site.apis.push(api);
        }
    }
    let stats = table.stats();
    let (unsited, by_id): (Vec<_>, Vec<_>) = sites.into_iter().partition(|(id, _)| !id.is_stack());
    // Stacks that read the same once symbolized are one site: a call the compiler duplicated
    // (an unrolled loop) has several return addresses on one line.
    let modules = Modules::loaded();
    let mut symbolizer = Symbolizer::new();
    let mut merged: Vec<(Vec<String>, Site)> = Vec::new();
    let mut ids: Vec<(StackId, Site)> = by_id;
    ids.sort_by_key(|(id, _)| *id);
    for (id, site) in ids {
        let lines: Vec<String> = table
            .frames(id)
            .unwrap_or_default()
            .iter()
            .flat_map(|&pc| match modules.resolve(pc) {
                Some(frame) => symbolizer.describe(&frame, true),
                None => vec![format!("{pc:#x}")],
            })
            .collect();
        match merged.iter_mut().find(|(l, _)| *l == lines) {
            Some((_, into)) => {
                into.count += site.count;
                into.bytes += site.bytes;
                for api in site.apis {
                    if !into.apis.contains(&api) {
                        into.apis.push(api);
                    }
                }
            }
            None => merged.push((lines, site)),
        }
    }
    // Largest first; the same bytes in the order first seen, so the order is stable.
    merged.sort_by_key(|(_, s)| std::cmp::Reverse(s.bytes));
    let real = merged;
    let mut r = String::new();
    let _ = writeln!(
        r,
        "\nLive allocations at exit by call site: {} site{} ({} frames recorded per allocation)",
        real.len(),
        if real.len() == 1 { "" } else { "s" },
        stats.depth
    );
    for (lines, site) in real.iter().take(SITES_SHOWN) {
        let _ = writeln!(
            r,
            "  {} allocation{}, {} ({})",
            site.count,
            if site.count == 1 { "" } else { "s" },
            bytes(site.bytes),
            site.apis.join(", ")
        );
        for line in lines {
            let _ = writeln!(r, "      {line}");
        }
    }
    if real.len() > SITES_SHOWN {
        let rest = &real[SITES_SHOWN..];
        let _ = writeln!(
            r,
            "  {} more site{}: {} allocations, {}",
            rest.len(),
            if rest.len() == 1 { "" } else { "s" },
            rest.iter().map(|(_, s)| s.count).sum::<u64>(),
            bytes(rest.iter().map(|(_, s)| s.bytes).sum())
        );
    }
    for (id, site) in &unsited {
        let why = if *id == StackId::OTHER {
            "stack table full (CUHOOK_STACKS_MAX)"
        } else {
            "no stack recorded (allocated while stacks were off, or none could be captured)"
        };
        let _ = writeln!(
            r,
            "  {} allocation{}, {}: {why}",
            site.count,
            if site.count == 1 { "" } else { "s" },
            bytes(site.bytes)
        );
    }
    if stats.other > 0 {
        let _ = writeln!(
            r,
            "  ({} allocations in all found the stack table full: {} unique stacks kept)",
            stats.other, stats.capacity
        );
    }
    Some(r)
}
