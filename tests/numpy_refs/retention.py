# NumPy reference of the retention op (src/layers/scan/retention.h), for tests/op_runner_numpy_test.py, which
# runs this file with its own names in scope (Case, randn, rng, np, ...). The forward is the recurrence
# token by token; the vector-Jacobian product is a reverse loop over time written out by hand.


def _gammas(a, H):
    if a["gammas"]:
        return np.array([float(x) for x in a["gammas"].split(",")])
    return 1.0 - 2.0 ** (-5.0 - np.arange(H))


def retention_ref(xs, a):
    q, k, v, s0 = xs
    B, T, H, dk = q.shape
    dv = v.shape[3]
    c = a["scale"] if a["scale"] > 0 else 1.0 / np.sqrt(dk)
    gam = _gammas(a, H)[None, :, None, None]        # [1, H, 1, 1]
    S = s0.copy() if s0 is not None else np.zeros((B, H, dk, dv))
    o = np.zeros((B, T, H, dv))
    states = []
    for t in range(T):
        S = gam * S + np.einsum("bhi,bhj->bhij", k[:, t], v[:, t])
        states.append(S)
        o[:, t] = c * np.einsum("bhi,bhij->bhj", q[:, t], S)

    def back(gs):
        go = gs[0] if gs[0] is not None else np.zeros_like(o)
        G = (gs[1] if gs[1] is not None else np.zeros_like(S)).copy()   # dL/dS_t
        dq, dk_, dv_ = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
        for t in reversed(range(T)):
            dq[:, t] = c * np.einsum("bhij,bhj->bhi", states[t], go[:, t])
            G = G + c * np.einsum("bhi,bhj->bhij", q[:, t], go[:, t])
            dk_[:, t] = np.einsum("bhij,bhj->bhi", G, v[:, t])
            dv_[:, t] = np.einsum("bhi,bhij->bhj", k[:, t], G)
            G = gam * G                                    # through S_t = γ S_{t-1} + ...
        return [dq, dk_, dv_, G if s0 is not None else None]

    return [o, S], back


def _ret_case(B, T, H, dk, dv, attrs, state=True):
    return Case([randn(B, T, H, dk), randn(B, T, H, dk), randn(B, T, H, dv), randn(B, H, dk, dv) if state else None],
                retention_ref, attrs)


CASES = {
    "retention": lambda: [
        _ret_case(2, 7, 2, 3, 4, {"form": "chunkwise", "chunk": 3, "gammas": "0.6,0.9"}),
        _ret_case(1, 6, 3, 4, 3, {"form": "parallel"}, state=False),
        _ret_case(2, 5, 2, 3, 2, {"form": "recurrent", "scale": 0.8, "gammas": "0.3,1.0"}),
        _ret_case(1, 9, 2, 2, 3, {"form": "chunkwise", "chunk": 4, "gammas": "2.061153622438558e-09,0.999999"}),
        _ret_case(1, 1, 2, 3, 3, {"form": "recurrent"}),
    ],
}
