//! Black-box end-to-end suites live under `tests/`; this library is empty.
