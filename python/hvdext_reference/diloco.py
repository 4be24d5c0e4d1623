"""DiLoCo's outer step: the definition, and the test oracle.

DiLoCo (Douillard, Feng, Rusu, Chhaparwal, Donchev, Kuncoro, Ranzato, Szlam, Shen; "DiLoCo: Distributed
Low-Communication Training of Language Models", arXiv 2311.08105, 2023). M workers hold the same outer parameters
theta and outer momentum b. A round: every worker m starts from theta_m = theta, takes H steps of its own inner
optimizer (AdamW in the paper; its state is kept across rounds), then

    Delta_m  = theta - theta_m                              the pseudo-gradient (outer minus local)
    Delta    = mean_m Delta_m                               one allreduce (Average) per round
    b        = Delta                  (first round)         SGD's momentum buffer, dampening 0
             = mu * b + Delta         (later rounds)
    theta    = theta - eta * (Delta + mu * b)               Nesterov (nesterov=False: theta - eta * b)
    theta_m  = theta                                        every worker continues from the outer parameters

with eta = 0.7, mu = 0.9 (the paper's and OpenDiLoCo's setting). eta = 1, mu = 0 is model averaging: theta becomes
mean_m theta_m.

Compressed pseudo-gradients with error feedback (INTELLECT-1 sends them as int8, SparseLoCo as top-k; error
feedback as in Seide et al. 2014, Stich et al. 2018), per worker m with residual e_m (initially 0):

    x_m      = Delta_m + e_m
    sent_m   = what C(x_m) stands for                       (the codec's decoded value of m's own payload)
    e_m      = x_m - sent_m
    Delta    = (sent_0 + sent_1 + ... + sent_{M-1}) / M     summed in worker order, then divided

so nothing the codec drops is lost, only delayed: sum over rounds of sent_m + e_m = sum over rounds of Delta_m.

Streaming DiLoCo (Douillard, Donchev, Rush, Kale, Rusu, ...; "Streaming DiLoCo with overlapping communication",
arXiv 2501.18512, 2025) cuts the parameters into P fragments (whole layers, strided: layer j in fragment j mod P)
that synchronize in turn: with the window w = H / P, after inner step t with t % w == 0 fragment f = (t / w - 1)
mod P computes its pseudo-gradient from the workers' parameters at t and starts its exchange; tau = overlap steps
later (0 <= tau < w, the workers keep training meanwhile) the outer step above is applied to f's outer parameters
and momentum (each fragment's momentum starts at its own first round), and each worker's fragment becomes

    theta_m[f] = alpha * theta_m[f] + (1 - alpha) * theta[f]      (alpha = merge_alpha; 0: theta[f] itself)

Each fragment has its own residuals. P = 1, tau = 0 is DiLoCo.

The leader as the outer step (outer="leader", after LSGD: Teng et al., "Leader Stochastic Gradient Descent for
Distributed Training of Deep Learning Models", NeurIPS 2019): at each exchange the worker b with the lowest running
training loss since the last exchange (ties to the lowest index) sends its own pseudo-gradient, and only it:

    Delta = sent_b      (x_b = Delta_b + e_b through the codec; e_b = x_b - sent_b; every other e_m unchanged)

and the outer step above moves theta along it: the workers are pulled toward the best one's progress instead of
the average's.

Every operation is float32 and one rounding each, in the order written (mu * b is rounded before the add; eta times
the step is rounded before the subtraction): the framework implementations compute the same operations, not a
fused multiply-add, so that their bits equal these.
"""
import numpy as np

F32 = np.float32


def pseudo_gradient(outer, local):
    """Delta_m = theta - theta_m, float32."""
    return np.asarray(outer, dtype=F32) - np.asarray(local, dtype=F32)


def mean_of_sent(sent):
    """(sent_0 + ... + sent_{M-1}) / M in float32, summed in worker order (the decoders' order)."""
    total = np.zeros_like(np.asarray(sent[0], dtype=F32))
    for values in sent:
        total = total + np.asarray(values, dtype=F32)
    return total / F32(len(sent))


def compressed_mean(deltas, residuals, sent_of=None):
    """(Delta, new residuals): each worker's x_m = Delta_m + e_m through sent_of(x_m, m) (what worker m's payload
    stands for; None: sent uncompressed, no residual), averaged by mean_of_sent."""
    if sent_of is None:
        return mean_of_sent(deltas), [np.zeros_like(np.asarray(d, dtype=F32)) for d in deltas]
    sent, kept = [], []
    for m, (delta, residual) in enumerate(zip(deltas, residuals)):
        x = np.asarray(delta, dtype=F32) + np.asarray(residual, dtype=F32)
        s = np.asarray(sent_of(x, m), dtype=F32)
        sent.append(s)
        kept.append(x - s)
    return mean_of_sent(sent), kept


def leader_of(losses):
    """The worker with the lowest loss, ties to the lowest index."""
    return min(range(len(losses)), key=lambda m: (losses[m], m))


def leader_sent(deltas, residuals, losses, sent_of=None):
    """(Delta, new residuals) of outer="leader": the best worker's x_b = Delta_b + e_b through sent_of (None: sent
    uncompressed), the others' residuals unchanged."""
    best = leader_of(losses)
    residuals = [np.asarray(r, dtype=F32).copy() for r in residuals]
    x = np.asarray(deltas[best], dtype=F32) + residuals[best]
    sent = x if sent_of is None else np.asarray(sent_of(x, best), dtype=F32)
    residuals[best] = x - sent
    return sent.copy(), residuals


def outer_step(outer, momentum, delta, lr=0.7, mu=0.9, nesterov=True):
    """(theta, b) after one outer SGD step on the averaged pseudo-gradient `delta`; momentum None: the first round
    (b = Delta). mu = 0 is plain SGD (b is then Delta every round)."""
    outer, delta = np.asarray(outer, dtype=F32), np.asarray(delta, dtype=F32)
    lr, mu = F32(lr), F32(mu)
    b = delta.copy() if momentum is None else (mu * np.asarray(momentum, dtype=F32)) + delta
    step = delta + (mu * b) if nesterov else b
    return outer - (lr * step), b


def outer_round(outer, momentum, locals_, residuals=None, sent_of=None, lr=0.7, mu=0.9, nesterov=True):
    """One DiLoCo round from the workers' parameters after their H inner steps: (theta, b, residuals). residuals
    None: zeros (the first round)."""
    deltas = [pseudo_gradient(outer, local) for local in locals_]
    if residuals is None:
        residuals = [np.zeros_like(d) for d in deltas]
    delta, residuals = compressed_mean(deltas, residuals, sent_of)
    theta, b = outer_step(outer, momentum, delta, lr, mu, nesterov)
    return theta, b, residuals


def train(theta0, inner_update, workers, rounds, inner_steps, sent_of=None, lr=0.7, mu=0.9, nesterov=True):
    """A whole DiLoCo run of `rounds` rounds: inner_update(params, m, step) -> params is worker m's inner step
    (its optimizer's state is the callable's own). Returns (theta, b, residuals, the workers' parameters before
    each round's exchange)."""
    theta, b, residuals, history = np.asarray(theta0, dtype=F32), None, None, []
    step = 0
    for _ in range(rounds):
        locals_ = [theta.copy() for _ in range(workers)]
        for _ in range(inner_steps):
            step += 1
            locals_ = [inner_update(x, m, step) for m, x in enumerate(locals_)]
        history.append([x.copy() for x in locals_])
        theta, b, residuals = outer_round(theta, b, locals_, residuals, sent_of, lr, mu, nesterov)
    return theta, b, residuals, history


def fragment_starts(step, inner_steps, fragments):
    """The fragment whose exchange starts after inner step `step` (counted from 1), or None."""
    window = inner_steps // fragments
    if step <= 0 or step % window:
        return None
    return (step // window - 1) % fragments


def merge(local, outer, alpha):
    """alpha * theta_m + (1 - alpha) * theta, each product rounded to float32 before the add; alpha = 0: theta."""
    if alpha == 0:
        return np.asarray(outer, dtype=F32).copy()
    return (F32(alpha) * np.asarray(local, dtype=F32)) + (F32(1.0 - alpha) * np.asarray(outer, dtype=F32))


def train_streaming(theta0, inner_update, workers, steps, inner_steps, fragments, overlap=0, merge_alpha=0.0,
                    sent_of=None, lr=0.7, mu=0.9, nesterov=True, losses_of=None):
    """A Streaming DiLoCo run of `steps` inner steps over flat parameters; fragments: index arrays into them (one per
    fragment). losses_of(locals_, step) -> each worker's training loss since the last exchange: outer="leader"
    (None: the average). Returns (theta, b, the workers' parameters, history): history[k] = (step, fragment, the
    workers' fragment values at the start of the k-th exchange)."""
    theta = np.asarray(theta0, dtype=F32).copy()
    b = np.zeros_like(theta)
    started = [False] * len(fragments)
    residuals = [[np.zeros(len(idx), F32) for idx in fragments] for _ in range(workers)]
    locals_ = [theta.copy() for _ in range(workers)]
    pending, history = {}, []
    for step in range(1, steps + 1):
        locals_ = [inner_update(x, m, step) for m, x in enumerate(locals_)]
        f = fragment_starts(step, inner_steps, len(fragments))
        if f is not None:
            idx = fragments[f]
            deltas = [pseudo_gradient(theta[idx], x[idx]) for x in locals_]
            history.append((step, f, [x[idx].copy() for x in locals_]))
            own = [residuals[m][f] for m in range(workers)]
            if losses_of is None:
                delta, kept = compressed_mean(deltas, own, sent_of)
            else:
                delta, kept = leader_sent(deltas, own, losses_of(locals_, step), sent_of)
            for m in range(workers):
                residuals[m][f] = kept[m]
            pending[step + overlap] = (f, delta)
        if step in pending:
            f, delta = pending.pop(step)
            idx = fragments[f]
            theta[idx], b[idx] = outer_step(theta[idx], b[idx] if started[f] else None, delta, lr, mu, nesterov)
            started[f] = True
            for x in locals_:
                x[idx] = merge(x[idx], theta[idx], merge_alpha)
    return theta, b, locals_, history


def tensor_key(name):
    """The tensor's 32-bit key in the ternary draws' counter (seed, step, tensor, rank): crc32 of its name."""
    import zlib
    return zlib.crc32(name.encode("utf-8")) & 0xFFFFFFFF


def ternary_payload(x, seed, step, name, rank, clip=2.5):
    """(scale, codes) of Compression.ternary's payload of one tensor x (float32, flat) as rank `rank` encodes it at
    exchange `step` (python/hvdext_reference/terngrad.py): t = float32(clip * sigma(x)), s = min(max|x|, t), code
    k non-zero with probability min(|x_k|, t) / s under the counter-based uniform of key (seed, step,
    crc32(name), rank). What it stands for, s * v with v in {-1, 0, 1}, is exact in float32."""
    from . import terngrad
    x = np.asarray(x, dtype=F32).reshape(-1)
    threshold, scale = terngrad.local_scale(x, clip)
    return scale, terngrad.ternarize_codes(x, threshold, scale, seed, step, tensor_key(name), rank)


def ternary_sent(x, seed, step, name, rank, clip=2.5):
    """sent = s * v of ternary_payload (float32), and the payload's bytes ("entropy" packing, the host's)."""
    from . import terngrad
    scale, codes = ternary_payload(x, seed, step, name, rank, clip)
    sent = F32(scale) * terngrad.codes_to_values(codes).astype(F32)
    return sent, int(terngrad.entropy_payload(codes, scale).size)


def ternary_mean(deltas, residuals, names, seed, step, clip=2.5, min_size=1024, ranks=None):
    """(Delta per tensor, new residuals) of Compression.ternary(error_feedback=True) averaging the workers'
    pseudo-gradients tensor by tensor; deltas[m][j], residuals[m][j]: worker m's (rank ranks[m], default m) tensor j,
    named names[j]. A tensor of at least min_size elements: x_m = Delta_m + e_m, worker m's payload of x_m at
    `step` (ternary_payload), e_m = x_m - s_m v_m, and Delta = the decode of the M payloads in worker order
    (terngrad.average_values: float32(sum_m v_m) * s / M when every scale is the same, else
    (((s_0 v_0) + s_1 v_1) + ...) / M). A smaller tensor is sent as it is (Delta_m, its residual stays 0) and
    averaged as mean_of_sent does."""
    from . import terngrad
    ranks = list(range(len(deltas))) if ranks is None else list(ranks)
    out, kept = [], [[None] * len(names) for _ in deltas]
    for j, name in enumerate(names):
        xs = [np.asarray(d[j], dtype=F32).reshape(-1) + np.asarray(r[j], dtype=F32).reshape(-1)
              for d, r in zip(deltas, residuals)]
        if xs[0].size < min_size:
            out.append(mean_of_sent([np.asarray(d[j], dtype=F32).reshape(-1) for d in deltas]))
            for m in range(len(deltas)):
                kept[m][j] = np.zeros_like(xs[m])
            continue
        parts = []
        for m, x in enumerate(xs):
            scale, codes = ternary_payload(x, seed, step, name, ranks[m], clip)
            values = terngrad.codes_to_values(codes)
            parts.append((scale, values))
            kept[m][j] = x - F32(scale) * values.astype(F32)
        out.append(terngrad.average_values(parts, xs[0].size, len(xs)))
    return out, kept


def topk_mean(deltas, residuals, ratio, value_dtype="fp16"):
    """(Delta per tensor, new residuals) of Compression.topk(ratio, error_feedback=True) averaging the workers'
    pseudo-gradients tensor by tensor (deltas[m][j], residuals[m][j] as in ternary_mean): worker m sends the
    k = max(1, ceil(n / (1 / ratio))) entries of largest |x_m| of x_m = Delta_m + e_m, in value_dtype
    (topk.ef_step; e_m keeps the rest and the values' rounding), and Delta = (the M payloads scatter-added in worker
    order) / M."""
    from . import topk
    out, kept = [], [[None] * len(deltas[0]) for _ in deltas]
    for j in range(len(deltas[0])):
        n = np.asarray(deltas[0][j]).size
        k = max(1, min(n, int(np.ceil(n / (1.0 / ratio)))))
        total = np.zeros(n, dtype=F32)
        for m, (d, r) in enumerate(zip(deltas, residuals)):
            idx, values, kept[m][j] = topk.ef_step(np.asarray(d[j], F32).reshape(-1),
                                                   np.asarray(r[j], F32).reshape(-1), k, value_dtype)
            np.add.at(total, idx, values.astype(F32))
        out.append(total / F32(len(deltas)))
    return out, kept


def joined_mean(xs, size):
    """The average while some workers have called hvd.join(): the dense values x of the workers still training
    (with error feedback x = Delta_m + e_m, after which e_m = 0), summed in worker order with the joined workers'
    zeros and divided by the job's `size` workers (Horovod's join)."""
    total = np.zeros_like(np.asarray(xs[0], dtype=F32))
    for x in xs:
        total = total + np.asarray(x, dtype=F32)
    return total / F32(size)
