"""OpSpec validation and the shape parser: a valid op or an OpError, nothing else."""

import pytest
from _fuzz import budget
from hypothesis import given
from hypothesis import strategies as st

from autoopt.errors import OpError
from autoopt.kernels.ops import OpSpec, parse_shape


def test_gemm_flops_and_floor_bytes():
    op = OpSpec(kind="gemm", shape=(256, 6144, 4096), dtype="bf16")
    assert op.flops == 2 * 256 * 6144 * 4096
    assert op.min_bytes == (256 * 4096 + 6144 * 4096 + 256 * 6144) * 2


def test_fp8_gemm_writes_bf16():
    assert OpSpec(kind="gemm", shape=(16, 16, 16), dtype="fp8").out_dtype == "bf16"


def test_torch_style_dtype_names_are_accepted():
    assert OpSpec(kind="rmsnorm", shape=(4, 8), dtype="torch.bfloat16").dtype == "bf16"


def test_gemv_above_sixteen_rows_points_to_gemm():
    with pytest.raises(OpError, match="use kind 'gemm'"):
        OpSpec(kind="gemv", shape=(17, 64, 64))


@pytest.mark.parametrize("shape", [(0, 1, 1), (1, -2, 3), (1, 2), (2**31, 1, 1)])
def test_bad_gemm_shapes_are_op_errors(shape):
    with pytest.raises(OpError):
        OpSpec(kind="gemm", shape=shape)


def test_parse_shape_accepts_commas_and_x():
    assert parse_shape("256,6144,4096") == parse_shape("256x6144x4096") == (256, 6144, 4096)


@budget(300)
@given(st.text(max_size=30))
def test_parse_shape_of_any_text_is_a_tuple_of_positive_ints_or_an_op_error(text):
    try:
        dims = parse_shape(text)
    except OpError:
        return
    assert dims and all(isinstance(d, int) and d > 0 for d in dims)


@budget(300)
@given(st.fixed_dictionaries({"kind": st.sampled_from(["gemm", "gemv", "rmsnorm", "softmax", "add", "conv", ""]),
                              "shape": st.lists(st.integers(-5, 2**33), max_size=4),
                              "dtype": st.sampled_from(["bf16", "fp16", "fp8", "fp32", "int4", "float16"])}))
def test_any_op_dict_is_a_valid_op_or_an_op_error(data):
    try:
        op = OpSpec.from_dict(data)
    except OpError:
        return
    assert op.flops > 0 and op.min_bytes > 0
