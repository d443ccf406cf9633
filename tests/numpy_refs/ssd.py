# NumPy reference of the ssd op (src/layers/ssm/ssd.h, Mamba-2's state space duality), for
# tests/op_runner_numpy_test.py, which runs this file with its own names in scope (Case, randn, rng, np, ...).
# Whatever the op's form, the reference is the recurrence step by step, and its vector-Jacobian product a
# reverse loop over time.


def ssd_ref(xs, a):
    """S_t = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T, y_t = S_t C_t + D x_t; head h reads group h // (H/G)."""
    x, dt, A, Bg, Cg, D, h0 = xs
    Bn, T, H, P = x.shape
    G, N = Bg.shape[2], Bg.shape[3]
    Bh = np.repeat(Bg, H // G, axis=2)                             # [B,T,H,N]: each head's group
    Ch = np.repeat(Cg, H // G, axis=2)
    Dv = D if D is not None else np.zeros(H)
    a_t = np.exp(dt * A)                                           # [B,T,H]
    S = h0.copy() if h0 is not None else np.zeros((Bn, H, P, N))
    states = [S]                                                   # states[t] = S_t, S_0 first
    y = np.empty(x.shape)
    for t in range(T):
        S = a_t[:, t, :, None, None] * S + (dt[:, t, :, None] * x[:, t])[..., None] * Bh[:, t, :, None, :]
        states.append(S)
        y[:, t] = np.einsum("bhpn,bhn->bhp", S, Ch[:, t]) + Dv[None, :, None] * x[:, t]

    def back(gs):
        gy = gs[0] if gs[0] is not None else np.zeros(y.shape)
        dS = gs[1].copy() if gs[1] is not None else np.zeros(S.shape)   # d loss / d S_t, walking back
        dx, ddt, dB, dC = np.zeros(x.shape), np.zeros(dt.shape), np.zeros(Bh.shape), np.zeros(Ch.shape)
        dA, dD = np.zeros(H), np.zeros(H)
        for t in reversed(range(T)):
            dS = dS + gy[:, t, :, :, None] * Ch[:, t, :, None, :]            # y_t = S_t C_t
            dC[:, t] = np.einsum("bhpn,bhp->bhn", states[t + 1], gy[:, t])
            dD += np.einsum("bhp,bhp->h", gy[:, t], x[:, t])
            u = np.einsum("bhpn,bhn->bhp", dS, Bh[:, t])                       # dS B_t
            dx[:, t] = dt[:, t, :, None] * u + Dv[None, :, None] * gy[:, t]
            dB[:, t] = dt[:, t, :, None] * np.einsum("bhpn,bhp->bhn", dS, x[:, t])
            dlog = a_t[:, t] * np.einsum("bhpn,bhpn->bh", dS, states[t])       # d/d (dt_t A)
            ddt[:, t] = np.einsum("bhp,bhp->bh", x[:, t], u) + A[None, :] * dlog
            dA += np.einsum("bh,bh->h", dt[:, t], dlog)
            dS = a_t[:, t, :, None, None] * dS                                 # on to S_{t-1}
        dBg = dB.reshape(Bn, T, G, H // G, N).sum(axis=3)                      # heads of a group summed
        dCg = dC.reshape(Bn, T, G, H // G, N).sum(axis=3)
        return [dx, ddt, dA, dBg, dCg, dD if D is not None else None, dS if h0 is not None else None]

    return [y, S], back


def ssd_case(B, T, H, P, G, N, with_D, with_h0, attrs):
    xs = [randn(B, T, H, P), rng.uniform(0.05, 1.5, size=(B, T, H)), -rng.uniform(0.2, 2.0, size=(H,)),
          randn(B, T, G, N), randn(B, T, G, N), randn(H) if with_D else None,
          randn(B, H, P, N) if with_h0 else None]
    return Case(xs, ssd_ref, attrs)


CASES = {
    "ssd": lambda: [
        # T = 11: chunks of 4 (the last partial); 4 heads in 2 groups; P != N.
        ssd_case(2, 11, 4, 3, 2, 5, True, True, {"form": "chunkwise", "chunk": 4}),
        ssd_case(2, 11, 4, 3, 2, 5, True, True, {"form": "recurrent", "chunk": 4}),
        ssd_case(1, 9, 3, 2, 1, 4, False, False, {"form": "chunkwise", "chunk": 8}),   # one group
        ssd_case(1, 5, 2, 3, 2, 4, True, False, {"form": "chunkwise"}),                # T below one (default) chunk
        ssd_case(2, 1, 2, 3, 1, 4, True, True, {"form": "recurrent"}),                 # one decode step from a state
    ],
}
