//! Regions copied between device buffers: 2D (rows of a pitched array) and 3D (planes of rows).

pub(crate) use crate::driver::memory::RawCopy;
use crate::error::{Error, Refusal, Result};

/// A region copied from one device buffer of `T` into another, counted in elements of `T`:
/// `depth` planes of `height` rows of `width` elements, each starting at the buffer's first
/// element. In the source, one row begins `src_pitch` elements after the one before and a plane
/// `src_pitch * src_rows` after the one before; likewise in the destination. A copy of a part
/// that does not start at element 0 takes a [`slice`](crate::DeviceBuffer::slice) of the buffer.
///
/// Checked against both buffers before the driver sees it: every size at least 1, each pitch
/// at least the width, each plane's rows at least the height (for more than one plane), and the
/// last element inside each buffer, with no size overflowing; otherwise
/// [`Refusal::Size`]. The copy runs as one `CUDA_MEMCPY3D` (a memcpy node, or
/// `cuMemcpy3DAsync` in a capture).
///
/// ```
/// use cuda_graph::Copy3d;
/// // The 10 x 4 top-left corner of a 16-wide image into a packed 10-wide one.
/// let corner = Copy3d::rows(10, 4, 16, 10);
/// assert_eq!((corner.depth, corner.src_pitch, corner.dst_pitch), (1, 16, 10));
/// // Two planes of it, each plane 8 rows apart in the source.
/// let stack = Copy3d { depth: 2, src_rows: 8, dst_rows: 4, ..corner };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Copy3d {
    /// Elements copied from each row (at least 1).
    pub width: usize,
    /// Rows copied from each plane (at least 1).
    pub height: usize,
    /// Planes copied (at least 1; 1 for a 2D copy).
    pub depth: usize,
    /// Elements from one source row to the next (at least `width`).
    pub src_pitch: usize,
    /// Rows from one source plane to the next (at least `height` when `depth` > 1).
    pub src_rows: usize,
    /// Elements from one destination row to the next (at least `width`).
    pub dst_pitch: usize,
    /// Rows from one destination plane to the next (at least `height` when `depth` > 1).
    pub dst_rows: usize,
}

/// The one check of a whole-buffer copy (`memcpy_dtod`, `add_memcpy`, `NodeParams::memcpy`):
/// both buffers hold the same number of elements. Returns the copy in bytes.
pub(crate) fn check_whole(dst_len: usize, src_len: usize, size: usize) -> Result<RawCopy> {
    if dst_len != src_len {
        return Err(Error::invalid(
            Refusal::Size,
            format!("a copy of {src_len} elements into a buffer of {dst_len}"),
        ));
    }
    Ok(RawCopy::linear(dst_len * size))
}

impl Copy3d {
    /// A 2D copy: `height` rows of `width` elements, rows `src_pitch` and `dst_pitch` elements
    /// apart.
    pub const fn rows(width: usize, height: usize, src_pitch: usize, dst_pitch: usize) -> Copy3d {
        Copy3d {
            width,
            height,
            depth: 1,
            src_pitch,
            src_rows: height,
            dst_pitch,
            dst_rows: height,
        }
    }

    /// The region in bytes for elements of `size` bytes, after checking it against a source of
    /// `src_len` and a destination of `dst_len` elements.
    pub(crate) fn check(&self, src_len: usize, dst_len: usize, size: usize) -> Result<RawCopy> {
        let bad = |m: String| Err(Error::invalid(Refusal::Size, m));
        let c = *self;
        if c.width == 0 || c.height == 0 || c.depth == 0 {
            return bad(format!(
                "a copy of {} x {} x {} elements copies nothing: width, height and depth must be at least 1",
                c.width, c.height, c.depth
            ));
        }
        for (side, pitch, rows, len) in [
            ("source", c.src_pitch, c.src_rows, src_len),
            ("destination", c.dst_pitch, c.dst_rows, dst_len),
        ] {
            if pitch < c.width {
                return bad(format!(
                    "the {side} pitch of {pitch} elements is less than the width of {}",
                    c.width
                ));
            }
            if c.depth > 1 && rows < c.height {
                return bad(format!(
                    "the {side}'s planes of {rows} rows are shorter than the height of {}",
                    c.height
                ));
            }
            // ((depth - 1) * rows + (height - 1)) * pitch + width elements, and in bytes.
            let extent = (c.depth - 1)
                .checked_mul(rows)
                .and_then(|r| r.checked_add(c.height - 1))
                .and_then(|r| r.checked_mul(pitch))
                .and_then(|e| e.checked_add(c.width));
            let fits = extent.filter(|&e| e <= len);
            let Some(_) = fits else {
                return bad(format!(
                    "a copy of {} x {} x {} elements with a {side} pitch of {pitch} and {rows} rows per plane reaches past the {side}'s {len} elements",
                    c.width, c.height, c.depth
                ));
            };
            if pitch
                .checked_mul(size)
                .is_none_or(|b| b > isize::MAX as usize)
            {
                return bad(format!(
                    "a {side} pitch of {pitch} elements is larger than any buffer"
                ));
            }
        }
        Ok(RawCopy {
            width_bytes: c.width * size,
            height: c.height,
            depth: c.depth,
            src_pitch: c.src_pitch * size,
            // One plane: the rows per plane are not used, and the driver gets the height.
            src_rows: if c.depth == 1 { c.height } else { c.src_rows },
            dst_pitch: c.dst_pitch * size,
            dst_rows: if c.depth == 1 { c.height } else { c.dst_rows },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn shapes_that_do_not_fit_are_refused() {
        let ok = Copy3d::rows(10, 4, 16, 10);
        // Source: 3 * 16 + 10 = 58 elements; destination: 3 * 10 + 10 = 40.
        let raw = ok.check(58, 40, 4).unwrap();
        assert_eq!(
            (raw.width_bytes, raw.src_pitch, raw.dst_pitch),
            (40, 64, 40)
        );
        assert!(ok.check(57, 40, 4).is_err(), "source one element short");
        assert!(
            ok.check(64, 39, 4).is_err(),
            "destination one element short"
        );
        for bad in [
            Copy3d { width: 0, ..ok },
            Copy3d { height: 0, ..ok },
            Copy3d { depth: 0, ..ok },
            Copy3d { src_pitch: 9, ..ok },
            Copy3d {
                depth: 2,
                src_rows: 3,
                ..ok
            },
            Copy3d {
                src_pitch: usize::MAX,
                ..ok
            },
            Copy3d {
                depth: usize::MAX,
                ..ok
            },
        ] {
            let e = bad.check(usize::MAX, usize::MAX, 4).unwrap_err();
            assert_eq!(e.refusal(), Some(Refusal::Size), "{bad:?}");
        }
        // One plane: the rows per plane are ignored, whatever they say.
        let raw = Copy3d {
            src_rows: usize::MAX,
            dst_rows: 0,
            ..ok
        }
        .check(58, 40, 4)
        .unwrap();
        assert_eq!((raw.src_rows, raw.dst_rows), (4, 4));
        let planes = Copy3d {
            depth: 2,
            src_rows: 8,
            dst_rows: 4,
            ..ok
        };
        // Source: (1 * 8 + 3) * 16 + 10 = 186; destination: (1 * 4 + 3) * 10 + 10 = 80.
        assert!(planes.check(186, 80, 4).is_ok());
        assert!(planes.check(185, 80, 4).is_err());
        assert!(planes.check(186, 79, 4).is_err());
    }

    proptest! {
        /// Whatever the shape, an accepted copy stays inside both buffers.
        #[test]
        fn accepted_copies_stay_inside(
            w in 0usize..20, h in 0usize..6, d in 0usize..4,
            sp in 0usize..24, sr in 0usize..8, dp in 0usize..24, dr in 0usize..8,
            sl in 0usize..600, dl in 0usize..600,
        ) {
            let c = Copy3d { width: w, height: h, depth: d, src_pitch: sp, src_rows: sr, dst_pitch: dp, dst_rows: dr };
            if c.check(sl, dl, 4).is_ok() {
                // Every element copied, by brute force.
                for z in 0..d {
                    for y in 0..h {
                        prop_assert!((z * sr + y) * sp + w <= sl);
                        prop_assert!((z * dr + y) * dp + w <= dl);
                    }
                }
            }
        }
    }
}
