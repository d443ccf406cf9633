# NumPy reference of the gla op (src/layers/scan/gla.h), for tests/op_runner_numpy_test.py, which runs
# this file with its own names in scope (Case, randn, rng, np, ...). Whatever the op's form, the
# reference is the recurrence step by step, and its vector-Jacobian product a reverse loop over time.


def log_gates(*shape):
    """log α in [-1.5, -0.02): from strong decay to almost none."""
    return -rng.uniform(0.02, 1.5, size=shape)


def gla_ref(xs, a):
    """S_t = (exp(g_t)^T exp(gv_t)) * S_{t-1} + k_t^T v_t, o_t = c q_t S_t, per batch entry and head."""
    q, k, v, g, gv, h0 = xs
    B, T, H, dk = q.shape
    dv = v.shape[3]
    c = a["scale"] if a["scale"] > 0 else 1.0 / math.sqrt(dk)
    alpha = np.exp(g)                                              # [B,T,H,dk]
    beta = np.exp(gv) if gv is not None else np.ones(v.shape)      # [B,T,H,dv]
    decay = alpha[..., :, None] * beta[..., None, :]               # [B,T,H,dk,dv]
    S = h0.copy() if h0 is not None else np.zeros((B, H, dk, dv))
    states = [S]                                                   # states[t] = S_t, S_0 first
    o = np.empty((B, T, H, dv))
    for t in range(T):
        S = decay[:, t] * S + k[:, t, :, :, None] * v[:, t, :, None, :]
        states.append(S)
        o[:, t] = c * np.einsum("bhi,bhij->bhj", q[:, t], S)

    def back(gs):
        go = gs[0] if gs[0] is not None else np.zeros(o.shape)
        dS = gs[1].copy() if gs[1] is not None else np.zeros(S.shape)   # d loss / d S_t, walking back
        dq, dk_, dv_, dg, dgv = (np.zeros(x.shape) for x in (q, k, v, g, v))
        for t in reversed(range(T)):
            dS = dS + c * q[:, t, :, :, None] * go[:, t, :, None, :]      # o_t = c q_t S_t
            dq[:, t] = c * np.einsum("bhij,bhj->bhi", states[t + 1], go[:, t])
            dk_[:, t] = np.einsum("bhij,bhj->bhi", dS, v[:, t])           # S_t has k_t^T v_t
            dv_[:, t] = np.einsum("bhi,bhij->bhj", k[:, t], dS)
            D = dS * decay[:, t] * states[t]                              # d/d log of each decay factor
            dg[:, t] = D.sum(axis=-1)
            dgv[:, t] = D.sum(axis=-2)
            dS = dS * decay[:, t]                                         # on to S_{t-1}
        return [dq, dk_, dv_, dg, dgv if gv is not None else None, dS if h0 is not None else None]

    return [o, S], back


def gla_case(B, T, H, dk, dv, with_gv, with_h0, attrs):
    xs = [randn(B, T, H, dk), randn(B, T, H, dk), randn(B, T, H, dv), log_gates(B, T, H, dk),
          log_gates(B, T, H, dv) if with_gv else None, randn(B, H, dk, dv) if with_h0 else None]
    return Case(xs, gla_ref, attrs)


CASES = {
    "gla": lambda: [
        # T = 11: chunks of 4 (the last partial), sub-chunks of 3 (not dividing the chunk); dk != dv.
        gla_case(2, 11, 2, 3, 5, True, True, {"form": "chunkwise", "chunk": 4, "sub_chunk": 3}),
        gla_case(2, 11, 2, 3, 5, True, True, {"form": "recurrent", "chunk": 4}),
        gla_case(1, 9, 3, 4, 2, False, False, {"form": "chunkwise", "chunk": 8, "sub_chunk": 2, "scale": 0.7}),
        gla_case(1, 5, 2, 3, 4, False, True, {"form": "chunkwise"}),               # T below one (default) chunk
        gla_case(2, 1, 2, 3, 4, True, True, {"form": "recurrent"}),                # one decode step from a state
        gla_case(1, 7, 1, 2, 3, True, False, {"form": "recurrent", "chunk": 3, "scale": 1.3}),
    ],
}
