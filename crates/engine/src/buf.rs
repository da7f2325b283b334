//! I/O buffers aligned for O_DIRECT.

use aligned_vec::{AVec, ConstAlign};

/// Alignment of every I/O buffer: enough for O_DIRECT on 4Kn devices and for SIMD kernels.
pub const BUF_ALIGN: usize = 4096;

pub type IoBuf = AVec<u8, ConstAlign<BUF_ALIGN>>;

/// A zero-filled aligned buffer of `len` bytes.
pub fn zeroed(len: usize) -> IoBuf {
    AVec::from_iter(BUF_ALIGN, std::iter::repeat_n(0u8, len))
}

/// An aligned copy of `data`.
pub fn copy_of(data: &[u8]) -> IoBuf {
    AVec::from_slice(BUF_ALIGN, data)
}

/// A read result: pieces of buffers that together hold the requested bytes, in order.
/// Keeping pieces (rather than copying into one buffer) lets a network server send them with
/// one writev and no copy.
#[derive(Debug, Default)]
pub struct Segments {
    pub parts: Vec<(IoBuf, std::ops::Range<usize>)>,
}

impl Segments {
    pub fn len(&self) -> usize {
        self.parts.iter().map(|(_, r)| r.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.parts.iter().map(|(b, r)| &b[r.clone()])
    }

    /// Copies everything into one vector (tests and tools; the data path avoids this).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for s in self.iter() {
            v.extend_from_slice(s);
        }
        v
    }
}
