# NumPy reference of the selective_scan op (src/layers/ssm/selective_scan.h), for
# tests/op_runner_numpy_test.py, which runs this file with its own names in scope (Case, randn, rng, np,
# ...). Whatever the op's form, the reference is the recurrence step by step, keeping every state, and its
# vector-Jacobian product a reverse loop over time.


def softplus(x):
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def selective_scan_ref(xs, a):
    """dt = softplus(delta + bias), h_t = exp(dt A) h_{t-1} + dt u B_t, y = (C_t . h_t + D u) silu(z)."""
    u, delta, A, Bm, Cm, D, z, bias, h0 = xs
    Bsz, T, Dn = u.shape
    N = A.shape[1]
    x = delta + (bias if bias is not None else 0.0)
    dt = softplus(x) if a["delta_softplus"] else x                 # [B,T,D]
    slope = sigmoid(x) if a["delta_softplus"] else np.ones(x.shape)
    decay = np.exp(dt[..., None] * A)                              # [B,T,D,N]
    h = h0.copy() if h0 is not None else np.zeros((Bsz, Dn, N))
    states = [h]                                                   # states[t] = h after t steps
    yhat = np.empty(u.shape)
    for t in range(T):
        h = decay[:, t] * h + (dt[:, t] * u[:, t])[..., None] * Bm[:, t, None, :]
        states.append(h)
        yhat[:, t] = np.einsum("bdn,bn->bd", h, Cm[:, t]) + (D * u[:, t] if D is not None else 0.0)
    gate = z * sigmoid(z) if z is not None else np.ones(u.shape)
    y = yhat * gate

    def back(gs):
        gy = gs[0] if gs[0] is not None else np.zeros(y.shape)
        dh = gs[1].copy() if gs[1] is not None else np.zeros(h.shape)
        dz = gy * yhat * sigmoid(z) * (1 + z * (1 - sigmoid(z))) if z is not None else None
        g = gy * gate                                              # d loss / d yhat
        du, ddt = np.zeros(u.shape), np.zeros(u.shape)
        dA, dB, dC = np.zeros(A.shape), np.zeros(Bm.shape), np.zeros(Cm.shape)
        for t in reversed(range(T)):
            dh = dh + g[:, t, :, None] * Cm[:, t, None, :]
            dC[:, t] = np.einsum("bd,bdn->bn", g[:, t], states[t + 1])
            hp = states[t]
            ddt[:, t] = np.einsum("bdn,bdn->bd", dh, A * decay[:, t] * hp + u[:, t, :, None] * Bm[:, t, None, :])
            dA += np.einsum("bdn,bd->dn", dh * decay[:, t] * hp, dt[:, t])
            dB[:, t] = np.einsum("bdn,bd->bn", dh, dt[:, t] * u[:, t])
            du[:, t] = np.einsum("bdn,bn->bd", dh, Bm[:, t]) * dt[:, t]
            dh = dh * decay[:, t]
        if D is not None:
            du += g * D
        ddelta = ddt * slope
        return [du, ddelta, dA, dB, dC, (g * u).sum(axis=(0, 1)) if D is not None else None, dz,
                ddelta.sum(axis=(0, 1)) if bias is not None else None, dh if h0 is not None else None]

    return [y, h], back


def selective_scan_case(B, T, D, N, with_opt, attrs, dt_lo=-1.0, dt_hi=1.0):
    xs = [randn(B, T, D), rng.uniform(dt_lo, dt_hi, size=(B, T, D)), -rng.uniform(0.1, 2.0, size=(D, N)),
          randn(B, T, N), randn(B, T, N), randn(D) if with_opt else None, randn(B, T, D) if with_opt else None,
          rng.uniform(-0.3, 0.3, size=(D,)) if with_opt else None, randn(B, D, N) if with_opt else None]
    attrs = dict(attrs)
    attrs.setdefault("delta_softplus", True)
    return Case(xs, selective_scan_ref, attrs)


CASES = {
    "selective_scan": lambda: [
        # T = 11: chunks of 4 (the last partial); every optional input, then none.
        selective_scan_case(2, 11, 3, 5, True, {"form": "chunked", "chunk": 4}),
        selective_scan_case(2, 11, 3, 5, False, {"form": "chunked", "chunk": 4}),
        selective_scan_case(1, 7, 4, 3, True, {"form": "recurrent", "chunk": 3}),
        selective_scan_case(2, 1, 3, 2, True, {"form": "recurrent"}),                 # one decode step
        selective_scan_case(1, 5, 2, 4, True, {"form": "chunked"}),                   # T below one chunk
        # Δ from 1e-4 to 10 (raw delta log(e^Δ − 1)).
        selective_scan_case(1, 9, 3, 3, True, {"form": "chunked", "chunk": 4},
                            dt_lo=math.log(math.expm1(1e-4)), dt_hi=math.log(math.expm1(10.0))),
        # Without softplus: Δ = delta + bias, positive.
        selective_scan_case(1, 6, 2, 3, True, {"form": "chunked", "chunk": 4, "delta_softplus": False},
                            dt_lo=0.4, dt_hi=1.0),
    ],
}
