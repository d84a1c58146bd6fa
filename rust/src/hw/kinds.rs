//! The packet kinds the core serves itself, with the values of
//! `cais.hw.packets.Kind` (the module exports them as `CORE_KINDS` and a test
//! checks that both sides agree).

pub(crate) const READ_REQ: i64 = 0;
pub(crate) const READ_RESP: i64 = 1;
pub(crate) const WRITE: i64 = 2;
pub(crate) const RED: i64 = 3;
pub(crate) const MC_STORE: i64 = 4;
pub(crate) const MC_LDRED_REQ: i64 = 5;
pub(crate) const MC_PULL_REQ: i64 = 6;
pub(crate) const MC_PULL_RESP: i64 = 7;
pub(crate) const MC_LDRED_RESP: i64 = 8;
pub(crate) const MC_RED: i64 = 9;
pub(crate) const WRITE_ACK: i64 = 10;
pub(crate) const FLAG: i64 = 11;
pub(crate) const MC_FLAG: i64 = 12;
pub(crate) const LD_CAIS_REQ: i64 = 13;
pub(crate) const LD_CAIS_RESP: i64 = 14;
pub(crate) const RED_CAIS: i64 = 15;
pub(crate) const GROUP_SYNC: i64 = 16;
pub(crate) const GROUP_RELEASE: i64 = 17;

/// Every kind above, by name.
pub(crate) const ALL: [(&str, i64); 18] = [
    ("READ_REQ", READ_REQ),
    ("READ_RESP", READ_RESP),
    ("WRITE", WRITE),
    ("RED", RED),
    ("MC_STORE", MC_STORE),
    ("MC_LDRED_REQ", MC_LDRED_REQ),
    ("MC_PULL_REQ", MC_PULL_REQ),
    ("MC_PULL_RESP", MC_PULL_RESP),
    ("MC_LDRED_RESP", MC_LDRED_RESP),
    ("MC_RED", MC_RED),
    ("WRITE_ACK", WRITE_ACK),
    ("FLAG", FLAG),
    ("MC_FLAG", MC_FLAG),
    ("LD_CAIS_REQ", LD_CAIS_REQ),
    ("LD_CAIS_RESP", LD_CAIS_RESP),
    ("RED_CAIS", RED_CAIS),
    ("GROUP_SYNC", GROUP_SYNC),
    ("GROUP_RELEASE", GROUP_RELEASE),
];

/// The Python handler a unit registered for `kind` in its `handlers` dict, if any
/// (an empty dict costs nothing).
pub(crate) fn handler<'py>(
    py: pyo3::Python<'py>,
    handlers: &pyo3::Py<pyo3::types::PyDict>,
    kind: i64,
) -> pyo3::PyResult<Option<pyo3::Bound<'py, pyo3::PyAny>>> {
    use pyo3::types::PyDictMethods;
    let h = handlers.bind(py);
    if h.is_empty() {
        return Ok(None);
    }
    h.get_item(kind)
}

/// A Python-style index into a sequence of `len` (negative counts from the end).
#[inline]
pub(crate) fn py_index(i: i64, len: usize) -> pyo3::PyResult<usize> {
    let j = if i < 0 { i + len as i64 } else { i };
    if j < 0 || j as usize >= len {
        return Err(out_of_range(i, len));
    }
    Ok(j as usize)
}

#[cold]
fn out_of_range(i: i64, len: usize) -> pyo3::PyErr {
    pyo3::exceptions::PyIndexError::new_err(format!("index {i} out of range 0..{len}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_count_from_the_end_as_in_python() {
        assert_eq!(py_index(0, 4).unwrap(), 0);
        assert_eq!(py_index(-1, 4).unwrap(), 3);
        pyo3::Python::initialize();
        assert!(py_index(4, 4).is_err());
        assert!(py_index(-5, 4).is_err());
    }

    #[test]
    fn every_kind_is_listed_once() {
        let mut values: Vec<i64> = ALL.iter().map(|&(_, v)| v).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values, (0..ALL.len() as i64).collect::<Vec<i64>>());
    }
}
