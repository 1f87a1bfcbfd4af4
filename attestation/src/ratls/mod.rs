//! RA-TLS (placeholder while building).
