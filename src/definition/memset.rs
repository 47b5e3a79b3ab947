//! The values of memset nodes: the element types a memset sets ([`MemsetValue`]) and the shape
//! of a 2D memset ([`Memset2d`]), shared by `add_memset*` and `NodeParams::memset*`.

#[cfg(doc)]
use super::GraphDefinition;
use crate::error::{Error, Refusal, Result};
use crate::runtime::DeviceCopy;

/// The shape of a 2D memset ([`GraphDefinition::add_memset_2d`]), in elements of the buffer's
/// type: `height` rows of `width` elements, each row starting `pitch` elements after the one
/// before.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # use cuda_graph::Memset2d;
/// // In a buffer of 4 rows of 16 elements, the first 10 of each row.
/// let shape = Memset2d { width: 10, height: 4, pitch: 16 };
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memset2d {
    /// Elements set in each row (at least 1).
    pub width: usize,
    /// Rows (at least 1).
    pub height: usize,
    /// Elements from the start of one row to the start of the next (at least `width`).
    pub pitch: usize,
}

impl Memset2d {
    /// Checks the shape against a buffer of `len` elements.
    pub(crate) fn check(&self, len: usize) -> Result<()> {
        let bad = |m: String| Err(Error::invalid(Refusal::Size, m));
        if self.pitch > isize::MAX as usize / 8 {
            // In bytes it must fit the address space (one row is all that is set when `height`
            // is 1, so the extent below does not bound it).
            return bad(format!(
                "a memset pitch of {} elements is larger than any buffer",
                self.pitch
            ));
        }
        if self.width == 0 || self.height == 0 {
            return bad(format!(
                "a memset of {} x {} elements sets nothing: width and height must be at least 1",
                self.width, self.height
            ));
        }
        if self.pitch < self.width {
            return bad(format!(
                "a memset pitch of {} elements is less than its width of {}",
                self.pitch, self.width
            ));
        }
        let end = (self.height - 1)
            .checked_mul(self.pitch)
            .and_then(|e| e.checked_add(self.width));
        match end {
            Some(end) if end <= len => Ok(()),
            _ => bad(format!(
                "a memset of {} rows of {} elements with a pitch of {} does not fit in a buffer of {len} elements",
                self.height, self.width, self.pitch
            )),
        }
    }
}

mod sealed {
    /// Seals [`MemsetValue`](super::MemsetValue) and carries its one method.
    pub trait Sealed {
        /// The value's bits, zero-extended.
        fn bits(self) -> u64;
    }
}

/// Element types a memset node can set: the crate's primitive numbers. CUDA sets 1-, 2- or
/// 4-byte elements; an 8-byte type is refused at run time with an [`Error::InvalidArgument`].
/// Sealed.
///
/// ```no_run
/// # use cuda_graph::prelude::*;
/// # fn f(def: &GraphDefinition, floats: &DeviceBuffer<f32>, wide: &DeviceBuffer<u64>) {
/// assert!(def.add_memset(&[], floats, 1.0f32).is_ok());
/// assert!(def.add_memset(&[], wide, 1u64).is_err()); // 8-byte elements
/// # }
/// ```
pub trait MemsetValue: DeviceCopy + sealed::Sealed {}

macro_rules! memset_value {
    ($($t:ty => |$v:ident| $bits:expr),* $(,)?) => { $(
        impl sealed::Sealed for $t {
            fn bits(self) -> u64 {
                let $v = self;
                $bits
            }
        }
        impl MemsetValue for $t {}
    )* };
}
memset_value!(
    u8 => |v| v as u64, i8 => |v| v as u8 as u64,
    u16 => |v| v as u64, i16 => |v| v as u16 as u64,
    u32 => |v| v as u64, i32 => |v| v as u32 as u64, f32 => |v| v.to_bits() as u64,
    u64 => |v| v, i64 => |v| v as u64, f64 => |v| v.to_bits(),
);

/// The element size and 32-bit value of a memset of `value`.
pub(crate) fn memset_value<T: MemsetValue>(value: T) -> Result<(u32, u32)> {
    let size = std::mem::size_of::<T>();
    match size {
        1 | 2 | 4 => Ok((size as u32, sealed::Sealed::bits(value) as u32)),
        _ => Err(Error::invalid(
            Refusal::Size,
            format!(
                "a memset sets 1-, 2- or 4-byte elements, but `{}` is {size} bytes",
                std::any::type_name::<T>()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memset_values_of_1_2_and_4_bytes_are_accepted() {
        assert_eq!(memset_value(0xabu8).unwrap(), (1, 0xab));
        assert_eq!(memset_value(-1i8).unwrap(), (1, 0xff));
        assert_eq!(memset_value(0xbeefu16).unwrap(), (2, 0xbeef));
        assert_eq!(memset_value(-2i16).unwrap(), (2, 0xfffe));
        assert_eq!(memset_value(7u32).unwrap(), (4, 7));
        assert_eq!(memset_value(-1i32).unwrap(), (4, u32::MAX));
        assert_eq!(memset_value(1.0f32).unwrap(), (4, 1.0f32.to_bits()));
    }

    #[test]
    fn memset_values_of_8_bytes_are_an_error() {
        for r in [memset_value(1u64), memset_value(1i64), memset_value(1.0f64)] {
            match r {
                Err(Error::InvalidArgument(m)) if m.kind() == Refusal::Size => {
                    assert!(m.contains("8 bytes"), "{m}")
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn memset_2d_shapes_are_checked_against_the_buffer() {
        let s = |width, height, pitch| Memset2d {
            width,
            height,
            pitch,
        };
        assert!(s(10, 4, 16).check(64).is_ok());
        assert!(s(16, 4, 16).check(64).is_ok());
        // The last row need not be padded to the pitch.
        assert!(s(10, 4, 16).check(58).is_ok());
        assert!(s(10, 4, 16).check(57).is_err());
        assert!(s(0, 4, 16).check(64).is_err());
        assert!(s(10, 0, 16).check(64).is_err());
        assert!(s(17, 4, 16).check(64).is_err());
        assert!(s(1, usize::MAX, usize::MAX).check(64).is_err());
        // One row: the pitch is not bounded by the extent, but its bytes must fit the address
        // space (it is multiplied by the element size for the driver).
        assert!(s(1, 1, usize::MAX).check(64).is_err());
        assert!(s(1, 1, usize::MAX / 4 + 1).check(64).is_err());
        assert!(s(1, 1, 1 << 40).check(64).is_ok());
    }
}
