//! `validate`: a raw request of the transmission phase becomes a typed `Command`, or the
//! error the NBD spec prescribes for it, before anything is dispatched to the array.
//! (A WRITE larger than `MAX_PAYLOAD` never gets here: the reader drains its payload and
//! refuses it with EINVAL.)

use super::handshake::Session;
use super::MAX_PAYLOAD;
use crate::proto::{self, Errno, Request};
use uraid_core::geometry::SECTOR;

/// A request that passed every check of `validate`: in range, aligned where the command
/// needs it, with only the flags the command takes, allowed on this export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Command {
    /// At most `MAX_PAYLOAD` bytes. `df`: the client asked for one unfragmented chunk.
    Read {
        off: u64,
        len: u64,
        df: bool,
    },
    Write {
        off: u64,
        fua: bool,
    },
    Flush,
    Trim {
        off: u64,
        len: u64,
        fua: bool,
    },
    WriteZeroes {
        off: u64,
        len: u64,
        fua: bool,
        /// Allocate: write zeros rather than trim.
        no_hole: bool,
        /// Refuse (ENOTSUP) unless zeroing is faster than writing.
        fast: bool,
    },
    Cache,
    /// Of a nonzero length, on a connection that negotiated `base:allocation`. `req_one`:
    /// one extent only.
    BlockStatus {
        off: u64,
        len: u64,
        req_one: bool,
    },
}

impl Command {
    /// Whether the command's data must be durable before the reply (FUA on a write).
    pub(super) fn fua(&self) -> bool {
        match *self {
            Command::Write { fua, .. }
            | Command::Trim { fua, .. }
            | Command::WriteZeroes { fua, .. } => fua,
            _ => false,
        }
    }
}

/// An invalid request: the error to reply with and why.
pub(super) type Invalid = (Errno, &'static str);

/// Checks `req` against the spec and this export (`size` bytes, `read_only`), in this
/// order: known command, flags, read-only, range (ENOSPC for writes past the end, else
/// EINVAL), flush without range, 512-byte alignment, read size (EOVERFLOW for an
/// unfragmentable read too large, else EINVAL), block status context and length.
pub(super) fn validate(
    req: &Request,
    sess: &Session,
    read_only: bool,
    size: u64,
) -> Result<Command, Invalid> {
    use proto::*;
    let (off, len) = (req.offset, req.length);
    let in_range = off.checked_add(len).is_some_and(|e| e <= size);
    let aligned = off.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR);
    let allowed = match req.typ {
        CMD_READ => CMD_FLAG_FUA | if sess.structured { CMD_FLAG_DF } else { 0 },
        // Extended headers: a WRITE may say its length is a payload.
        CMD_WRITE if sess.extended => CMD_FLAG_FUA | CMD_FLAG_PAYLOAD_LEN,
        CMD_WRITE | CMD_TRIM | CMD_FLUSH | CMD_CACHE => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        _ => return Err((Errno::Inval, "unknown command")),
    };
    if req.flags & !allowed != 0 {
        return Err((Errno::Inval, "command flag not valid for this command"));
    }
    let writes = matches!(req.typ, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && read_only {
        return Err((Errno::Perm, "export is read-only"));
    }
    if req.typ != CMD_FLUSH && !in_range {
        let e = if matches!(req.typ, CMD_WRITE | CMD_WRITE_ZEROES) {
            Errno::NoSpc
        } else {
            Errno::Inval
        };
        return Err((e, "request beyond the end of the export"));
    }
    if req.typ == CMD_FLUSH && (off != 0 || len != 0) {
        return Err((Errno::Inval, "flush with nonzero offset or length"));
    }
    if matches!(
        req.typ,
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE
    ) && !aligned
    {
        return Err((
            Errno::Inval,
            "request not aligned to the 512-byte minimum block size",
        ));
    }
    let flag = |f: u16| req.flags & f != 0;
    let fua = flag(CMD_FLAG_FUA) && writes;
    Ok(match req.typ {
        CMD_READ => {
            let df = flag(CMD_FLAG_DF);
            if req.length > MAX_PAYLOAD as u64 {
                // Larger than the advertised maximum block size: EINVAL. The spec reserves
                // EOVERFLOW for a DF read (structured replies) too large for one chunk.
                return Err(if df {
                    (
                        Errno::Overflow,
                        "read exceeds 32 MiB and cannot be sent unfragmented",
                    )
                } else {
                    (Errno::Inval, "read exceeds the 32 MiB maximum block size")
                });
            }
            Command::Read { off, len, df }
        }
        CMD_WRITE => Command::Write { off, fua },
        CMD_FLUSH => Command::Flush,
        CMD_TRIM => Command::Trim { off, len, fua },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            off,
            len,
            fua,
            no_hole: flag(CMD_FLAG_NO_HOLE),
            fast: flag(CMD_FLAG_FAST_ZERO),
        },
        CMD_CACHE => Command::Cache,
        _ => {
            if !sess.meta {
                return Err((Errno::Inval, "no metadata context was negotiated"));
            }
            if len == 0 {
                return Err((Errno::Inval, "zero-length block status"));
            }
            Command::BlockStatus {
                off,
                len,
                req_one: flag(CMD_FLAG_REQ_ONE),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::*;

    const SIZE: u64 = 1 << 20;

    fn req(typ: u16, flags: u16, offset: u64, length: u64) -> Request {
        Request {
            flags,
            typ,
            handle: 7,
            offset,
            length,
        }
    }

    fn check(r: &Request, structured: bool, meta: bool, ro: bool) -> Result<Command, Errno> {
        let s = Session {
            structured,
            meta,
            extended: false,
            fixed: true,
        };
        validate(r, &s, ro, SIZE).map_err(|e| e.0)
    }

    #[test]
    fn validate_types_good_requests() {
        let ok = |r: Request| check(&r, true, true, false).unwrap();
        assert_eq!(
            ok(req(CMD_READ, CMD_FLAG_DF, 512, 4096)),
            Command::Read {
                off: 512,
                len: 4096,
                df: true
            }
        );
        assert_eq!(
            ok(req(CMD_WRITE, CMD_FLAG_FUA, 0, 512)),
            Command::Write { off: 0, fua: true }
        );
        assert_eq!(ok(req(CMD_FLUSH, CMD_FLAG_FUA, 0, 0)), Command::Flush);
        assert!(!ok(req(CMD_FLUSH, CMD_FLAG_FUA, 0, 0)).fua());
        assert_eq!(
            ok(req(
                CMD_WRITE_ZEROES,
                CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                SIZE - 512,
                512
            )),
            Command::WriteZeroes {
                off: SIZE - 512,
                len: 512,
                fua: false,
                no_hole: true,
                fast: true
            }
        );
        // Block status needs no alignment.
        assert_eq!(
            ok(req(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 1, 3)),
            Command::BlockStatus {
                off: 1,
                len: 3,
                req_one: true
            }
        );
        assert_eq!(ok(req(CMD_CACHE, 0, 0, 512)), Command::Cache);
    }

    #[test]
    fn validate_refuses_with_the_spec_errno() {
        let e = |r: Request| check(&r, false, false, false).unwrap_err();
        assert_eq!(e(req(99, 0, 0, 0)), Errno::Inval);
        // DF without structured replies.
        assert_eq!(e(req(CMD_READ, CMD_FLAG_DF, 0, 512)), Errno::Inval);
        assert_eq!(e(req(CMD_WRITE, 0, SIZE, 512)), Errno::NoSpc);
        assert_eq!(e(req(CMD_WRITE_ZEROES, 0, u64::MAX, 512)), Errno::NoSpc);
        assert_eq!(e(req(CMD_TRIM, 0, SIZE, 512)), Errno::Inval);
        assert_eq!(e(req(CMD_FLUSH, 0, 0, 512)), Errno::Inval);
        assert_eq!(e(req(CMD_WRITE, 0, 1, 512)), Errno::Inval);
        assert_eq!(e(req(CMD_BLOCK_STATUS, 0, 0, 512)), Errno::Inval);
        let ro = check(&req(CMD_TRIM, 0, 0, 512), false, false, true);
        assert_eq!(ro.unwrap_err(), Errno::Perm);
        // Read-only is checked before the range.
        let ro = check(&req(CMD_WRITE, 0, SIZE, 512), false, false, true);
        assert_eq!(ro.unwrap_err(), Errno::Perm);
        let meta = |r: Request| check(&r, true, true, false).unwrap_err();
        assert_eq!(meta(req(CMD_BLOCK_STATUS, 0, 0, 0)), Errno::Inval);
        let big = MAX_PAYLOAD as u64 + 512;
        let big_size = |r: Request, structured| {
            validate(
                &r,
                &Session {
                    structured,
                    meta: false,
                    extended: false,
                    fixed: true,
                },
                false,
                u64::MAX,
            )
            .unwrap_err()
            .0
        };
        assert_eq!(big_size(req(CMD_READ, 0, 0, big), false), Errno::Inval);
        assert_eq!(
            big_size(req(CMD_READ, CMD_FLAG_DF, 0, big), true),
            Errno::Overflow
        );
    }

    #[test]
    fn extended_headers_take_64_bit_effect_lengths_and_flagged_writes() {
        let x = Session {
            structured: true,
            meta: true,
            extended: true,
            fixed: true,
        };
        let size = 1u64 << 40;
        let v = |r: Request| validate(&r, &x, false, size).map_err(|e| e.0);
        // A trim and a block status of more than 4 GiB in one request.
        assert_eq!(
            v(req(CMD_TRIM, 0, 0, 5 << 32)),
            Ok(Command::Trim {
                off: 0,
                len: 5 << 32,
                fua: false
            })
        );
        assert!(v(req(CMD_BLOCK_STATUS, 0, 0, 5 << 32)).is_ok());
        assert_eq!(
            v(req(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 0, 4096)),
            Ok(Command::Write { off: 0, fua: false })
        );
        // A write should say its length is a payload; qemu's client does not (taken as
        // qemu's server takes it). Other commands take no such flag.
        assert_eq!(
            v(req(CMD_WRITE, 0, 0, 4096)),
            Ok(Command::Write { off: 0, fua: false })
        );
        assert_eq!(
            v(req(CMD_READ, CMD_FLAG_PAYLOAD_LEN, 0, 4096)),
            Err(Errno::Inval)
        );
        // Without extended headers PAYLOAD_LEN is just an unknown flag.
        let c = Session {
            structured: true,
            meta: true,
            extended: false,
            fixed: true,
        };
        let r = req(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 0, 4096);
        assert_eq!(
            validate(&r, &c, false, size).map_err(|e| e.0),
            Err(Errno::Inval)
        );
    }
}
