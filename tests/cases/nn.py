"""Cases for nn ops: matmul, conv2d, pool2d, batchnorm, layer_norm, softmax, log_softmax, dropout."""
import numpy as np

from tests.cases import Case

F32 = "float32"
ACC = {"rtol": 1e-4, "atol": 1e-4}  # accumulations over tens of products


def _f(*shape):
    return (tuple(shape), F32)


def _batchnorm_inputs(rng: np.random.Generator) -> list[np.ndarray]:
    """x, then per-channel scale, bias, mean and a positive variance."""
    c = 3
    x = rng.standard_normal((2, c, 4, 5)).astype(F32)
    scale, bias, mean = (rng.standard_normal(c).astype(F32) for _ in range(3))
    return [x, scale, bias, mean, (rng.random(c) + 0.5).astype(F32)]


def _conv(x, w, id="", **attrs) -> Case:
    return Case("conv2d", (_f(*x), _f(*w)), attrs, **ACC, id=id)


def _packed_conv(x, w, id, **attrs) -> Case:
    return Case("conv2d_packed", (_f(*x), _f(*w)), attrs, **ACC, id=id)


def _pool(x, pooling_type, ksize, id, **attrs) -> Case:
    return Case("pool2d", (_f(*x),), {"pooling_type": pooling_type, "ksize": ksize, **attrs}, **ACC, id=id)


CASES = [
    Case("matmul", (_f(4, 6), _f(6, 5)), **ACC),
    Case("matmul", (_f(2, 1, 3, 4), _f(3, 4, 5)), **ACC, id="matmul-broadcast-batch"),
    Case("matmul", (_f(2, 4, 3), _f(2, 5, 4)), {"trans_x": True, "trans_y": True, "alpha": 0.5}, **ACC, id="matmul-trans"),
    Case("matmul", (_f(6, 3), _f(6, 5)), {"trans_x": True}, **ACC, id="matmul-trans_x"),
    Case("matmul", (_f(4,), _f(2, 4, 3)), **ACC, id="matmul-vec-mat"),
    Case("matmul", (_f(3, 4), _f(4,)), **ACC, id="matmul-mat-vec"),
    Case("matmul", (_f(5,), _f(5,)), **ACC, id="matmul-dot"),
    Case("matmul", (((3, 4), "int32"), ((4, 2), "int32")), id="matmul-int"),
    Case("matmul_packed", (_f(2, 8, 6), _f(3, 6, 16)), {"y_panel": 16, "alpha": 0.5}, **ACC, id="matmul_packed-panels"),
    Case("matmul_packed", (_f(2, 8, 6), _f(3, 6, 16)), {"y_panel": 16, "columns": 37}, **ACC,
         id="matmul_packed-panels-columns"),
    Case("matmul_packed", (_f(3, 2, 6, 8), _f(3, 6, 5)), {"x_panel": 8}, **ACC, id="matmul_packed-row-panels"),
    Case("matmul_packed", (_f(2, 6, 16), _f(1, 6, 12)), {"x_panel": 16}, **ACC, id="matmul_packed-row-panels-broadcast"),
    # 13 columns over row panels (no divisor from 4 to 6): computed as 15, the last column read again, then dropped
    Case("matmul_packed", (_f(2, 2, 6, 8), _f(2, 6, 13)), {"x_panel": 8}, **ACC, id="matmul_packed-row-panels-whole-tiles"),
    _conv((1, 3, 6, 6), (4, 3, 3, 3)),
    _conv((2, 2, 7, 7), (3, 2, 3, 3), "conv2d-stride-pad", strides=[2, 2], paddings=[1, 1]),
    _conv((1, 2, 6, 7), (2, 2, 2, 3), "conv2d-asym-pad-dilation", paddings=[1, 0, 2, 1], dilations=[2, 1]),
    _conv((1, 4, 5, 5), (6, 2, 3, 3), "conv2d-groups", paddings=[1, 1], groups=2),
    _conv((1, 3, 5, 5), (3, 1, 3, 3), "conv2d-depthwise", strides=[2, 1], groups=3),
    _conv((1, 2, 5, 5), (2, 2, 3, 3), "conv2d-same", strides=[2, 2], padding_algorithm="SAME"),
    # 13 output columns (no divisor from 4 to 10): computed as 15, past the padding, the last two dropped
    _conv((1, 3, 5, 13), (4, 3, 3, 3), "conv2d-whole-columns", paddings=[1, 1]),
    _conv((1, 2, 4, 75), (3, 2, 3, 3), "conv2d-whole-columns-strided", strides=[2, 2], paddings=[1, 0, 1, 2]),
    _conv((1, 2, 5, 17), (2, 2, 3, 3), "conv2d-whole-columns-unpadded", dilations=[1, 2]),
    _packed_conv((1, 4, 3, 13), (2, 2, 3, 3, 3), "conv2d_packed-whole-columns-gihwo", paddings=[1, 1], groups=2,
                 weight_layout="GIHWO"),
    # a 1x1 conv over 16 flat pixels computes its 8 output channels in whole tiles of 6 (12, the last one again)
    _packed_conv((1, 3, 4, 4), (3, 1, 1, 8), "conv2d_packed-channel-tiles", weight_layout="IHWO", channel_tile=6),
    _packed_conv((1, 3, 6, 6), (3, 3, 3, 4), "conv2d_packed-ihwo", paddings=[1, 1], weight_layout="IHWO"),
    _packed_conv((1, 4, 5, 7), (2, 3, 3, 6), "conv2d_packed-ihwo-groups", strides=[2, 1], groups=2, weight_layout="IHWO"),
    # a batch of 3 (a symbolic leading dim in test_symbolic_kernels)
    _packed_conv((3, 3, 6, 5), (2, 3, 3, 3, 32), "conv2d_packed-ihwo32", strides=[2, 1], paddings=[1, 0],
                 weight_layout="IHWO32"),
    _conv((2, 6, 7, 3), (4, 3, 3, 3), "conv2d-nhwc", strides=[2, 1], paddings=[1, 0, 2, 1], data_format="NHWC"),
    _conv((1, 7, 7, 5), (5, 1, 3, 3), "conv2d-nhwc-depthwise", paddings=[1, 1], groups=5, data_format="NHWC"),
    _packed_conv((1, 4, 5, 3), (3, 1, 1, 8), "conv2d_packed-nhwc-1x1-ihwo", weight_layout="IHWO", data_format="NHWC"),
    # pixels (49, 9) that are no whole number of PIXEL_TILE: computed in whole tiles past the last pixel
    _conv((2, 7, 7, 6), (5, 6, 1, 1), "conv2d-nhwc-1x1-padded-pixels", data_format="NHWC"),
    _packed_conv((1, 3, 3, 8), (2, 8, 1, 1, 32), "conv2d_packed-nhwc-1x1-ihwo32", weight_layout="IHWO32",
                 data_format="NHWC"),
    _pool((1, 2, 6, 6), "max", [2, 2], "pool2d-max", strides=[2, 2]),
    _pool((1, 2, 5, 5), "max", [3, 3], "pool2d-max-pad", strides=[2, 2], paddings=[1, 1]),
    _pool((1, 2, 6, 6), "avg", [3, 3], "pool2d-avg-exclusive", strides=[2, 2], paddings=[1, 1]),
    _pool((1, 2, 6, 6), "avg", [3, 3], "pool2d-avg-inclusive", strides=[2, 2], paddings=[1, 1], exclusive=False),
    _pool((1, 2, 6, 6), "max", [3, 3], "pool2d-max-ceil", strides=[2, 2], ceil_mode=True),
    _pool((1, 2, 7, 6), "avg", [2, 2], "pool2d-avg-ceil", strides=[2, 2], ceil_mode=True),
    _pool((1, 2, 7, 7), "max", [2, 3], "pool2d-max-dilated", strides=[2, 1], paddings=[1, 1], dilations=[2, 2]),
    _pool((1, 2, 7, 8), "avg", [3, 2], "pool2d-avg-dilated-ceil", strides=[2, 2], paddings=[1, 0, 1, 1],
          dilations=[2, 3], ceil_mode=True),
    # ceil mode's last window would start in the end padding: it is dropped (2 outputs per dim, not 3)
    _pool((1, 2, 5, 5), "avg", [2, 2], "pool2d-ceil-drops-window-in-pad", strides=[3, 3], paddings=[0, 0, 1, 1],
          ceil_mode=True),
    _pool((2, 3, 4, 5), "avg", [1, 1], "pool2d-global-avg", global_pooling=True),
    _pool((2, 3, 4, 5), "max", [1, 1], "pool2d-global-max", global_pooling=True),
    _pool((1, 2, 7, 5), "avg", [4, 3], "pool2d-adaptive-avg", adaptive=True),  # ragged windows
    _pool((1, 2, 7, 5), "max", [4, 2], "pool2d-adaptive-max", adaptive=True),
    # max pooling of integers pads with the dtype's minimum (0 for unsigned)
    Case("pool2d", (((1, 2, 5, 5), "uint8"),), {"pooling_type": "max", "ksize": [3, 3], "strides": [2, 2],
                                                 "paddings": [1, 1]}, id="pool2d-max-pad:uint8"),
    Case("pool2d", (((1, 2, 6, 6), "int16"),), {"pooling_type": "max", "ksize": [2, 2], "strides": [2, 2]},
         id="pool2d-max:int16"),
    Case("batchnorm", make=_batchnorm_inputs, constant_inputs=(1, 2, 3, 4), **ACC, id="batchnorm-const-params"),
    Case("batchnorm", make=_batchnorm_inputs, **ACC, id="batchnorm-fed-params"),
    Case("layer_norm", (_f(4, 10), _f(10), _f(10)), **ACC),
    Case("layer_norm", (_f(2, 3, 4), _f(12), _f(12)), {"begin_norm_axis": 1}, **ACC, id="layer_norm-flat-params"),
    Case("softmax", (_f(3, 7),), **ACC),
    Case("softmax", (_f(2, 3, 4),), {"axes": [0, 2]}, **ACC, id="softmax-axes"),
    Case("log_softmax", (_f(3, 7),), **ACC),
    Case("log_softmax", (_f(2, 5, 3),), {"axes": [1]}, **ACC, id="log_softmax-axis1"),
    Case("dropout", (_f(4, 5),), {"dropout_prob": 0.3}),
    Case("dropout", (_f(4, 5),), {"dropout_prob": 0.3, "dropout_implementation": "upscale_in_train"}, id="dropout-upscale"),
]


def _u8i8(rows: tuple[int, ...], k: int, n: int):
    def make(rng: np.random.Generator) -> list[np.ndarray]:
        from cinn.core.ops.quant import pack_vnni

        x = rng.integers(0, 256, (*rows, k)).astype("uint8")  # the extremes: 255 x -128 summed over k
        w = rng.integers(-128, 128, (k, n)).astype("int8")
        return [x, pack_vnni(w, 16)]  # AVX-512's 16 int32 lanes

    return make


CASES += [
    Case("matmul_u8i8", make=_u8i8((8,), 64, 32), constant_inputs=(1,), id="matmul_u8i8"),
    Case("matmul_u8i8", make=_u8i8((2, 3), 12, 16), id="matmul_u8i8-batch-odd-rows"),
]


def _u8i8_conv(x: tuple[int, ...], oc: int, k: int):
    def make(rng: np.random.Generator) -> list[np.ndarray]:
        from cinn.core.ops.quant import pack_vnni_conv

        w = rng.integers(-128, 128, (oc, x[3], k, k)).astype("int8")
        return [rng.integers(0, 256, x).astype("uint8"), pack_vnni_conv(w, 16)]

    return make


CASES += [
    Case("conv2d_u8i8", make=_u8i8_conv((1, 9, 9, 8), 32, 3), constant_inputs=(1,), id="conv2d_u8i8"),
    Case("conv2d_u8i8", make=_u8i8_conv((2, 11, 7, 4), 16, 3), attrs={"strides": (2, 1), "dilations": (1, 2)},
         id="conv2d_u8i8-strided-dilated"),
    Case("conv2d_u8i8", make=_u8i8_conv((1, 7, 7, 12), 48, 1), id="conv2d_u8i8-1x1"),
    # 13 output columns (no divisor of 4-8): computed over a flat pixel axis
    Case("conv2d_u8i8", make=_u8i8_conv((2, 15, 15, 8), 32, 3), id="conv2d_u8i8-13x13-pixels"),
]



def _bf16(rows: tuple[int, ...], k: int, n: int):
    def make(rng: np.random.Generator) -> list[np.ndarray]:
        from cinn.core.ops.bf16 import pack_bf16

        return [rng.standard_normal((*rows, k)).astype(F32), pack_bf16(rng.standard_normal((k, n)).astype(F32), 16)]

    return make


def _bf16_conv(x: tuple[int, ...], oc: int, k: int):
    def make(rng: np.random.Generator) -> list[np.ndarray]:
        from cinn.core.ops.bf16 import pack_bf16_conv

        w = rng.standard_normal((oc, x[3], k, k)).astype(F32)
        return [rng.standard_normal(x).astype(F32), pack_bf16_conv(w, 16)]

    return make


# bf16 products are exact in float32: the reference differs by the order of the float32 sums alone
BF16_ACC = {"rtol": 1e-4, "atol": 1e-4}
CASES += [
    Case("matmul_bf16", make=_bf16((8,), 64, 32), constant_inputs=(1,), **BF16_ACC, id="matmul_bf16"),
    Case("matmul_bf16", make=_bf16((2, 3), 12, 16), **BF16_ACC, id="matmul_bf16-batch-odd-rows"),
    Case("conv2d_bf16", make=_bf16_conv((1, 9, 9, 8), 32, 3), constant_inputs=(1,), **BF16_ACC, id="conv2d_bf16"),
    Case("conv2d_bf16", make=_bf16_conv((2, 11, 7, 4), 16, 3), attrs={"strides": (2, 1), "dilations": (1, 2)},
         **BF16_ACC, id="conv2d_bf16-strided-dilated"),
    Case("conv2d_bf16", make=_bf16_conv((2, 15, 15, 8), 32, 3), **BF16_ACC, id="conv2d_bf16-13x13-pixels"),
]

CASES += [
    Case("winograd_input", inputs=(((1, 3, 10, 9), "float32"),), attrs={"tile": 4, "paddings": (1, 1, 1, 1)},
         id="winograd_input-f4"),
    # two images, asymmetric paddings, tiles that overhang the output (9x8 in tiles of 2)
    Case("winograd_input", inputs=(((2, 5, 8, 7), "float32"),), attrs={"tile": 2, "paddings": (1, 0, 2, 3)},
         id="winograd_input-f2-batch-asymmetric"),
    # 25 tiles per image: a whole vector of tiles and a shorter one (16-lane vectors; 3 + 1 of 8 lanes)
    Case("winograd_input", inputs=(((2, 3, 18, 21), "float32"),), attrs={"tile": 4, "paddings": (1, 1, 1, 0)},
         id="winograd_input-f4-batch-vector-tail"),
    # 16 tiles per image: whole vectors
    Case("winograd_input", inputs=(((1, 2, 14, 14), "float32"),), attrs={"tile": 4, "paddings": (1, 1, 1, 1)},
         id="winograd_input-f4-whole-vectors"),
    # 9 tiles in 16 columns: the tiles continue past the image's last tile row, over zeros and its last rows
    Case("winograd_input", inputs=(((1, 3, 10, 9), "float32"),), attrs={"tile": 4, "paddings": (1, 1, 1, 1),
                                                                       "columns": 16}, id="winograd_input-f4-columns"),
    Case("winograd_output", inputs=(((36, 3, 6), "float32"),), attrs={"tile": 4, "tiles": (2, 3), "size": (8, 12)},
         id="winograd_output-f4"),
    # M's columns past the image's 9 tiles are not read
    Case("winograd_output", inputs=(((36, 3, 16), "float32"),), attrs={"tile": 4, "tiles": (3, 3), "size": (10, 9)},
         id="winograd_output-f4-padded-columns"),
    # the last tiles overhang the output (7x11 of 4x6 tiles of 2)
    Case("winograd_output", inputs=(((16, 4, 48), "float32"),), attrs={"tile": 2, "tiles": (4, 6), "size": (7, 11)},
         id="winograd_output-f2-batch-overhang"),
    Case("winograd_output", inputs=(((36, 2, 49), "float32"),), attrs={"tile": 4, "tiles": (7, 7), "size": (27, 26)},
         id="winograd_output-f4-overhang"),
    # M's rows padded to whole register tiles (6 of them for 5 channels): the output reads the leading ones
    Case("winograd_output", inputs=(((36, 6, 4), "float32"),), attrs={"tile": 4, "tiles": (2, 2), "size": (8, 8),
                                                                     "channels": 5}, id="winograd_output-f4-channels"),
]
