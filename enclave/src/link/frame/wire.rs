//! The primitive field codec under every frame: a writer and a bounds-checked reader.

use super::FrameError;

/// Appends big-endian fields to a frame being encoded.
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(super) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    pub(super) fn len(&mut self, n: usize) {
        // Lengths are bounded by the frame limit (< 4 GiB) on every path that writes them.
        self.u32(n as u32);
    }
}

/// Takes big-endian fields off a frame body, every length checked first.
pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
    pub(super) frame: &'static str,
}

impl<'a> Reader<'a> {
    pub(super) fn bad(&self, reason: impl Into<String>) -> FrameError {
        FrameError::Malformed { frame: self.frame, reason: reason.into() }
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.buf.len() < n {
            return Err(self.bad(format!("needs {n} more bytes, {} left", self.buf.len())));
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u16(&mut self) -> Result<u16, FrameError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub(super) fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(super) fn u64(&mut self) -> Result<u64, FrameError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    pub(super) fn f32(&mut self) -> Result<f32, FrameError> {
        Ok(f32::from_bits(self.u32()?))
    }
    /// A count of items of `item_bytes` each, checked against the bytes left and `max`.
    pub(super) fn count(&mut self, item_bytes: usize, max: usize, what: &str) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n > max || n.saturating_mul(item_bytes) > self.buf.len() {
            return Err(self.bad(format!("{what}: count {n} does not fit")));
        }
        Ok(n)
    }
    pub(super) fn done(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.bad(format!("{} trailing bytes", self.buf.len())))
        }
    }
}
