"""A training run's lifecycle, written once for PyTorch and TensorFlow: what lives longer than one step.

``TrainingRun`` owns, for one DistributedOptimizer (PyTorch) or gradient aggregator (TensorFlow):

- **agreement**: before the first collective, and again after a checkpoint was loaded or an elastic reset, the ranks
  exchange their settings (consistency.py: two small allgathers) and raise SettingsMismatchError on every rank if
  they differ; the same exchange carries the seed proposal, the reset generation (generation.py) and the shared
  state of a loaded checkpoint (resume.py);
- **the seed**: the compressor's ``seed=`` if given, else rank 0's proposal (consistency.seed_proposal: the
  script's own seed, so a seeded script repeats itself), kept across checkpoints and resets;
- **the method** (registry.py, through the step driver, driver.py): made once the settings are agreed, made again
  for the new membership after an elastic reset, over the adapter's step context (context.py), which lives as
  long as the run;
- **the method's state**: the shared part (``Method.shared_state``: GraVAC's controller, sparse_reduce's regions)
  and this rank's error-feedback residuals, taken from a checkpoint or carried across a reset and handed to the
  method once it exists; ``state_dict`` / load and the statistics' observations.

The step counter and the seed are held by the adapter's ``counters`` (``HostCounters`` here for PyTorch; TensorFlow
holds them in tf.Variables, which its checkpoints and graphs read): an object with ``step`` and ``seed`` attributes
(``seed`` None until agreed). The adapters keep Horovod's API and the framework's hooks; they reach the method only
through this object and the step driver.
"""
from . import generation
from .consistency import SettingsMismatchError, exchange, seed_proposal
from .driver import StepDriver
from .resume import adopted_offer, residuals_for, split_checkpoint


class HostCounters:
    """The step counter and the seed as Python integers (PyTorch)."""

    def __init__(self):
        self.step, self.seed = 0, None


class TrainingRun:
    """One compressor's run across steps, checkpoints and elastic resets; see the module docstring.

    ``offer``: the shared part of a loaded checkpoint (step, seed, statistics, method), offered to every rank at the
    next agreement; ``residuals``: this rank's residuals waiting for the method (from a checkpoint, or carried
    across a reset); ``method_state``: the method's shared state waiting for the method."""

    def __init__(self, compression, context, counters, tag, script_seed, what="horovod_ext DistributedOptimizer"):
        self.compression, self.counters, self.tag, self.what = compression, counters, tag, what
        self.context, self.stats = context, context.stats  # the steps' context (context.py) and its statistics
        self.script_seed = script_seed  # () -> the seed the script gave its framework, or None (unseeded)
        self.driver = None
        self.agreement = None  # None: to agree; True: agreed; an exception: raised again at every step
        self.offer = None
        self.residuals = None
        self.method_state = None

    # ------------------------------------------------------------------------------------------------ agreement
    @property
    def agreed(self):
        return self.agreement is True

    def agree(self, settings, allgather_blobs, backend, sizes, buckets=None):
        """Exchange settings (raise SettingsMismatchError on every rank if they differ); take the agreed generation,
        the offer of the lowest rank that loaded a checkpoint, and (unless already set) the seed; make the method
        for `backend` over tensors of `sizes` elements if there is none (their collectives fused by the
        buckets.BucketPlan `buckets`, if given), and hand it what waits for it."""
        if self.agreement is True:
            return
        if isinstance(self.agreement, Exception):
            raise self.agreement
        local = {"seed": seed_proposal(self.script_seed()), "offer": self.offer,
                 "generation": generation.proposal()}
        try:
            proposals = exchange(settings, local, allgather_blobs, self.what)
        except SettingsMismatchError as exc:
            self.agreement = exc
            raise
        backend.generation = generation.agreed([p["generation"] for p in proposals])
        offer = adopted_offer([p["offer"] for p in proposals])
        if offer is not None:
            self.adopt(offer)
        if self.counters.seed is None:
            given = getattr(self.compression, "seed", None)
            self.counters.seed = given if given is not None else proposals[0]["seed"]
        if self.driver is None:
            self.driver = StepDriver(self.compression, backend, self.context, sizes, self.tag, buckets)
        method = self.driver.method
        if offer is not None:
            method.load_shared_state(offer.get("method"))
        if self.residuals is not None:
            method.load_state(backend, self.residuals)
            self.residuals = None
        self.offer = None
        self.agreement = True

    def agree_again(self):
        """Re-agree at the next step (a checkpoint was loaded, or rank 0's state was broadcast)."""
        if self.agreement is True:
            self.agreement = None

    # ------------------------------------------------------------------------------------------- shared state
    def shared_state(self):
        """What every rank holds alike: a loaded checkpoint's until the next agreement has adopted it, else this
        rank's (step, seed, statistics, the method's shared state)."""
        if self.offer is not None:
            return dict(self.offer)
        method = self.driver.method.shared_state() if self.driver is not None else self.method_state
        return {"step": self.counters.step, "seed": self.counters.seed, "stats": self.stats.state(),
                "method": method}

    def adopt(self, shared):
        """Take on a checkpoint's (or rank 0's) shared state; offered again at the next agreement."""
        self.counters.step = int(shared["step"])
        if shared.get("seed") is not None:
            self.counters.seed = int(shared["seed"])
        if shared.get("stats") is not None:
            self.stats.load_state(shared["stats"])
        self.method_state = shared.get("method")

    def offer_shared(self, shared):
        """`shared` becomes this rank's (adopt) and its offer at the next agreement."""
        self.adopt(shared)
        self.offer = shared
        self.agree_again()

    # -------------------------------------------------------------------------------------- per-rank residuals
    def own_residuals(self):
        """This rank's residuals: the method's, or those still waiting for it."""
        if self.driver is not None:
            return self.driver.method.state(self.driver.be)
        return self.residuals or {}

    def state_dict(self, rank, size):
        """horovod_ext's entry of a checkpoint: the shared part and this rank's residuals (resume.py)."""
        state = self.shared_state()
        state.update(rank=rank, size=size, residuals=self.own_residuals())
        return state

    def load_state_dict(self, ours, rank, size):
        """Load horovod_ext's entry of a checkpoint: the shared part is offered at the next agreement; this rank's
        residuals wait for the method. Returns the checkpoint's (rank, size) when it holds another rank's residuals,
        which this rank cannot take (it starts from zero residuals), else None."""
        shared, per_rank = split_checkpoint(ours)
        self.residuals = residuals_for(per_rank, rank, size)
        if self.residuals is None and self.driver is not None:
            # the checkpoint holds no residuals of this rank: it starts from zero ones, not from those it has now
            # (an elastic rollback to a commit made before a tensor first kept any)
            self.driver.method.codec.reset_all(self.driver.be)
        self.offer_shared(shared)
        if per_rank["residuals"] and self.residuals is None:
            return per_rank["rank"], per_rank["size"]
        return None

    # ------------------------------------------------------------------------------------------ within a step
    def abandon_step(self):
        """Launched gradients were dropped before finish() (a checkpoint was loaded)."""
        if self.driver is not None:
            self.driver.abandon_step()

    def complete_in_flight(self):
        """Take in what the last step left in flight (GraVAC's readings) before this rank calls hvd.join()."""
        if self.driver is not None:
            self.driver.method.complete_in_flight()

    def forget_in_flight(self):
        """Drop every collective in flight without waiting (Horovod failed under them, or is being reset)."""
        if self.driver is not None:
            self.driver.forget_in_flight()

    def observations(self):
        """What compression_stats() adds for the method (GraVAC: its controller's log and table)."""
        return self.driver.method.observations() if self.driver is not None else {}

    # ---------------------------------------------------------------------------------------- elastic training
    def elastic_reset(self, keep_shared=True):
        """After Horovod's elastic reset (shutdown and init, perhaps with another N): the method is made again for
        the new membership at the next agreement, from this rank's state: its residuals are carried to the new
        method whatever its new rank number, and (keep_shared) its shared part is offered at that agreement.
        Everything sized by N is made again there (the divisor, the transport's plan, GraVAC's EWMA weight,
        sparse_reduce's regions). The adapter makes the new backend."""
        self.forget_in_flight()
        if keep_shared and self.offer is None:
            self.offer = self.shared_state()
        if self.driver is not None:
            if self.residuals is None:
                self.residuals = self.driver.method.state(self.driver.be)
            self.driver = None
        self.agreement = None
