//! The Group Sync Table of a CAIS switch chip (paper §III-B.2, Fig. 8(b)).
//!
//! It counts the TBs of a TB group that have registered (one empty packet from each
//! GPU's TB-group synchroniser) and, once every GPU of the group has, releases them
//! all (one empty packet to each). Its entries are finite (`cais.sync_entries`): a
//! registration for a new group that finds the table full waits in its input
//! buffer, holding its credits, until an entry frees.
//!
//! An entry times out (`cais.sync_timeout_us`, as the merge table's entries do): a
//! group not complete that long after its first member registered releases the
//! members it has, and a member that registers after that is released at once. So a
//! group whose members cannot all start (every SM of a GPU held by TBs waiting for
//! their own groups) delays its TBs but never deadlocks them; the timeouts are counted.

use std::collections::VecDeque;

use rustc_hash::FxHashMap as HashMap;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};

use crate::engine::train::Train;

/// Registrations per TB group key, up to `entries` groups at once.
pub(crate) struct GroupSyncTable {
    entries: usize,
    /// Group key -> its registrations so far, in arrival order.
    groups: HashMap<i64, Vec<Py<Train>>>,
    /// Registrations for new groups that found the table full, in arrival order.
    waiting: VecDeque<Py<Train>>,
    /// Most groups held at once.
    pub(crate) peak: usize,
    pub(crate) registrations: i64,
    /// New groups' deadlines, in the order they came (one timeout for all: in time order).
    deadlines: VecDeque<(i64, i64)>,
    /// Groups that timed out, with the members still to come (released as they do).
    late: HashMap<i64, i64>,
    /// Groups released by their timeout.
    pub(crate) timeouts: i64,
}

/// What admitting a registration did to the table.
pub(crate) enum Admitted {
    /// Counted; its group still lacks members.
    Counted,
    /// Counted, and it completed its group: these registrations are released.
    Complete(Vec<Py<Train>>),
}

impl GroupSyncTable {
    pub(crate) fn new(entries: usize) -> Self {
        GroupSyncTable {
            entries,
            groups: HashMap::default(),
            waiting: VecDeque::new(),
            peak: 0,
            registrations: 0,
            deadlines: VecDeque::new(),
            late: HashMap::default(),
            timeouts: 0,
        }
    }

    /// Whether a registration of group `tag` comes after the group timed out: it is
    /// then released at once (true), and counted off the members still to come.
    pub(crate) fn late_member(&mut self, tag: i64) -> bool {
        let Some(left) = self.late.get_mut(&tag) else {
            return false;
        };
        self.registrations += 1;
        *left -= 1;
        if *left <= 0 {
            self.late.remove(&tag);
        }
        true
    }

    /// Note that group `tag`, new in the table, times out at `deadline`.
    pub(crate) fn arm(&mut self, tag: i64, deadline: i64) {
        self.deadlines.push_back((deadline, tag));
    }

    /// The groups whose deadline has come by `now` and that are still incomplete,
    /// taken out of the table with their members (their later members will be released
    /// as they come); `expect_of` reads a registration's expected count.
    pub(crate) fn expire(&mut self, now: i64, expect_of: impl Fn(&Py<Train>) -> i64) -> Vec<(i64, Vec<Py<Train>>)> {
        let mut out = Vec::new();
        while let Some(&(deadline, tag)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(members) = self.groups.remove(&tag) {
                let left = expect_of(&members[0]) - members.len() as i64;
                self.late.insert(tag, left);
                self.timeouts += 1;
                out.push((tag, members));
            }
        }
        out
    }

    /// Whether a registration for group `tag` finds no entry (the table is full and
    /// the group not in it): it must wait.
    pub(crate) fn full_for(&self, tag: i64) -> bool {
        !self.groups.contains_key(&tag) && self.groups.len() >= self.entries
    }

    /// Queue a registration that found the table full.
    pub(crate) fn wait(&mut self, req: Py<Train>) {
        self.waiting.push_back(req);
    }

    /// Count registration `req` of group `tag`, which has `expect` members.
    pub(crate) fn admit(&mut self, req: Py<Train>, tag: i64, expect: i64) -> Admitted {
        self.registrations += 1;
        let members = self.groups.entry(tag).or_default();
        // (a new group is armed by the chip, which knows the time: `arm`)
        members.push(req);
        let complete = members.len() as i64 >= expect;
        self.peak = self.peak.max(self.groups.len());
        if complete {
            Admitted::Complete(self.groups.remove(&tag).expect("just added"))
        } else {
            Admitted::Counted
        }
    }

    /// The first waiting registration, if an entry is free for it (its group is in
    /// the table, or the table has room); `tag_of` reads a registration's group.
    pub(crate) fn next_waiting(&mut self, tag_of: impl Fn(&Py<Train>) -> i64) -> Option<Py<Train>> {
        let first = self.waiting.front()?;
        if self.groups.contains_key(&tag_of(first)) || self.groups.len() < self.entries {
            self.waiting.pop_front()
        } else {
            None
        }
    }

    /// For the forward-progress watchdog: the groups still waiting for members (the
    /// lowest key as the example), with each registration's expected count.
    pub(crate) fn stuck(&self, expect_of: impl Fn(&Py<Train>) -> i64) -> Vec<String> {
        let Some((key, members)) = self.groups.iter().min_by_key(|(k, _)| **k) else {
            return Vec::new();
        };
        vec![format!(
            "group sync table: {} TB group(s) waiting for members (group {key}: {} of {} registered)",
            self.groups.len(),
            members.len(),
            expect_of(&members[0])
        )]
    }

    pub(crate) fn visit(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        for members in self.groups.values() {
            for t in members {
                visit.call(t)?;
            }
        }
        for t in &self.waiting {
            visit.call(t)?;
        }
        Ok(())
    }

    pub(crate) fn clear(&mut self) {
        self.groups.clear();
        self.waiting.clear();
        self.deadlines.clear();
        self.late.clear();
    }

    /// Whether group `tag` has an entry (members registered, not yet released).
    pub(crate) fn holds(&self, tag: i64) -> bool {
        self.groups.contains_key(&tag)
    }
}
