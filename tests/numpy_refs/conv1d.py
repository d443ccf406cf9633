# NumPy reference of the causal_conv1d op (src/layers/ssm/conv1d.h), for tests/op_runner_numpy_test.py, which
# runs this file with its own names in scope (Case, randn, np, ...). The reference pads x with the initial
# state (or zeros) and sums the W shifted products; its vector-Jacobian product scatters the same terms back.


def causal_conv1d_ref(xs, a):
    """z_t = sum_j w_j * p[t + W-1 - j] (+ b), p = initial_state ++ x; y = silu(z) or z; final = p[T:]."""
    x, w, b, h0 = xs
    B, T, C = x.shape
    W = w.shape[0]
    p = np.concatenate([h0 if h0 is not None else np.zeros((B, W - 1, C)), x], axis=1)  # [B, W-1+T, C]
    z = sum(w[j] * p[:, W - 1 - j:W - 1 - j + T] for j in range(W))
    if b is not None:
        z = z + b
    s = 1.0 / (1.0 + np.exp(-z))
    y = z * s if a["silu"] else z
    final = p[:, T:].copy()

    def back(gs):
        gy = gs[0] if gs[0] is not None else np.zeros(y.shape)
        dz = gy * (s * (1.0 + z * (1.0 - s))) if a["silu"] else gy
        dp = np.zeros(p.shape)
        for j in range(W):
            dp[:, W - 1 - j:W - 1 - j + T] += w[j] * dz
        if gs[1] is not None:
            dp[:, T:] += gs[1]
        dw = np.stack([(dz * p[:, W - 1 - j:W - 1 - j + T]).sum(axis=(0, 1)) for j in range(W)])
        db = dz.sum(axis=(0, 1)) if b is not None else None
        return [dp[:, W - 1:], dw, db, dp[:, :W - 1] if h0 is not None else None]

    return [y, final], back


def conv1d_case(B, T, C, W, with_bias, with_h0, silu):
    xs = [randn(B, T, C), 0.5 * randn(W, C), randn(C) if with_bias else None,
          randn(B, W - 1, C) if with_h0 else None]
    return Case(xs, causal_conv1d_ref, {"silu": silu})


CASES = {
    "causal_conv1d": lambda: [
        conv1d_case(2, 7, 5, 4, True, True, True),     # odd T and C, the widest kernel, everything given
        conv1d_case(2, 7, 5, 4, False, False, False),  # no bias, zeros before x_0, no activation
        conv1d_case(1, 2, 3, 4, True, True, False),    # T < W - 1: the final state reaches into the initial state
        conv1d_case(3, 1, 4, 3, False, True, True),    # one decode step from a state
        conv1d_case(1, 6, 3, 2, True, False, True),
        conv1d_case(2, 5, 3, 1, True, True, True),     # W = 1: no state at all
    ],
}
