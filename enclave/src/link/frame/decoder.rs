//! The sans-IO stream decoder: bytes in as they arrive, whole frames out.

use super::{Frame, FrameError};

/// Sans-IO decoder: feed bytes as they arrive, take frames out.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    max_frame: usize,
}

impl FrameDecoder {
    /// A decoder refusing frames over `max_frame` bytes (kind + body).
    pub fn new(max_frame: usize) -> Self {
        Self { buf: Vec::new(), max_frame }
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes the next frame still needs before [`next_frame`](Self::next_frame)
    /// can return it (at least 1 when incomplete), or 0 when one is ready.
    pub fn wanted(&self) -> usize {
        if self.buf.len() < 4 {
            return 4 - self.buf.len();
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        (4 + len).saturating_sub(self.buf.len())
    }

    /// The next complete frame, `None` when more bytes are needed.
    /// An error is final: the stream cannot be resynchronised.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > self.max_frame {
            return Err(FrameError::TooLarge { len, limit: self.max_frame });
        }
        if len == 0 {
            return Err(FrameError::Malformed { frame: "(none)", reason: "empty frame".into() });
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let frame = Frame::decode(self.buf[4], &self.buf[5..4 + len]);
        self.buf.drain(..4 + len);
        frame.map(Some)
    }
}
