# NumPy reference of the delta_net op (src/layers/delta/delta_net.h), for tests/op_runner_numpy_test.py, which
# runs this file with its own names in scope (Case, randn, rng, np, math, ...).
#
# The recurrent form, step by step, and its vector-Jacobian product by a reverse loop over time, written
# from the recurrence alone (not from the C++):
#   S_t = a_t (I - b_t k_t^T k_t) S_{t-1} + b_t k_t^T v_t,   a_t = exp(g_t) (1 without g),   o_t = c q_t S_t


def delta_net_ref(xs, a):
    q, k, v, beta, g, s0 = xs
    B, T, H, dk = q.shape
    dv = v.shape[-1]
    c = a["scale"] if a["scale"] > 0 else 1.0 / math.sqrt(dk)
    gate = np.exp(g) if g is not None else np.ones((B, T, H))
    S = np.zeros((B, H, dk, dv)) if s0 is None else s0.copy()
    states = [S]                                   # states[t] = S_t, S_0 the initial state
    o = np.zeros((B, T, H, dv))
    for t in range(T):
        kt, vt, bt, at = k[:, t], v[:, t], beta[:, t, :, None], gate[:, t, :, None, None]   # [B,H,dk] ...
        Sa = at * S                                                      # a_t S_{t-1}
        pred = np.einsum("bhi,bhij->bhj", kt, Sa)                        # k_t (a_t S_{t-1})
        S = Sa + np.einsum("bhi,bhj->bhij", kt, bt * (vt - pred))        # + b_t k_t^T (v_t - k_t a_t S_{t-1})
        states.append(S)
        o[:, t] = c * np.einsum("bhi,bhij->bhj", q[:, t], S)

    def back(gs):
        go = gs[0] if gs[0] is not None else np.zeros_like(o)
        dS = gs[1].copy() if gs[1] is not None else np.zeros_like(S)
        dq, dk_, dv_ = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        db, dg = np.zeros_like(beta), np.zeros((B, T, H))
        for t in reversed(range(T)):
            kt, vt, bt, at = k[:, t], v[:, t], beta[:, t, :, None], gate[:, t, :, None, None]
            St, Sa = states[t + 1], at * states[t]
            # o_t = c q_t S_t
            dq[:, t] = c * np.einsum("bhj,bhij->bhi", go[:, t], St)
            dS = dS + c * np.einsum("bhi,bhj->bhij", q[:, t], go[:, t])
            # S_t = Sa + b kᵀ err,  err = v - k Sa
            err = vt - np.einsum("bhi,bhij->bhj", kt, Sa)
            kdS = np.einsum("bhi,bhij->bhj", kt, dS)                     # k dS
            db[:, t] = (kdS * err).sum(-1)
            derr = bt * kdS
            dv_[:, t] = derr
            dk_[:, t] = bt * np.einsum("bhij,bhj->bhi", dS, err) - np.einsum("bhij,bhj->bhi", Sa, derr)
            dSa = dS - np.einsum("bhi,bhj->bhij", kt, derr)
            dg[:, t] = (dSa * Sa).sum((-1, -2))                          # d/dg of exp(g) S = exp(g) S
            dS = at * dSa
        return [dq, dk_, dv_, db, dg if g is not None else None, dS if s0 is not None else None]

    return [o, S], back


def unit_keys(*shape):
    x = randn(*shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def beta_of(*shape):
    return rng.uniform(0.05, 0.95, size=shape)


def log_gate(*shape):
    return rng.uniform(-1.5, -0.01, size=shape)


CASES = {
    "delta_net": lambda: [
        # Gated DeltaNet with an initial state, chunks of 2 over T = 5, dk != dv.
        Case([randn(2, 5, 3, 4), unit_keys(2, 5, 3, 4), randn(2, 5, 3, 3), beta_of(2, 5, 3), log_gate(2, 5, 3),
              0.5 * randn(2, 3, 4, 3)], delta_net_ref, {"form": "chunkwise", "chunk": 2}),
        # DeltaNet from a zero state, recurrent form, explicit scale.
        Case([randn(1, 6, 2, 3), unit_keys(1, 6, 2, 3), randn(1, 6, 2, 5), beta_of(1, 6, 2), None, None],
             delta_net_ref, {"form": "recurrent", "chunk": 4, "scale": 0.6}),
        # Gated, no initial state, T below one chunk.
        Case([randn(2, 3, 1, 5), unit_keys(2, 3, 1, 5), randn(2, 3, 1, 2), beta_of(2, 3, 1), log_gate(2, 3, 1), None],
             delta_net_ref, {"form": "chunkwise", "chunk": 8}),
        # One decode step from a given state; only o gets a cotangent.
        Case([randn(2, 1, 2, 3), unit_keys(2, 1, 2, 3), randn(2, 1, 2, 4), beta_of(2, 1, 2), log_gate(2, 1, 2),
              randn(2, 2, 3, 4)], delta_net_ref, {"form": "recurrent"}, cotangents=[0]),
    ],
}
