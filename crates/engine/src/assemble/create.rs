//! Creating an array: superblocks, bitmap and map areas and the journal written to new
//! members.

use super::*;

/// Options for `create`.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub level: Level,
    pub chunk: u64,
    /// Empty: a name of its own (`uraid-` and the array uuid's first 8 hex digits).
    pub name: String,
    pub force: bool,
    /// Write-intent bitmap region size in member bytes: None picks the default
    /// (`uraid_core::bitmap::default_chunk`), Some(0) creates no bitmap.
    pub bitmap_chunk: Option<u64>,
    /// A journal device and its mode (parity levels only).
    pub journal: Option<(PathBuf, JournalMode)>,
}

/// Writes a new array's superblocks to `paths` (in member order) and zeroes the data areas so
/// that parity starts consistent. Refuses members that hold a superblock unless `force`.
pub fn create(paths: &[PathBuf], opts: &CreateOptions) -> Result<Superblock, AssembleError> {
    check_distinct(paths)?;
    let (files, min_size) = open_new_members(paths, opts)?;
    let geometry = Geometry::new(opts.level, paths.len(), opts.chunk, min_size - DATA_OFFSET)?;
    let bitmap_chunk = opts
        .bitmap_chunk
        .unwrap_or_else(|| uraid_core::bitmap::default_chunk(&geometry));
    uraid_core::bitmap::check_chunk(&geometry, bitmap_chunk).map_err(AssembleError::BitmapChunk)?;
    let array_uuid = *uuid::Uuid::new_v4().as_bytes();
    let journal = match &opts.journal {
        Some((jp, mode)) => {
            if paths.iter().any(|q| same_file(jp, q)) {
                return Err(AssembleError::Duplicate {
                    path: jp.display().to_string(),
                });
            }
            check_journal_target(geometry.level, jp, opts.force)?;
            let uuid = *uuid::Uuid::new_v4().as_bytes();
            write_new_journal(jp, &geometry, array_uuid, uuid)?;
            Some((uuid, *mode))
        }
        None => None,
    };
    let mut sb = new_superblock(opts, geometry, array_uuid, bitmap_chunk, journal);
    for (i, (f, p)) in files.iter().zip(paths).enumerate() {
        sb.index = i;
        sb.device_uuid = sb.slot_uuids[i];
        write_new_member(f, &sb).map_err(io_err(p))?;
    }
    sb.index = 0;
    Ok(sb)
}

/// Refuses a path given twice.
fn check_distinct(paths: &[PathBuf]) -> Result<(), AssembleError> {
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].iter().any(|q| same_file(p, q)) {
            return Err(AssembleError::Duplicate {
                path: p.display().to_string(),
            });
        }
    }
    Ok(())
}

/// Opens each new member for writing, refusing one too small for a chunk of data and,
/// without `opts.force`, one that holds a superblock. Returns the files and the smallest
/// size.
fn open_new_members(
    paths: &[PathBuf],
    opts: &CreateOptions,
) -> Result<(Vec<File>, u64), AssembleError> {
    let mut files = Vec::with_capacity(paths.len());
    let mut min_size = u64::MAX;
    for p in paths {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .map_err(io_err(p))?;
        let size = device_size(&f).map_err(io_err(p))?;
        let need = DATA_OFFSET + opts.chunk;
        if size < need {
            return Err(AssembleError::TooSmall {
                path: p.display().to_string(),
                size,
                need,
            });
        }
        if !opts.force {
            if let Ok(sb) = read_superblock(p) {
                return Err(AssembleError::InUse {
                    path: p.display().to_string(),
                    uuid: uuid_string(&sb.array_uuid),
                    name: sb.name,
                });
            }
        }
        min_size = min_size.min(size);
        files.push(f);
    }
    Ok((files, min_size))
}

/// A new array's superblock (clean, events 1, every member active with a fresh device uuid),
/// as member 0's.
fn new_superblock(
    opts: &CreateOptions,
    geometry: Geometry,
    array_uuid: [u8; 16],
    bitmap_chunk: u64,
    journal: Option<([u8; 16], JournalMode)>,
) -> Superblock {
    let n = geometry.members;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut sb = Superblock {
        array_uuid,
        // No name given: one of its own ("uraid-" and the uuid's first 8 hex digits), so two
        // arrays never share a default control socket or export name.
        name: if opts.name.is_empty() {
            format!(
                "uraid-{}",
                &uraid_core::format::uuid_string(&array_uuid)[..8]
            )
        } else {
            opts.name.chars().take(format::NAME_LEN).collect()
        },
        geometry,
        index: 0,
        clean: true,
        spare: false,
        data_offset: DATA_OFFSET,
        events: 1,
        ctime: now,
        utime: now,
        device_uuid: [0; 16],
        states: vec![MemberState::Active; n],
        rebuilt: vec![0; n],
        slot_uuids: (0..n).map(|_| *uuid::Uuid::new_v4().as_bytes()).collect(),
        replacement: false,
        replaces: vec![None; n],
        bitmap_chunk,
        journal,
        bad: Default::default(),
        served: Default::default(),
    };
    while sb.name.len() > format::NAME_LEN {
        sb.name.pop();
    }
    sb
}

/// Writes new member `sb.index`: data area zeroed, an empty allocation map and write-intent
/// bitmap, `sb` into both superblock slots, synced.
fn write_new_member(f: &File, sb: &Superblock) -> io::Result<()> {
    let geometry = &sb.geometry;
    zero_range(f, DATA_OFFSET, geometry.member_data)?;
    f.write_all_at(
        &crate::alloc::empty_map_image(geometry),
        uraid_core::alloc::MAP_OFFSET,
    )?;
    f.write_all_at(
        &uraid_core::bitmap::empty_image(geometry, sb.bitmap_chunk),
        uraid_core::bitmap::BITMAP_OFFSET,
    )?;
    for slot in 0..SB_SLOTS {
        f.write_all_at(&sb.encode(), (slot * SB_SIZE) as u64)?;
    }
    f.sync_all()
}

/// Zeroes `[off, off + len)`: hole punching on files (also extends sparse files), BLKZEROOUT
/// on block devices.
pub(super) fn zero_range(f: &File, off: u64, len: u64) -> io::Result<()> {
    if f.metadata()?.file_type().is_block_device() {
        let range: [u64; 2] = [off, len];
        // SAFETY: BLKZEROOUT reads two u64s (start, length) through the pointer.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), 0x127f, range.as_ptr()) };
        return if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        };
    }
    // SAFETY: plain fallocate syscall on an fd we own.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off as i64,
            len as i64,
        )
    };
    if r < 0 {
        // Filesystems without hole punching: write zeros.
        let zeros = vec![0u8; 1 << 20];
        let mut pos = off;
        while pos < off + len {
            let n = (off + len - pos).min(zeros.len() as u64) as usize;
            f.write_all_at(&zeros[..n], pos)?;
            pos += n as u64;
        }
    }
    Ok(())
}

/// `create`, holding every member exclusively while it writes (the claim `FileDev::open`
/// takes): a member of a running array, a mounted device or one md/dm holds is refused
/// instead of overwritten, `--force` or not.
pub fn create_exclusive(
    paths: &[PathBuf],
    opts: &CreateOptions,
) -> Result<Superblock, AssembleError> {
    // Checked before claiming, or the second claim on the same file would report this
    // process as the holder.
    check_distinct(paths)?;
    let mut _claims = paths
        .iter()
        .enumerate()
        .map(|(i, p)| open_exclusive(p, Access::ReadWrite, false).map_err(member_open_err(i)))
        .collect::<Result<Vec<File>, _>>()?;
    if let Some((jp, _)) = &opts.journal {
        if !paths.iter().any(|q| same_file(jp, q)) {
            _claims.push(
                open_exclusive(jp, Access::ReadWrite, false)
                    .map_err(member_open_err(usize::MAX))?,
            );
        }
    }
    create(paths, opts)
}
