# NumPy reference of the rope op (src/layers/attention/rope.h), for tests/op_runner_numpy_test.py, which runs
# this file with its own names in scope (Case, randn, np, ...).


def rope_ref(xs, a):
    """x [B,T,H,D]: pairs (x_2i, x_2i+1) at position start + t rotated by (start + t) base^(-2i/D)."""
    x = xs[0]
    B, T, H, D = x.shape
    theta = a["base"] ** (-2.0 * np.arange(D // 2) / D)
    phi = (a["start"] + np.arange(T))[:, None, None] * theta    # [T, 1, D/2]

    def rotate(v, sign):
        e, o = v[..., 0::2], v[..., 1::2]
        c, s = np.cos(phi), sign * np.sin(phi)
        out = np.empty_like(v)
        out[..., 0::2], out[..., 1::2] = e * c - o * s, e * s + o * c
        return out

    return [rotate(x, 1.0)], lambda gs: [rotate(gs[0], -1.0)]  # the transpose of a rotation is its inverse


CASES = {
    "rope": lambda: [Case([randn(2, 5, 3, 6)], rope_ref, {"base": 100.0, "start": 3}),
                 Case([randn(1, 4, 2, 8)], rope_ref, {"base": 10000.0, "start": 0}),
                 Case([randn(1, 1, 1, 4)], rope_ref, {"base": 10000.0, "start": 4095})],
}
