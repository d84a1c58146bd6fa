//! How much of a CAIS merge unit's table a session takes, and when it may open: the
//! unit's session rule (`docs/cais.md`, "Table space per session: all or nothing").
//!
//! The rule sees a request that missed in the CAM and the table's lines (asked,
//! free, in all); it says how many lines the session needs and whether to open it
//! now, make room by evicting the replacement policy's victim (`replacement/`) and ask
//! again, or let the request bypass the unit. It knows nothing else of the unit: which
//! session goes is the replacement policy's, and a victim still waiting for its data
//! (Load-Wait) is marked to end once its data is out while the request bypasses.
//!
//! Today's rule, [`AllOrNothing`], is the only one: a session covers its request's
//! train and needs all its lines at once, or the request bypasses whole. Another rule
//! is a file here implementing [`SessionRule`], chosen where the unit is built
//! (`MergeUnit::new`).

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
    /// asks for; a reduction: its payload), with lines of `line_bytes`.
    fn lines(&self, nbytes: i64, line_bytes: i64) -> i64;
    /// A session needs `need` lines and the table has `free` of its `capacity` free.
    fn room(&self, need: i64, free: i64, capacity: i64) -> Room;
}

/// All or nothing: a session holds every line its request's bytes fill (at least
/// one), and opens only once it has them all; a request that needs more lines than
/// the whole table bypasses at once.
#[derive(Clone, Copy, Default)]
pub(crate) struct AllOrNothing;

impl SessionRule for AllOrNothing {
    fn lines(&self, nbytes: i64, line_bytes: i64) -> i64 {
        1.max(-((-nbytes).div_euclid(line_bytes)))
    }

    fn room(&self, need: i64, free: i64, capacity: i64) -> Room {
        if need > capacity {
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
        let r = AllOrNothing;
        assert_eq!((r.lines(1, 128), r.lines(128, 128), r.lines(129, 128)), (1, 1, 2));
        assert_eq!((r.lines(0, 128), r.lines(8192, 128)), (1, 64)); // a 32 KiB request's share of 4 chips
        assert_eq!(r.room(64, 64, 320), Room::Open);
        assert_eq!(r.room(64, 63, 320), Room::Evict); // 63 lines are not enough: no partial session
        assert_eq!(r.room(400, 320, 320), Room::Bypass); // more than the whole table
    }
}
