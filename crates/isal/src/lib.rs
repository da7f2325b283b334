//! Minimal safe wrapper over the ISA-L erasure-code kernels that uraid uses.
//!
//! Only three C functions are bound: `ec_init_tables`, `ec_encode_data` and
//! `ec_encode_data_update`. Matrix inversion and the choice of coding matrix live in
//! `uraid-core` (pure Rust), so this crate is only the FFI boundary: every `unsafe` block in
//! the project's codec path is here, each with the invariant that makes it sound.

use std::os::raw::{c_int, c_uchar};

extern "C" {
    fn ec_init_tables(k: c_int, rows: c_int, a: *mut c_uchar, gftbls: *mut c_uchar);
    fn ec_encode_data(
        len: c_int,
        k: c_int,
        rows: c_int,
        gftbls: *mut c_uchar,
        data: *mut *mut c_uchar,
        coding: *mut *mut c_uchar,
    );
    fn ec_encode_data_update(
        len: c_int,
        k: c_int,
        rows: c_int,
        vec_i: c_int,
        gftbls: *mut c_uchar,
        data: *mut c_uchar,
        coding: *mut *mut c_uchar,
    );
    fn xor_gen(vects: c_int, len: c_int, array: *mut *mut std::ffi::c_void) -> c_int;
    fn pq_gen(vects: c_int, len: c_int, array: *mut *mut std::ffi::c_void) -> c_int;
}

/// Whether every buffer meets the RAID kernels' rules: 32-byte aligned, length a multiple of 32.
fn raid_kernel_ok(len: usize, ptrs: &[*mut u8]) -> bool {
    len > 0
        && len.is_multiple_of(32)
        && len <= c_int::MAX as usize
        && ptrs.iter().all(|p| (*p as usize).is_multiple_of(32))
}

/// P = XOR of `data` with ISA-L's xor_gen. Returns false (and does nothing) when the buffers do
/// not meet the kernel's alignment rules or there are fewer than two sources; the caller then
/// uses the general encoder.
pub fn xor_parity(data: &[&[u8]], p: &mut [u8]) -> bool {
    let len = p.len();
    if data.len() < 2 || data.len() + 1 > MAX_VECS || data.iter().any(|d| d.len() != len) {
        return false;
    }
    let mut v = [std::ptr::null_mut::<u8>(); MAX_VECS];
    for (slot, d) in v.iter_mut().zip(data) {
        *slot = d.as_ptr() as *mut u8;
    }
    v[data.len()] = p.as_mut_ptr();
    let n = data.len() + 1;
    if !raid_kernel_ok(len, &v[..n]) {
        return false;
    }
    // SAFETY: n pointers to buffers of len bytes (sources only read, the last one written and
    // distinct from the sources because it comes from a &mut borrow), aligned and sized as
    // xor_gen requires (checked above).
    let r = unsafe {
        xor_gen(
            n as c_int,
            len as c_int,
            v.as_mut_ptr() as *mut *mut std::ffi::c_void,
        )
    };
    r == 0
}

/// P (XOR) and Q (md RAID6: sum of 2^i * D_i over GF(2^8)/0x11D) with ISA-L's pq_gen. Returns
/// false (and does nothing) when the buffers do not meet the kernel's rules; the caller then
/// uses the general encoder.
pub fn pq_parity(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) -> bool {
    let len = p.len();
    if data.len() < 2
        || data.len() + 2 > MAX_VECS
        || q.len() != len
        || data.iter().any(|d| d.len() != len)
    {
        return false;
    }
    let mut v = [std::ptr::null_mut::<u8>(); MAX_VECS];
    for (slot, d) in v.iter_mut().zip(data) {
        *slot = d.as_ptr() as *mut u8;
    }
    v[data.len()] = p.as_mut_ptr();
    v[data.len() + 1] = q.as_mut_ptr();
    let n = data.len() + 2;
    if !raid_kernel_ok(len, &v[..n]) {
        return false;
    }
    // SAFETY: as in xor_parity; P and Q are distinct &mut buffers, the sources are only read.
    let r = unsafe {
        pq_gen(
            n as c_int,
            len as c_int,
            v.as_mut_ptr() as *mut *mut std::ffi::c_void,
        )
    };
    r == 0
}

/// Largest number of source or output vectors one call takes (N+M <= 64 in uraid).
pub const MAX_VECS: usize = 64;

/// Expanded multiplication tables for a `rows x k` coefficient matrix (32 bytes per entry).
#[derive(Clone)]
pub struct Tables {
    k: usize,
    rows: usize,
    tbls: Vec<u8>,
}

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tables({}x{})", self.rows, self.k)
    }
}

impl Tables {
    /// Builds tables from a row-major `rows x k` matrix over GF(2^8) (polynomial 0x11D).
    pub fn new(k: usize, rows: usize, matrix: &[u8]) -> Self {
        assert!(k > 0 && rows > 0 && k <= MAX_VECS && rows <= MAX_VECS);
        assert_eq!(matrix.len(), k * rows, "matrix must be rows x k");
        let mut a = matrix.to_vec();
        let mut tbls = vec![0u8; 32 * k * rows];
        // SAFETY: `a` holds k*rows bytes and `tbls` 32*k*rows bytes, exactly the sizes
        // ec_init_tables reads and writes for these k and rows (both checked above to fit c_int).
        unsafe { ec_init_tables(k as c_int, rows as c_int, a.as_mut_ptr(), tbls.as_mut_ptr()) };
        Tables { k, rows, tbls }
    }

    pub fn k(&self) -> usize {
        self.k
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// out[r] = sum_j matrix[r][j] * data[j], byte-wise, for every r.
    pub fn encode(&self, data: &[&[u8]], out: &mut [&mut [u8]]) {
        assert_eq!(data.len(), self.k, "need k source buffers");
        assert_eq!(out.len(), self.rows, "need one output per row");
        let len = data[0].len();
        assert!(
            data.iter().all(|d| d.len() == len),
            "sources differ in length"
        );
        assert!(
            out.iter().all(|o| o.len() == len),
            "outputs differ in length"
        );
        assert!(len <= c_int::MAX as usize);
        if len == 0 {
            return;
        }
        let mut src = [std::ptr::null_mut::<u8>(); MAX_VECS];
        for (s, d) in src.iter_mut().zip(data) {
            *s = d.as_ptr() as *mut u8;
        }
        let mut dst = [std::ptr::null_mut::<u8>(); MAX_VECS];
        for (d, o) in dst.iter_mut().zip(out.iter_mut()) {
            *d = o.as_mut_ptr();
        }
        // SAFETY: src has k pointers to buffers of `len` readable bytes (ISA-L only reads
        // them despite the non-const type), dst has `rows` pointers to distinct `len`-byte
        // writable buffers (distinct because they come from distinct &mut borrows), and the
        // tables were built for exactly this k and rows; ISA-L only reads the tables, so passing
        // the shared buffer as *mut is sound.
        unsafe {
            ec_encode_data(
                len as c_int,
                self.k as c_int,
                self.rows as c_int,
                self.tbls.as_ptr() as *mut u8,
                src.as_mut_ptr(),
                dst.as_mut_ptr(),
            )
        };
    }

    /// out[r] ^= matrix[r][vec_i] * data, byte-wise: adds one source's contribution.
    /// Used for read-modify-write with `data` = old XOR new.
    pub fn encode_update(&self, vec_i: usize, data: &[u8], out: &mut [&mut [u8]]) {
        assert!(vec_i < self.k);
        assert_eq!(out.len(), self.rows, "need one output per row");
        let len = data.len();
        assert!(
            out.iter().all(|o| o.len() == len),
            "outputs differ in length"
        );
        assert!(len <= c_int::MAX as usize);
        if len == 0 {
            return;
        }
        let mut dst = [std::ptr::null_mut::<u8>(); MAX_VECS];
        for (d, o) in dst.iter_mut().zip(out.iter_mut()) {
            *d = o.as_mut_ptr();
        }
        // SAFETY: `data` has len readable bytes (only read), dst has `rows` distinct writable
        // buffers of len bytes, vec_i < k, and the tables match k and rows (read only by ISA-L).
        unsafe {
            ec_encode_data_update(
                len as c_int,
                self.k as c_int,
                self.rows as c_int,
                vec_i as c_int,
                self.tbls.as_ptr() as *mut u8,
                data.as_ptr() as *mut u8,
                dst.as_mut_ptr(),
            )
        };
    }
}
