"""Cases for resize: each interpolation and coordinate mode, up and down, scales and sizes, int nearest."""
from tests.cases import Case

F, I = "float32", "int32"
X = ((1, 2, 4, 5), F)
TOL = {"rtol": 1e-5, "atol": 1e-5}


def _resize(id, x=X, **attrs) -> Case:
    return Case("resize", (x,), attrs, id=f"resize-{id}", **TOL)


CASES = [
    _resize("nearest-up-scales", out_shape=[8, 10], scales=[2.0, 2.0]),
    _resize("nearest-down-asymmetric-floor", out_shape=[3, 2], coordinate_transformation_mode="asymmetric",
            nearest_mode="floor"),
    _resize("nearest-ceil-half-pixel", out_shape=[7, 8], nearest_mode="ceil"),
    _resize("nearest-prefer-ceil-int", x=((2, 3, 5), I), out_shape=[4, 9], nearest_mode="round_prefer_ceil"),
    _resize("linear-up-half-pixel", out_shape=[7, 9]),
    _resize("linear-down-scales", out_shape=[2, 3], mode="linear", scales=[0.6, 0.6]),
    _resize("bilinear-align-corners", out_shape=[6, 3], mode="bilinear", coordinate_transformation_mode="align_corners"),
    _resize("linear-pytorch-half-pixel-to-1", out_shape=[1, 3], mode="linear",
            coordinate_transformation_mode="pytorch_half_pixel"),
    _resize("linear-half-pixel-symmetric", out_shape=[6, 7], mode="linear", scales=[1.6, 1.5],
            coordinate_transformation_mode="half_pixel_symmetric"),
    _resize("cubic-up", out_shape=[7, 8], mode="cubic"),
    _resize("cubic-exclude-outside", out_shape=[3, 9], mode="cubic", cubic_coeff_a=-0.5, exclude_outside=True),
    _resize("linear-tf-crop", out_shape=[3, 4], mode="linear", coordinate_transformation_mode="tf_crop_and_resize",
            roi=[0.4, -0.2, 0.8, 1.3], extrapolation_value=10.0),
    _resize("linear-antialias-down", x=((1, 1, 9, 10), F), out_shape=[4, 3], mode="linear", antialias=True),
    _resize("cubic-antialias-down-scales", x=((1, 1, 8, 6), F), out_shape=[5, 6], mode="cubic", scales=[0.6, 1.0],
            antialias=True),
    _resize("linear-1d-last-axis", x=((3, 6), F), out_shape=[4], mode="linear"),
]
