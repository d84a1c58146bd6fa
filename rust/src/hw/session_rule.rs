//! How much of a CAIS merge unit's table a session takes, and when it may open: the
//! unit's session rule (`docs/cais.md`, "Table space per session: all or nothing").
//!
//! The rule is built from the unit's typed config (`switch.merge`: `entries`,
//! `line_bytes`, by those names) and sees a request that missed in the CAM and the
//! lines the table has free; it says how many lines the session needs and whether to
//! open it now, make room by evicting the replacement policy's victim
//! (`replacement/`) and ask again, or let the request bypass the unit. It knows
//! nothing else of the unit: which session goes is the replacement policy's, and a
//! victim still waiting for its data (Load-Wait) is marked to end once its data is
//! out while the request bypasses.
//!
//! Today's rule, [`AllOrNothing`], is the only one: a session covers its request's
//! train and needs all its lines at once, or the request bypasses whole. Another rule
//! is a file here implementing [`SessionRule`], returned by [`of`].

use crate::hw::params::MergeConfig;

/// What a session asking for lines may do now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Room {
    /// Open it: it has its lines.
    Open,
    /// Evict the replacement policy's victim and ask again.
    Evict,
    /// The request goes on to its home unmerged.
    Bypass,
}

/// A merge unit's session rule.
pub(crate) trait SessionRule: Send {
    /// The lines a session opened for a request of `nbytes` holds (a load: the bytes it
    /// asks for; a reduction: its payload).
    fn lines(&self, nbytes: i64) -> i64;
    /// A session needs `need` lines and the table has `free` lines free.
    fn room(&self, need: i64, free: i64) -> Room;
}

/// The merge unit's session rule for its config.
pub(crate) fn of(cfg: &MergeConfig) -> Box<dyn SessionRule> {
    Box::new(AllOrNothing {
        entries: cfg.entries,
        line_bytes: cfg.line_bytes,
    })
}

/// All or nothing: a session holds every line of `line_bytes` its request's bytes
/// fill (at least one), and opens only once it has them all; a request that needs
/// more lines than the whole table (`entries`) bypasses at once.
#[derive(Clone, Copy)]
pub(crate) struct AllOrNothing {
    entries: i64,
    line_bytes: i64,
}

impl SessionRule for AllOrNothing {
    fn lines(&self, nbytes: i64) -> i64 {
        1.max(-((-nbytes).div_euclid(self.line_bytes)))
    }

    fn room(&self, need: i64, free: i64) -> Room {
        if need > self.entries {
            Room::Bypass
        } else if free >= need {
            Room::Open
        } else {
            Room::Evict
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_or_nothing_takes_every_line_or_none() {
        let r = AllOrNothing {
            entries: 320,
            line_bytes: 128,
        };
        assert_eq!((r.lines(1), r.lines(128), r.lines(129)), (1, 1, 2));
        assert_eq!((r.lines(0), r.lines(8192)), (1, 64)); // a 32 KiB request's share of 4 chips
        assert_eq!(r.room(64, 64), Room::Open);
        assert_eq!(r.room(64, 63), Room::Evict); // 63 lines are not enough: no partial session
        assert_eq!(r.room(400, 320), Room::Bypass); // more than the whole table
    }
}
