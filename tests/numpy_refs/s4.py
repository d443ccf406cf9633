# NumPy reference of the s4 op (src/layers/ssm/s4.h), for tests/op_runner_numpy_test.py, which runs this
# file with its own names in scope (Case, randn, rng, np, ...). Whatever the op's form, the reference is
# the complex recurrence step by step, and its vector-Jacobian product a reverse loop over time followed
# by the chain rule through the discretisation, written out here with complex numbers.


def s4_discretise(lam, dt, disc):
    """Ā, φ (B̄ = φ B) and their derivatives in Λ and Δ; lam [H, N2] complex, dt [H, 1]."""
    z = dt * lam
    if disc == "zoh":
        Ab = np.exp(z)
        phi = (Ab - 1.0) / lam
        dA_dL, dA_dDt = dt * Ab, lam * Ab
        dphi_dL = (dt * Ab - phi) / lam        # d/dΛ (e^{ΔΛ} − 1)/Λ
        dphi_dDt = Ab
    else:
        w = 1.0 / (1.0 - z / 2)
        Ab = (1.0 + z / 2) * w
        phi = dt * w
        dA_dL, dA_dDt = dt * w * w, lam * w * w
        dphi_dL, dphi_dDt = dt * dt * w * w / 2, w * w
    return Ab, phi, dA_dL, dA_dDt, dphi_dL, dphi_dDt


def s4_ref(xs, a):
    if xs[7] is not None:
        return s4_dplr_ref(xs, a)
    u, log_dt, A, B, C, D, x0 = xs[:7]
    Bn, T, H = u.shape
    lam = A[..., 0] + 1j * A[..., 1]
    Bc, Cc = B[..., 0] + 1j * B[..., 1], C[..., 0] + 1j * C[..., 1]
    dt = np.exp(log_dt)[:, None]
    Ab, phi, dA_dL, dA_dDt, dphi_dL, dphi_dDt = s4_discretise(lam, dt, a["discretisation"])
    Bb = phi * Bc
    Dv = D if D is not None else np.zeros(H)
    x = x0[..., 0] + 1j * x0[..., 1] if x0 is not None else np.zeros((Bn, H, lam.shape[1]), complex)
    states = [x]
    y = np.empty((Bn, T, H))
    for t in range(T):
        x = Ab * x + Bb * u[:, t, :, None]
        states.append(x)
        y[:, t] = 2 * (Cc * x).sum(-1).real + Dv * u[:, t]
    final = np.stack([x.real, x.imag], -1)

    def back(gs):
        gy = gs[0] if gs[0] is not None else np.zeros(y.shape)
        g = gs[1][..., 0] + 1j * gs[1][..., 1] if gs[1] is not None else np.zeros(x.shape, complex)
        du = np.zeros(u.shape)
        gA, gB, gC = (np.zeros(lam.shape, complex) for _ in range(3))
        for t in reversed(range(T)):
            r = 2 * gy[:, t, :, None]                          # y_t = 2 Re(C x_t)
            g = g + np.conj(Cc) * r
            gC += (np.conj(states[t + 1]) * r).sum(0)
            gA += (np.conj(states[t]) * g).sum(0)              # x_t = Ā x_{t-1} + B̄ u_t
            gB += (u[:, t, :, None] * g).sum(0)
            du[:, t] = (np.conj(g) * Bb).real.sum(-1) + Dv * gy[:, t]
            g = np.conj(Ab) * g
        gphi = np.conj(Bc) * gB
        gL = np.conj(dA_dL) * gA + np.conj(dphi_dL) * gphi
        gdt = (np.conj(dA_dDt) * gA + np.conj(dphi_dDt) * gphi).real.sum(-1)
        pair = lambda z: np.stack([z.real, z.imag], -1)
        return [du, gdt * dt[:, 0], pair(gL), pair(np.conj(phi) * gB), pair(gC),
                (u * gy).sum((0, 1)) if D is not None else None, pair(g) if x0 is not None else None, None, None]

    return [y, final], back


def s4_dplr_ref(xs, a):
    """The diagonal-plus-low-rank form: A = diag(Λ) − P Q*, bilinear with dense inverses (np.linalg.inv)."""
    assert a["discretisation"] == "bilinear"
    u, log_dt, A, B, C, D, x0, P, Q = xs
    Bn, T, H = u.shape
    cp = lambda t: t[..., 0] + 1j * t[..., 1]
    lam, Bc, Cc, Pc, Qc = cp(A), cp(B), cp(C), cp(P), cp(Q)
    n = lam.shape[1]
    dt = np.exp(log_dt)
    I = np.eye(n)
    Am = np.stack([np.diag(lam[h]) - np.outer(Pc[h], np.conj(Qc[h])) for h in range(H)])   # [H, n, n]
    R = np.linalg.inv(I - 0.5 * dt[:, None, None] * Am)
    Ab = R @ (I + 0.5 * dt[:, None, None] * Am)
    Bb = dt[:, None] * np.einsum("hij,hj->hi", R, Bc)
    Dv = D if D is not None else np.zeros(H)
    x = cp(x0) if x0 is not None else np.zeros((Bn, H, n), complex)
    states = [x]
    y = np.empty((Bn, T, H))
    for t in range(T):
        x = np.einsum("hij,bhj->bhi", Ab, x) + Bb * u[:, t, :, None]
        states.append(x)
        y[:, t] = 2 * (Cc * x).sum(-1).real + Dv * u[:, t]
    final = np.stack([x.real, x.imag], -1)

    def back(gs):
        gy = gs[0] if gs[0] is not None else np.zeros(y.shape)
        g = cp(gs[1]) if gs[1] is not None else np.zeros(x.shape, complex)
        du = np.zeros(u.shape)
        gA = np.zeros(Ab.shape, complex)
        gB, gC = np.zeros(lam.shape, complex), np.zeros(lam.shape, complex)
        for t in reversed(range(T)):
            r = 2 * gy[:, t, :, None]
            g = g + np.conj(Cc) * r
            gC += (np.conj(states[t + 1]) * r).sum(0)
            gA += np.einsum("bhi,bhj->hij", g, np.conj(states[t]))     # x_t = Ā x_{t-1} + B̄ u_t
            gB += (u[:, t, :, None] * g).sum(0)
            du[:, t] = (np.conj(g) * Bb).real.sum(-1) + Dv * gy[:, t]
            g = np.einsum("hji,bhj->bhi", np.conj(Ab), g)
        # Ā = R (I + ΔA/2), B̄ = Δ R B, R = (I − ΔA/2)^{-1}: differentiate R directly
        RH = np.conj(np.transpose(R, (0, 2, 1)))
        gR = np.einsum("hij,hkj->hik", gA, np.conj(I + 0.5 * dt[:, None, None] * Am)) \
            + dt[:, None, None] * np.einsum("hi,hj->hij", gB, np.conj(Bc))
        gM = -RH @ gR @ RH                                            # M = I − ΔA/2
        gAm_direct = 0.5 * dt[:, None, None] * np.einsum("hji,hjk->hik", np.conj(R), gA)   # from I + ΔA/2
        gAm = gAm_direct - 0.5 * dt[:, None, None] * gM
        gL = np.einsum("hii->hi", gAm)
        gP = -np.einsum("hij,hj->hi", gAm, Qc)                       # A = ... − P Q*
        gQ = -np.einsum("hji,hj->hi", np.conj(gAm), Pc)
        gdt = (np.einsum("hij,hij->h", np.conj(gM), -0.5 * Am)
               + np.einsum("hij,hij->h", np.conj(np.einsum("hji,hjk->hik", np.conj(R), gA)), 0.5 * Am)).real \
            + (np.conj(np.einsum("hij,hj->hi", R, Bc)) * gB).real.sum(-1)
        pair = lambda z: np.stack([z.real, z.imag], -1)
        return [du, gdt * dt, pair(gL), pair(dt[:, None] * np.einsum("hji,hj->hi", np.conj(R), gB)), pair(gC),
                (u * gy).sum((0, 1)) if D is not None else None, pair(g) if x0 is not None else None,
                pair(gP), pair(gQ)]

    return [y, final], back


def s4_case(Bn, T, H, N2, with_d, with_x0, attrs, log_dt_range=(-2.5, 0.0), low_rank=False):
    A = np.stack([-rng.uniform(0.2, 1.5, size=(H, N2)), rng.uniform(-3, 3, size=(H, N2))], -1)
    xs = [randn(Bn, T, H), rng.uniform(*log_dt_range, size=H), A, randn(H, N2, 2), randn(H, N2, 2),
          randn(H) if with_d else None, randn(Bn, H, N2, 2) if with_x0 else None,
          0.3 * randn(H, N2, 2) if low_rank else None, 0.3 * randn(H, N2, 2) if low_rank else None]
    return Case(xs, s4_ref, attrs)


CASES = {
    "s4": lambda: [
        s4_case(2, 9, 3, 2, True, True, {"form": "convolution", "discretisation": "zoh"}),
        s4_case(2, 9, 3, 2, True, True, {"form": "recurrent", "discretisation": "zoh"}),
        s4_case(1, 7, 2, 3, False, True, {"form": "convolution", "discretisation": "bilinear"}),
        s4_case(2, 5, 1, 2, True, False, {"form": "recurrent", "discretisation": "bilinear"}),
        s4_case(2, 1, 3, 2, True, True, {"form": "recurrent", "discretisation": "zoh"}),         # one decode step
        s4_case(1, 6, 2, 2, True, True, {"form": "convolution", "discretisation": "zoh"}, (-9.2, -9.0)),  # Δ ≈ 1e-4
        s4_case(1, 6, 2, 2, True, True, {"form": "recurrent", "discretisation": "bilinear"}, (2.2, 2.3)),  # Δ ≈ 10
        # the diagonal-plus-low-rank form (P, Q given)
        s4_case(2, 8, 2, 3, True, True, {"form": "convolution", "discretisation": "bilinear"}, low_rank=True),
        s4_case(2, 8, 2, 3, True, True, {"form": "recurrent", "discretisation": "bilinear"}, low_rank=True),
        s4_case(1, 5, 3, 2, False, False, {"form": "recurrent", "discretisation": "bilinear"}, low_rank=True),
    ],
}
