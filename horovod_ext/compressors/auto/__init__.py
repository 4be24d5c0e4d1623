"""Compression.auto, declared once: each tensor's method, its parameter and its transport chosen online, by the least
predicted step time among the candidates whose accuracy guard holds (choice.py has the step model, the guard
and the solver; docs/compressors.md, "Compression.auto", the user's view).

How a run goes (AutoMethod, over the backend contract, for PyTorch and TensorFlow alike):

- **The deciding step** (the first step, and the first after an elastic reset): every gradient waits until the
  step's last one is ready. Then a probe of this job's own collectives (an allreduce and an allgather of float32
  slices of the largest gradient, 4 KB upwards, x4 a size, 3 times each, up to the largest gradient or until the
  next size is predicted to take the probe past ``probe_seconds``; each size's time is the slowest rank's) fits
  the link's latency and seconds per byte per collective kind (choice.Link); each candidate is run on each gradient
  (encode, the N payloads' decode, what it sends) for its kernel seconds, payload bytes and gain; the ranks
  average what they measured (one allreduce), rank 0 takes the decision and every rank takes rank 0's (one
  allreduce in which the other ranks send zeros: exact). The step is then sent as decided. Nothing large is ever
  sent dense to learn what to send: the probe stops at probe_seconds.
- **Later steps**: each gradient is sent by its candidate's own method (registry.method_for: the same plan, bytes
  and error feedback as the static compressor) as soon as it is ready. Measurement continues at a cost of at most
  ``measure_share`` of the step: each step some (tensor, candidate) pairs are measured again on g + r, round
  robin, the chosen candidates first; the step's own time, compute and overlap (the seconds between its first and
  last gradient, less the kernels run in between) are read from the step.
- **At each window's end** the ranks average the window's measurements (one allreduce), rank 0 decides again
  (choice.decide: a tensor whose candidate's gain fell below epsilon moves to the nearest denser candidate
  that keeps it; the optimum replaces the current choice only where it is predicted ``margin`` faster), and every
  rank takes rank 0's decision from the next step. Rank 0 prints one line when the choice changes. Each window
  also times the choice in force; timed steps overrule predicted ones, and the two best uniform choices (by
  prediction) are each tried for one window after the first (choice.decide_measured).

A tensor that moves keeps its error-feedback residual: into the new candidate's where that one keeps residuals,
else sent once with the tensor's next gradient (dense, g + r, after which r = 0). Every candidate may take every
tensor (min_size 0): a payload candidate sends a tensor below its own min_size dense in its own allreduce, as the
static compressor does (ternary's biases and norms), so that each candidate on every tensor is exactly that static
method, one collective round per step; tensors with fewer than auto's min_size elements choose between "none" and
"fp16" only. The state every rank holds alike (the choice, the averaged measurements, the link, the
window's position) is the method's shared state: a checkpoint resumes the choice where it was; an elastic reset
(another number of ranks) measures the link again and decides again at the next step.

The candidates and their defaults:
- "none" (float32 by allreduce: always qualifies), "fp16" (Horovod's, by allreduce);
- Compression.ternary (its defaults; by allgather), Compression.topk at ratios 0.1 and 0.01 (by allgather; error
  feedback), Compression.powersgd(rank=4, start_iter=0) (two allreduces of its factors; a matrix that does not
  compress goes dense, as its own method sends it).
Payload compressors given as specs keep their settings; "auto" transports become "allgather" (the step model prices
a tensor's bytes on one collective; sparse_reduce and two-phase plan a step over a fixed set of tensors).
adaptive_topk is refused: auto's guard already adapts top-k's ratio per tensor.
"""
from horovod_ext.compression.specs import CompressorSpec, check_int, check_real
from ..powersgd import PowerSGD
from ..ternary import Ternary
from ..topk import TopK
from .measure import LINEAR, candidate_name
from .method import AutoMethod


def default_candidates():
    return ("none", "fp16", Ternary(), TopK(ratio=0.1), TopK(ratio=0.01), PowerSGD(rank=4, start_iter=0))


def _registered():
    from horovod_ext.compression.registry import payload_compressors
    return payload_compressors()


def check_candidate(candidate):
    """A candidate as auto keeps it: "none", "fp16", or a payload compressor's spec ("auto" transports made
    "allgather"); a registered name stands for that compressor's defaults."""
    registered = _registered()
    allowed = list(LINEAR) + sorted(n for n in registered if n not in ("adaptive_topk", "auto"))
    if isinstance(candidate, str):
        if candidate in LINEAR:
            return candidate
        if candidate not in registered or candidate in ("adaptive_topk", "auto"):
            raise ValueError(f"auto candidates must be names among {allowed} or their Compression specs, "
                             f"got {candidate!r}")
        candidate = registered[candidate]
    name = getattr(candidate, "__name__", None)
    if name in ("NoneCompressor", "FP16Compressor"):  # Horovod's own classes, as hvd.Compression.none / fp16
        return "none" if name == "NoneCompressor" else "fp16"
    if not isinstance(candidate, CompressorSpec) or candidate.name in ("adaptive_topk", "auto"):
        raise ValueError(f"auto candidates must be names among {allowed} or their Compression specs, "
                         f"got {candidate!r}")
    if candidate.settings.get("transport") == "auto":
        candidate = type(candidate)(**dict(candidate.settings, transport="allgather"))
    if candidate.settings.get("transport") not in (None, "allgather"):
        raise ValueError(f"auto candidates send by allgather or allreduce: {candidate!r} has transport="
                         f"{candidate.settings['transport']!r}; give transport='allgather' or leave it 'auto'")
    return candidate


class Auto(CompressorSpec):
    """Compression.auto: per tensor, the candidate (method, parameter, transport) with the least predicted step time
    whose compression gain keeps epsilon; see horovod_ext.compressors.auto.

    Args:
        candidates: names ("none", "fp16", "ternary", "topk", "powersgd") or specs (Compression.topk(ratio=0.001));
            "none" is always among them (it is what a tensor falls back to). Default: none, fp16, ternary, top-k
            10% and 1%, PowerSGD rank 4.
        epsilon: the least gain, the cosine between g + r and what a candidate sends of it, averaged over a window,
            in (0, 1]. Default 0.4: between the gains top-k 1% keeps in force with error feedback on the digits MLP
            and CNN, where it needed more steps than top-k 10% or ternary to reach dense's accuracy, and the gains
            those two keep there; on the nplm and the 10.5M MLP every candidate but top-k 1% kept more than 0.4 on
            every tensor (benchmarks/RESULTS.md, section "Compression.auto's guard in force: the gains, epsilon 0.4,
            and time to the target").
        window: steps between decisions (>= 1); the first decision is taken at the first step.
        margin: how much faster (a fraction of the step) a new choice must be predicted to replace the current one,
            in [0, 1).
        min_size: tensors with fewer elements choose between "none" and "fp16" only (>= 0). Default 0: every
            candidate may take every tensor (a payload candidate's own min_size still sends smaller ones dense).
        measure_share: the share of the step's time spent measuring candidates after the first step, in (0, 1).
        probe_seconds: the most seconds the link's probe may take at the deciding step (> 0): it stops before a
            size predicted to take it past them.
    """

    name = "auto"
    payload = True
    method = AutoMethod
    encodes_alone = False  # its tensors go by several methods (see CompressorSpec)
    travels = "sends each tensor by the method it chose, some by allgather; Horovod's own DistributedOptimizer " \
              "would allreduce them"

    def __init__(self, candidates=None, epsilon=0.4, window=20, margin=0.05, min_size=0, measure_share=0.03,
                 probe_seconds=1.0):
        if candidates is None:
            candidates = default_candidates()
        if isinstance(candidates, (str, CompressorSpec)) or not hasattr(candidates, "__iter__"):
            raise ValueError(f"auto candidates must be a list of names or Compression specs, got {candidates!r}")
        kept = []
        for candidate in candidates:
            candidate = check_candidate(candidate)
            if candidate not in kept:
                kept.append(candidate)
        if not kept:
            raise ValueError("auto candidates must name at least one method, got an empty list")
        if "none" not in kept:
            kept.insert(0, "none")
        epsilon = check_real("auto epsilon", epsilon)
        if not 0.0 < epsilon <= 1.0:
            raise ValueError(f"auto epsilon must be in (0, 1], got {epsilon!r}")
        margin = check_real("auto margin", margin, low=0.0, low_open=False)
        if margin >= 1.0:
            raise ValueError(f"auto margin must be in [0, 1), got {margin!r}")
        share = check_real("auto measure_share", measure_share, low=0.0)
        if share >= 1.0:
            raise ValueError(f"auto measure_share must be in (0, 1), got {measure_share!r}")
        super().__init__(candidates=tuple(kept), epsilon=epsilon, window=check_int("auto window", window, low=1),
                         margin=margin, min_size=check_int("auto min_size", min_size, low=0), measure_share=share,
                         probe_seconds=check_real("auto probe_seconds", probe_seconds, low=0.0))

    def payload_bytes(self, shape):
        """None: a tensor's bytes are those of the candidate chosen for it at run time (each candidate's
        payload_bytes; AutoMethod prices them so)."""
        return None

    def for_device(self, device):
        """Each payload candidate's packing="auto" made concrete for `device`."""
        return type(self)(**dict(self._settings, candidates=tuple(
            c if isinstance(c, str) else c.for_device(device) for c in self.candidates)))

    def describe(self, include_seed=True):
        settings = dict(self._settings, candidates=[candidate_name(c) for c in self.candidates])
        return f"auto({', '.join(f'{k}={v!r}' for k, v in sorted(settings.items()))})"

    def __hash__(self):
        return hash(self.describe())

