"""PowerSGD (Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019), Algorithm 1 with error feedback and warm start, as PyTorch's DDP hook runs it
(torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py): the definition horovod_ext's method is tested
against (horovod_ext/compressors/powersgd.py).

A tensor of shape (n, ...) is the n x m matrix M, m = numel / n; r = min(n, m, rank). Per step, on rank i:

    M_i = g_i + e_i                                   (error feedback; M_i = g_i without)
    Q   = orth(Q_prev)  (warm start)  or  orth(Z)     (Z: m x r standard normals, the same on every rank)
    P   = sum_i M_i Q                                 (allreduce, Sum)
    P   = orth(P)
    Q   = (1/N) sum_i M_i^T P                         (allreduce, Average)
    A   = P Q^T                                       (the update every rank applies: a rank-r approximation of
                                                       the mean of the M_i, A = P P^T mean(M_i))
    e_i = M_i - A,  Q_prev = Q

orth is Gram-Schmidt over the columns: q_j = v_j / max(|v_j|, FLT_MIN) after subtracting the projections on
q_1 .. q_{j-1} (a zero column stays zero), with v_j first scaled by the power of two that brings max|v_j| to
[1, 2) (exact, so the result is the unscaled formula's wherever |v_j|^2 does not underflow; where it would, as for
the gradients of a deep net's first layers, below about 1e-19, the norm is still exact instead of 0 or subnormal,
which divided by FLT_MIN gave entries up to 1e19). A tensor goes dense by allreduce (no residual) unless
(n + m) r * min_compression_rate < n m; every tensor goes dense before step start_iter.
Float32 throughout; the factors travel in float32 or float16 (value_dtype).
"""
import numpy as np

from .philox import normal

FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def layout(shape, rank, min_compression_rate):
    """(n, m, r) of a tensor compressed as a matrix, or None where it goes dense (the hook's _should_compress)."""
    if len(shape) == 0:
        return None
    n = int(shape[0])
    m = int(np.prod(shape)) // n if n else 0
    r = min(n, m, rank)
    if r == 0 or not (n + m) * r * min_compression_rate < n * m:
        return None
    return n, m, r


def power_of_two_scale(amax):
    """2^(127 - b), b the biased exponent of the float32 amax, clamped to [2^-126, 2^127]: amax times it is in [1, 2)
    for a normal amax (a zero or subnormal one is scaled by 2^127, an amax >= 2^127 by 2^-126)."""
    biased = (np.asarray(amax, dtype=np.float32).view(np.int32) >> 23) & 0xFF
    return (np.clip(254 - biased, 1, 254).astype(np.int32) << 23).view(np.float32)


def orthogonalize(matrix, method="gram_schmidt"):
    """Gram-Schmidt over the columns of an n x r float32 matrix (a new array); method "qr": the Q of NumPy's reduced
    QR (its columns' signs may differ from another library's: P Q^T does not depend on them)."""
    if method == "qr":
        return np.linalg.qr(np.asarray(matrix, dtype=np.float64))[0].astype(np.float32)
    out = np.array(matrix, dtype=np.float32)
    for j in range(out.shape[1]):
        col = out[:, j]
        col *= power_of_two_scale(np.max(np.abs(col)))
        col /= np.maximum(np.float32(np.sqrt(np.sum(col * col, dtype=np.float32))), FLT_MIN)
        if j + 1 < out.shape[1]:
            rest = out[:, j + 1:]
            rest -= np.sum(col[:, None] * rest, axis=0, keepdims=True, dtype=np.float32) * col[:, None]
    return out


def wire(x, value_dtype):
    """What a factor is after its trip on the wire (its values rounded to float16 for value_dtype="fp16")."""
    return x.astype(np.float16).astype(np.float32) if value_dtype == "fp16" else x


class PowerSGD:
    """The state of a job of N ranks (every rank's residuals and the shared Q) and its step."""

    def __init__(self, nranks, rank=4, start_iter=10, min_compression_rate=2.0, error_feedback=True, warm_start=True,
                 value_dtype="fp32", seed=0, orthogonalization="gram_schmidt"):
        self.nranks, self.rank, self.start_iter = nranks, rank, start_iter
        self.min_compression_rate, self.error_feedback, self.warm_start = min_compression_rate, error_feedback, \
            warm_start
        self.value_dtype, self.seed, self.orthogonalization = value_dtype, seed, orthogonalization
        self.residuals = [{} for _ in range(nranks)]
        self.q = {}

    def step(self, step, grads, keys):
        """grads[i][t]: rank i's gradient of tensor t (any shape); keys[t]: its 32-bit random key. Returns the
        update every rank applies, per tensor (float32, the tensor's shape): the mean for dense tensors."""
        out = []
        for t, key in enumerate(keys):
            shape = grads[0][t].shape
            mats = [np.asarray(g[t], dtype=np.float32) for g in grads]
            lay = layout(shape, self.rank, self.min_compression_rate)
            if lay is None or step < self.start_iter:
                out.append((np.sum(mats, axis=0, dtype=np.float32) / np.float32(self.nranks)).astype(np.float32))
                continue
            n, m, r = lay
            ms = [x.reshape(n, m) for x in mats]
            if self.error_feedback:
                ms = [x + self.residuals[i].get(key, np.zeros((n, m), np.float32)) for i, x in enumerate(ms)]
            q = self.q.get(key) if self.warm_start else None
            if q is None:
                q = normal(m * r, self.seed, step, key).reshape(m, r)
            q = orthogonalize(q, self.orthogonalization)
            p = orthogonalize(wire(sum(wire(x @ q, self.value_dtype) for x in ms), self.value_dtype),
                              self.orthogonalization)
            q = wire(sum(wire(x.T @ p, self.value_dtype) for x in ms) / np.float32(self.nranks), self.value_dtype)
            approx = (p @ q.T).astype(np.float32)
            if self.error_feedback:
                for i, x in enumerate(ms):
                    self.residuals[i][key] = x - approx
            if self.warm_start:
                self.q[key] = q
            out.append(approx.reshape(shape))
        return out
