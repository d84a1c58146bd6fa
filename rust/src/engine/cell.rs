//! The mutable state of the core's units, guarded by the interpreter's lock.
//!
//! A unit of the core (a channel, a switch chip, an endpoint, a train...) is a
//! Python object, since Python builds the machine and reads its counters. PyO3
//! guards a mutable Python object with an atomic borrow flag: a locked
//! compare-and-swap on every borrow and an atomic store or subtraction on every
//! release, whether or not another thread could ever look. On a long collective
//! those made a seventh of the run's cycles, on every unit a train passes.
//!
//! The core's units are instead frozen Python classes (no PyO3 flag) that keep their
//! mutable state in a [`GilCell`]: a `RefCell`, whose flag is a plain counter,
//! borrowed only with a [`Python`] token. The token is the proof that this thread
//! holds the global interpreter lock, so no other thread can be inside the cell at
//! the same time, which is what the cell's `Sync` rests on. The module refuses to
//! load into an interpreter that runs without that lock (`lib.rs`). A borrow that
//! conflicts with one already held panics, as PyO3's did (a bug in the core, never a
//! user's input), and PyO3 turns the panic into a Python exception.

use std::cell::{Ref, RefCell, RefMut};

use pyo3::Python;

/// A unit's mutable state: a `RefCell` reached only while holding the GIL.
#[derive(Default)]
pub struct GilCell<T>(RefCell<T>);

// SAFETY: every access to the inner `RefCell` goes through `borrow`/`borrow_mut`,
// which take a `Python` token (the calling thread holds the GIL), or through
// `during_gc`, which only the interpreter's cyclic collector calls, also under the
// GIL. With the GIL, one thread at a time runs in any cell, so the `RefCell`'s
// non-atomic flag and value are never touched by two threads at once. The module
// does not load where the GIL is off (`_core` in `lib.rs`).
unsafe impl<T: Send> Sync for GilCell<T> {}

impl<T> GilCell<T> {
    pub fn new(value: T) -> Self {
        GilCell(RefCell::new(value))
    }

    /// Shared access to the state.
    #[inline]
    pub fn borrow<'a>(&'a self, _py: Python<'_>) -> Ref<'a, T> {
        self.0.borrow()
    }

    /// Exclusive access to the state.
    #[inline]
    pub fn borrow_mut<'a>(&'a self, _py: Python<'_>) -> RefMut<'a, T> {
        self.0.borrow_mut()
    }

    /// The state, the cell consumed (its owner is not shared).
    pub fn into_inner(self) -> T {
        self.0.into_inner()
    }

    /// The state for the cyclic collector's `__traverse__` (which runs under the GIL
    /// but gets no token); None while the core holds it exclusively, as PyO3 skips a
    /// mutably borrowed object.
    pub fn during_gc(&self) -> Option<Ref<'_, T>> {
        self.0.try_borrow().ok()
    }

    /// The state for the collector's `__clear__`; None while the core holds it.
    pub fn during_gc_mut(&self) -> Option<RefMut<'_, T>> {
        self.0.try_borrow_mut().ok()
    }
}

/// A unit of the core: a frozen Python class whose mutable state is a [`GilCell`].
pub(crate) trait Unit: pyo3::PyClass<Frozen = pyo3::pyclass::boolean_struct::True> + Sync {
    type State;
    fn cell(&self) -> &GilCell<Self::State>;

    /// The state, while holding the GIL.
    #[inline]
    fn st<'a>(&'a self, py: Python<'_>) -> RefMut<'a, Self::State> {
        self.cell().borrow_mut(py)
    }
}

/// Declares `$unit` (a frozen class whose field `st` holds a `GilCell<$state>`) a
/// [`Unit`], made from its state with `From`.
macro_rules! unit {
    ($unit:ident, $state:ident) => {
        impl $crate::engine::cell::Unit for $unit {
            type State = $state;
            fn cell(&self) -> &$crate::engine::cell::GilCell<$state> {
                &self.st
            }
        }

        impl From<$state> for $unit {
            fn from(state: $state) -> Self {
                $unit {
                    st: $crate::engine::cell::GilCell::new(state),
                }
            }
        }
    };
}
pub(crate) use unit;

/// A bound unit's state, borrowed with the GIL its binding carries.
pub(crate) trait UnitState<T: Unit> {
    fn st(&self) -> RefMut<'_, T::State>;
}

impl<T: Unit> UnitState<T> for pyo3::Bound<'_, T> {
    #[inline]
    fn st(&self) -> RefMut<'_, T::State> {
        self.get().cell().borrow_mut(self.py())
    }
}

/// A field of a unit's state as a Python property hands it out: a copy, or for a
/// Python object a new reference to it.
pub(crate) trait Property {
    fn property(&self, py: Python<'_>) -> Self;
}

macro_rules! by_clone {
    ($($t:ty),*) => {
        $(impl Property for $t {
            #[inline]
            fn property(&self, _py: Python<'_>) -> Self {
                self.clone()
            }
        })*
    };
}
by_clone!(i64, usize, f64, bool, String);

impl<T> Property for pyo3::Py<T> {
    #[inline]
    fn property(&self, py: Python<'_>) -> Self {
        self.clone_ref(py)
    }
}

impl<T: Property> Property for Option<T> {
    #[inline]
    fn property(&self, py: Python<'_>) -> Self {
        self.as_ref().map(|v| v.property(py))
    }
}

impl<T: Property> Property for Vec<T> {
    fn property(&self, py: Python<'_>) -> Self {
        self.iter().map(|v| v.property(py)).collect()
    }
}

impl<A: Property, B: Property> Property for (A, B) {
    fn property(&self, py: Python<'_>) -> Self {
        (self.0.property(py), self.1.property(py))
    }
}

impl<A: Property, B: Property, C: Property> Property for (A, B, C) {
    fn property(&self, py: Python<'_>) -> Self {
        (self.0.property(py), self.1.property(py), self.2.property(py))
    }
}

/// Python properties over fields of a [`Unit`]'s state, generated: a getter for each
/// field listed (`name: Type;`, the field's own name and type), and a setter where
/// one is named (`name: Type, set set_name;`); doc comments go with them. It makes a
/// `#[pymethods]` block of its own (PyO3's `multiple-pymethods`), beside the unit's
/// hand-written one.
///
/// ```text
/// properties!(SmPort {
///     ps_per_byte: f64, set set_ps_per_byte;
///     free_at: i64;
/// });
/// ```
macro_rules! properties {
    ($unit:ident { $($fields:tt)* }) => {
        $crate::engine::cell::properties!(@munch $unit [] $($fields)*);
    };
    (@munch $unit:ident [$($out:tt)*]) => {
        #[pyo3::pymethods]
        impl $unit {
            $($out)*
        }
    };
    (@munch $unit:ident [$($out:tt)*] $(#[$m:meta])* $f:ident: $t:ty, set $s:ident; $($rest:tt)*) => {
        $crate::engine::cell::properties!(@munch $unit [$($out)*
            $(#[$m])*
            #[getter]
            fn $f(&self, py: pyo3::Python<'_>) -> $t {
                $crate::engine::cell::Property::property(&$crate::engine::cell::Unit::st(self, py).$f, py)
            }
            #[setter]
            fn $s(&self, py: pyo3::Python<'_>, value: $t) {
                $crate::engine::cell::Unit::st(self, py).$f = value;
            }
        ] $($rest)*);
    };
    (@munch $unit:ident [$($out:tt)*] $(#[$m:meta])* $f:ident: $t:ty; $($rest:tt)*) => {
        $crate::engine::cell::properties!(@munch $unit [$($out)*
            $(#[$m])*
            #[getter]
            fn $f(&self, py: pyo3::Python<'_>) -> $t {
                $crate::engine::cell::Property::property(&$crate::engine::cell::Unit::st(self, py).$f, py)
            }
        ] $($rest)*);
    };
}
pub(crate) use properties;
