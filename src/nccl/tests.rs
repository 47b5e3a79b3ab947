//! Unit tests that need no driver and no NCCL: the type and operation mappings, the count,
//! rank, root and device checks, and the unique id's bytes.

use super::comm::{check_devices, check_rank, check_root, check_same_device, counts};
use super::{DataType, NcclType, ReduceOp, UniqueId};
use crate::error::{Error, Refusal};
use cudarc::nccl::sys;

#[test]
fn element_types_map_to_nccl_data_types() {
    assert_eq!(i8::DATA_TYPE, DataType::Int8);
    assert_eq!(u8::DATA_TYPE, DataType::Uint8);
    assert_eq!(i32::DATA_TYPE, DataType::Int32);
    assert_eq!(u32::DATA_TYPE, DataType::Uint32);
    assert_eq!(i64::DATA_TYPE, DataType::Int64);
    assert_eq!(u64::DATA_TYPE, DataType::Uint64);
    assert_eq!(f32::DATA_TYPE, DataType::Float32);
    assert_eq!(f64::DATA_TYPE, DataType::Float64);
    #[cfg(feature = "half")]
    {
        assert_eq!(half::f16::DATA_TYPE, DataType::Float16);
        assert_eq!(half::bf16::DATA_TYPE, DataType::Bfloat16);
    }
    // The values are nccl.h's, as cudarc's bindings declare them.
    use sys::ncclDataType_t as D;
    for (ours, theirs) in [
        (DataType::Int8, D::ncclInt8),
        (DataType::Uint8, D::ncclUint8),
        (DataType::Int32, D::ncclInt32),
        (DataType::Uint32, D::ncclUint32),
        (DataType::Int64, D::ncclInt64),
        (DataType::Uint64, D::ncclUint64),
        (DataType::Float16, D::ncclFloat16),
        (DataType::Float32, D::ncclFloat32),
        (DataType::Float64, D::ncclFloat64),
        (DataType::Bfloat16, D::ncclBfloat16),
    ] {
        assert_eq!(ours.raw(), theirs as i32, "{ours:?}");
    }
}

#[test]
fn reduce_ops_map_to_nccl_red_ops() {
    use sys::ncclRedOp_t as R;
    for (ours, theirs) in [
        (ReduceOp::Sum, R::ncclSum),
        (ReduceOp::Prod, R::ncclProd),
        (ReduceOp::Max, R::ncclMax),
        (ReduceOp::Min, R::ncclMin),
        (ReduceOp::Avg, R::ncclAvg),
    ] {
        assert_eq!(ours.raw(), theirs as i32, "{ours:?}");
    }
}

#[test]
fn result_names_are_nccl_h_names() {
    use crate::driver::nccl::result_name;
    use sys::ncclResult_t as R;
    for r in [
        R::ncclSuccess,
        R::ncclUnhandledCudaError,
        R::ncclSystemError,
        R::ncclInternalError,
        R::ncclInvalidArgument,
        R::ncclInvalidUsage,
        R::ncclRemoteError,
        R::ncclInProgress,
    ] {
        assert_eq!(result_name(r as i32), Some(format!("{r:?}").as_str()));
    }
    assert_eq!(result_name(8), None);
    assert_eq!(result_name(-1), None);
}

fn size_refusal(r: crate::Result<usize>) -> String {
    match r {
        Err(Error::InvalidArgument(r)) if r.kind() == Refusal::Size => r.message().to_string(),
        other => panic!("expected a size refusal, got {other:?}"),
    }
}

#[test]
fn all_reduce_and_broadcast_need_equal_lengths() {
    assert_eq!(counts("all_reduce", 16, 16, 1, 1).unwrap(), 16);
    let m = size_refusal(counts("all_reduce", 16, 8, 1, 1));
    assert!(m.contains("all_reduce from 16 elements into 8"), "{m}");
    assert!(m.contains("the same length"), "{m}");
    size_refusal(counts("broadcast", 1, 2, 1, 1));
}

#[test]
fn all_gather_needs_the_send_length_times_the_ranks() {
    // 4 ranks, 3 each: 12 received; NCCL's count is the send count.
    assert_eq!(counts("all_gather", 3, 12, 1, 4).unwrap(), 3);
    assert_eq!(counts("all_gather", 5, 5, 1, 1).unwrap(), 5); // one rank
    let m = size_refusal(counts("all_gather", 3, 11, 1, 4));
    assert!(m.contains("times the 4 ranks"), "{m}");
    size_refusal(counts("all_gather", 3, 3, 1, 4));
    size_refusal(counts("all_gather", usize::MAX, 4, 1, 2)); // overflows
}

#[test]
fn reduce_scatter_needs_the_receive_length_times_the_ranks() {
    // 4 ranks, 12 sent: 3 received each; NCCL's count is the receive count.
    assert_eq!(counts("reduce_scatter", 12, 3, 4, 1).unwrap(), 3);
    let m = size_refusal(counts("reduce_scatter", 12, 4, 4, 1));
    assert!(
        m.contains("a send buffer of the receive length times the 4 ranks"),
        "{m}"
    );
    size_refusal(counts("reduce_scatter", 4, usize::MAX, 2, 1)); // overflows
}

#[test]
fn roots_ranks_and_devices_are_checked() {
    assert_eq!(check_root(0, 1).unwrap(), 0);
    assert_eq!(check_root(3, 4).unwrap(), 3);
    for (root, ranks) in [(1, 1), (4, 4), (usize::MAX, 2)] {
        let e = check_root(root, ranks).unwrap_err();
        assert_eq!(e.refusal(), Some(Refusal::Size), "{e}");
        assert!(e.to_string().contains("root"), "{e}");
    }
    check_rank(0, 1).unwrap();
    check_rank(7, 8).unwrap();
    assert_eq!(check_rank(8, 8).unwrap_err().refusal(), Some(Refusal::Size));
    assert_eq!(check_rank(0, 0).unwrap_err().refusal(), Some(Refusal::Size));
    check_devices(&[0]).unwrap();
    check_devices(&[1, 0]).unwrap();
    assert_eq!(
        check_devices(&[]).unwrap_err().refusal(),
        Some(Refusal::Size)
    );
    assert_eq!(
        check_devices(&[0, 1, 0]).unwrap_err().refusal(),
        Some(Refusal::OtherDevice)
    );
    check_same_device(1, 1).unwrap();
    let e = check_same_device(0, 1).unwrap_err();
    assert_eq!(e.refusal(), Some(Refusal::OtherDevice));
    assert!(
        e.to_string().contains("device 0 on a stream of device 1"),
        "{e}"
    );
}

#[test]
fn unique_ids_round_trip_through_bytes() {
    let mut bytes = [0u8; 128];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 7 + 200) as u8;
    }
    let id = UniqueId::from_bytes(bytes);
    assert_eq!(id.as_bytes(), &bytes);
    let raw = id.raw();
    assert_eq!(raw.internal.map(|c| c as u8), bytes);
    assert_eq!(format!("{id:?}"), "UniqueId(c8cfd6dde4ebf2f9…)");
    assert_ne!(id, UniqueId::from_bytes([0; 128]));
}

#[test]
fn a_missing_library_is_an_error_not_a_panic() {
    // Either this machine has libnccl, or asking for it is `NcclNotFound` naming what was tried.
    match super::version() {
        Ok(v) => assert!(v >= 20000, "{v}"),
        Err(Error::NcclNotFound { tried }) => {
            // NCCL's soname first, then the development name.
            assert!(tried.starts_with("libnccl.so.2, libnccl.so;"), "{tried}");
        }
        Err(e) => panic!("{e}"),
    }
    match UniqueId::new() {
        Ok(_) | Err(Error::NcclNotFound { .. }) => {}
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn nccl_errors_read_like_nccl() {
    let e = Error::Nccl {
        call: "ncclAllReduce",
        code: 5,
        name: "ncclInvalidUsage".into(),
        detail: ": the communicator was aborted".into(),
    };
    assert_eq!(
        e.to_string(),
        "ncclAllReduce failed: ncclInvalidUsage (5): the communicator was aborted"
    );
    assert_eq!(e.code(), None); // not a CUresult
}
