"""DiLoCoOptimizer's PyTorch side for both PyTorch adapters, with no Horovod import: the outer loop around the
user's optimizer (its step is the inner step), the fragments' exchanges through the compression plan, outer="leader",
statistics and checkpoints (DiLoCo), over an adapter's collectives (collectives.py: Horovod's process sets and
handles, hvd.join and elastic resets; or torch.distributed's groups and work objects). The math is
consensus/diloco.py's (docs/optimizers.md)."""
import contextlib

import torch

from horovod_ext import __version__
from horovod_ext.compression import CompressionStats
from horovod_ext.compression.consistency import allgather_blobs, optimizer_settings
from horovod_ext.compression.context import StepContext
from horovod_ext.compression.lifecycle import HostCounters, TrainingRun
from horovod_ext.compression.specs import compression_name, describe_compression, resolved_for
from horovod_ext.consensus.accounting import account_dense_reference
from horovod_ext.consensus.agreement import build_on_every_rank
from horovod_ext.consensus import diloco_accounting as accounting
from horovod_ext.consensus.diloco import (NO_COMPRESSION, DiLoCoSettings, averaged_pseudo_gradient, elected,
                                          election_row, exchange, finish_exchange, fragments_of, launch_exchange,
                                          leader_transport, merged, outer_update)
from horovod_ext.compression.resume import split_checkpoint
from .tensors import timed_into
from .wrapping import StateInCheckpoint, trainable, wrap


class _LeaderTransfer:
    """outer="leader"'s exchange in flight: its items, the collective's handle and how it was sent."""

    def __init__(self, items, future, kind="dense"):
        self.items, self.future, self.kind = items, future, kind


def _packed(payloads):
    """One uint8 buffer: the payloads' byte counts (int64), then their bytes."""
    raw = [p.contiguous().reshape(-1).view(torch.uint8) for p in payloads]
    sizes = torch.tensor([r.numel() for r in raw], dtype=torch.int64, device=raw[0].device)
    return torch.cat([sizes.view(torch.uint8), *raw])


def _unpacked(buffer, count):
    """The `count` payloads of a _packed buffer, as uint8."""
    sizes = buffer[:8 * count].clone().view(torch.int64).tolist()
    return list(torch.split(buffer[8 * count:], sizes))


class DiLoCo(StateInCheckpoint):
    """The optimizer API around DiLoCo's outer loop (self._hx_comm: the adapter's Collectives); mixed in before the
    user's optimizer class, so super() reaches the user's optimizer (its step is the inner step)."""

    _hx_what = "DiLoCoOptimizer"

    def _hx_setup(self, named_parameters, arguments, compression, inner_compression):
        trainable(self, named_parameters)
        params = self._hx_params
        self._hx_arguments = arguments
        self._hx_stats, self._hx_inner_stats = CompressionStats(compression_name(compression)), \
            CompressionStats(compression_name(inner_compression))
        self._hx_compression = compression
        self._hx_inner_run = TrainingRun(inner_compression, StepContext(self._hx_inner_stats, timer=timed_into),
                                         HostCounters(), f"diloco{self._hx_id}.inner", torch.initial_seed,
                                         what=f"horovod_ext {self._hx_what} (inner steps)")
        self._hx_inner_described = describe_compression(inner_compression)
        self._hx_runs = None  # one exchange per fragment, made by _hx_build
        self._hx_build()
        self._hx_inner = 0  # inner steps taken
        self._hx_outer = None  # the outer parameters (float32), once the first step has taken rank 0's
        self._hx_momentum = [None] * len(params)  # the outer momentum b per tensor, after its fragment's first round
        self._hx_update_norm = None  # |theta_new - theta| of the last round (its fragment's)
        self._hx_rounds = 0  # fragment exchanges applied
        self._hx_pending = None  # the fragment exchange in flight (see _hx_launch)
        self._hx_peak_bytes = 0  # the most payload bytes one exchange sent
        self._hx_loss = [0.0, 0]  # outer="leader": this rank's training losses (sum, count) since the last election
        self._hx_elected = None  # outer="leader": the last elected worker's leader rank
        self._hx_lenient = False  # the first election after an elastic reset: a rank may have reported no loss
        self._hx_comm.track(self)

    def _hx_build(self):
        """The settings and the workers for the job's membership (collective: the arguments are checked on every
        rank, the groups become the adapter's groups); the backends of the outer exchange (over the leaders) and
        of the inner average (over this rank's worker)."""
        tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in zip(self._hx_names, self._hx_params)]
        compared = dict(self._hx_arguments, inner_compression=self._hx_inner_described)
        self._hx_settings = build_on_every_rank(
            lambda: DiLoCoSettings(size=self._hx_comm.size, inner_compressed=self._hx_inner_described != NO_COMPRESSION,
                                   compression=self._hx_compression, **self._hx_arguments),
            compared, tensors, self._hx_allgather_blobs, self._hx_comm.rank, self._hx_comm.size, self._hx_what)
        self._hx_fragments = fragments_of(self._hx_names, self._hx_settings.fragments)  # the same on every rank
        self._hx_group_set, leaders_set = self._hx_comm.worker_groups(self._hx_settings)
        if self._hx_runs is None:  # one exchange per fragment: its plan, step counter, seed and residuals
            self._hx_runs = [TrainingRun(self._hx_compression, StepContext(self._hx_stats, timer=timed_into),
                                         HostCounters(), f"diloco{self._hx_id}" + (f".f{f}" if f else ""),
                                         torch.initial_seed, what=f"horovod_ext {self._hx_what}")
                             for f in range(len(self._hx_fragments))]
        self._hx_backends = [self._hx_comm.backend(leaders_set, self._hx_stats) for _ in self._hx_runs]
        self._hx_inner_backend = None if self._hx_group_set is None else \
            self._hx_comm.backend(self._hx_group_set, self._hx_inner_stats)
        # this optimizer's own collective names, so that its exchange in flight never meets another optimizer's
        # collective of the same parameter name (a DistributedOptimizer's, another DiLoCoOptimizer's)
        for tag, backend in [*((f"f{f}", b) for f, b in enumerate(self._hx_backends)),
                             ("inner", self._hx_inner_backend)]:
            if backend is not None:
                backend.prefix = f"diloco{self._hx_id}.{tag}."

    def _hx_complete_in_flight(self):
        """Before this rank joins (horovod_ext.torch.join): the fragment exchange in flight is waited for and
        applied now (Horovod cannot finish an allgather once a rank has joined)."""
        if self._hx_pending is not None and self._hx_pending["items"] is not None:
            with torch.no_grad():
                self._hx_apply()

    def _hx_forget_in_flight(self):
        """Drop the collectives in flight without waiting (Horovod failed under them, or is being reset); the
        fragment exchange in flight is started again at the next step from its record, from its exchange's state
        before the launch."""
        for run in self._hx_runs:
            run.forget_in_flight()
        self._hx_inner_run.forget_in_flight()
        record = self._hx_pending
        if record is not None and record["items"] is not None:
            if record["before"] is not None:
                before = dict(record["before"], stats=None)  # the statistics are the optimizer's, as they are now
                self._hx_runs[record["fragment"]].load_state_dict(before, before["rank"], before["size"])
            record["items"] = record["deltas"] = None

    def _hx_elastic_reset(self):
        """After Horovod's elastic reset (horovod_ext.torch.elastic): the workers are made again for the new
        membership (collective: settings checked on every rank, groups made into process sets again), and every
        plan at its next step, from this rank's state (its residuals carried over; an exchange in flight from
        before its launch). The outer parameters, momentum and inner step count come back from the commit (restore)
        and then from rank 0 (sync)."""
        self._hx_forget_in_flight()
        self._hx_lenient = True
        for run in self._hx_runs:
            run.elastic_reset()
        self._hx_inner_run.elastic_reset()
        self._hx_build()

    def _hx_allgather_blobs(self, blob):
        return allgather_blobs(blob, self._hx_comm.numpy_allgather(None),
                               f"horovod_ext.{self._hx_what}.{self._hx_id}.settings")

    # -------------------------------------------------------------------------------------------------- a step
    def step(self, closure=None):
        """The inner step (the wrapped optimizer's, on the gradients averaged over this rank's worker); then, where
        the schedule says (consensus.diloco.Schedule), a fragment's exchange starts or its outer update is applied
        (with fragments=1, overlap=0: every inner_steps-th step, the whole model's round)."""
        if self._hx_outer is None:
            self._hx_start()
        self._hx_agree()  # at a step every rank takes, before it counts: a loaded checkpoint's counts are taken on
        if self._hx_pending is not None and self._hx_pending["items"] is None:
            self._hx_launch(self._hx_pending)  # a checkpoint's exchange in flight, started again from its record
        loss = None
        if closure is not None:  # the gradients first: a worker's ranks average them before the inner step
            with torch.enable_grad():
                loss = closure()
            if self._hx_settings.outer == "leader":
                self.report_loss(loss)
        if self._hx_inner_backend is not None:
            self._hx_average_in_group()
        super().step()
        with torch.no_grad():
            self._hx_inner += 1
            schedule, sent = self._hx_settings.schedule, set()
            starts = schedule.starts(self._hx_inner)
            if starts is not None:
                self._hx_launch(self._hx_record(starts))
                if self._hx_settings.is_leader and self._hx_settings.outer == "average":
                    sent = set(self._hx_fragments[starts])  # counted by the plan
            if schedule.applies(self._hx_inner) is not None:
                self._hx_apply()
            # data-parallel SGD's allreduce of this step's gradients, less the tensors the plan counted
            rest = [p for i, p in enumerate(self._hx_params) if i not in sent]
            account_dense_reference(self._hx_stats, sum(p.numel() for p in rest),
                                    sum(p.numel() * p.element_size() for p in rest), self._hx_comm.size)
            self._hx_stats.end_step()
            if self._hx_inner_backend is not None:
                self._hx_inner_stats.end_step()
        return loss

    @torch.no_grad()
    def _hx_average_in_group(self):
        """The worker's gradients: the average over its ranks through inner_compression's plan (a missing
        gradient counts as zeros, as Horovod's DistributedOptimizer sends it)."""
        run = self._hx_inner_run
        for p in self._hx_params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in self._hx_params]
        averaged = exchange(run.driver, self._hx_names, grads, run.counters.step, run.counters.seed,
                            lambda item: item.grad)
        run.counters.step += 1
        for p, g in zip(self._hx_params, averaged):
            if g is not p.grad:
                p.grad.copy_(g)

    @torch.no_grad()
    def _hx_start(self):
        """The outer parameters: rank 0's (one broadcast; every rank continues from them)."""
        for i, p in enumerate(self._hx_params):
            self._hx_comm.broadcast_(p, 0, None, f"horovod_ext.diloco.{self._hx_id}.start.{i}")
        self._hx_outer = [p.detach().float().clone() for p in self._hx_params]

    def _hx_agree(self):
        """The compression plans' settings exchange (every rank, collective), once and after a checkpoint was
        loaded or an elastic reset: each fragment's exchange over all ranks, the inner average's over the worker."""
        on_gpu = bool(self._hx_params) and all(p.is_cuda for p in self._hx_params)
        runs = [(run, backend, None, f"exchange.{f}", fragment) for f, (run, backend, fragment)
                in enumerate(zip(self._hx_runs, self._hx_backends, self._hx_fragments))]
        if self._hx_inner_backend is not None:
            runs.append((self._hx_inner_run, self._hx_inner_backend, self._hx_group_set, "inner",
                         range(len(self._hx_params))))
        for run, backend, process_set, tag, indices in runs:
            if run.agreed:
                continue
            if run.driver is None:
                run.compression = resolved_for(run.compression, "cuda" if on_gpu else "cpu")
            params = [(self._hx_names[i], self._hx_params[i]) for i in indices]
            tensors = [(n, tuple(p.shape), str(p.dtype)) for n, p in params]
            settings = optimizer_settings(describe_compression(run.compression), "average", tensors,
                                          self._hx_comm.group_size(process_set),
                                          __version__, diloco=self._hx_settings.describe())
            blobs = lambda blob, where=process_set, tag=tag: allgather_blobs(  # noqa: E731
                blob, self._hx_comm.numpy_allgather(where), f"horovod_ext.diloco.{self._hx_id}.{tag}")
            run.agree(settings, blobs, backend, [p.numel() for _, p in params])

    def _hx_record(self, fragment):
        """A fragment's exchange as it starts: Delta_m = theta - theta_m over its tensors, and the step its outer
        update is due. With overlap, also what a checkpoint taken while it is in flight needs to start it again
        with the same bits: the pseudo-gradients and the fragment's exchange state from before the launch."""
        indices = self._hx_fragments[fragment]
        deltas = [self._hx_outer[i] - self._hx_params[i].detach().float() for i in indices]
        record = {"fragment": fragment, "due": self._hx_inner + self._hx_settings.overlap, "items": None,
                  "deltas": deltas, "saved": None, "before": None}
        if self._hx_settings.overlap:
            record["saved"] = [d.clone() for d in deltas]
            record["before"] = self._hx_runs[fragment].state_dict(self._hx_comm.rank, self._hx_comm.size)
        return record

    def _hx_launch(self, record):
        """Start a fragment's exchange (a worker's leader: through the plan, over the leaders; Horovod's handles
        stay in flight until _hx_apply waits for them) and count it."""
        run = self._hx_runs[record["fragment"]]
        names = [self._hx_names[i] for i in self._hx_fragments[record["fragment"]]]
        if record["deltas"] is None:  # a checkpoint's record: its saved pseudo-gradients
            record["deltas"] = [d.clone() for d in record["saved"]]
        record["bytes_before"] = self._hx_stats.total["payload_bytes"] + self._hx_stats.current["payload_bytes"]
        record["round"] = run.counters.step
        s = self._hx_settings
        if s.outer == "leader":
            if record.get("best") is None:  # a checkpoint's record keeps the worker it elected
                record["best"], record["joined"] = self._hx_elect()
            self._hx_elected = s.leaders[record["best"]]
            record["items"] = self._hx_leader_launch(run, names, record["deltas"], record["best"],
                                                     record["joined"]) if s.is_leader else []
        else:
            record["items"] = launch_exchange(run.driver, names, record["deltas"], run.counters.step,
                                              run.counters.seed) if s.is_leader else []
        run.counters.step += 1
        self._hx_pending = record

    def report_loss(self, loss):
        """Add this step's training loss (a number or a scalar tensor) to the running average outer="leader" elects
        the best worker by (step(closure) reports the closure's)."""
        self._hx_loss[0] += float(loss.detach()) if torch.is_tensor(loss) else float(loss)
        self._hx_loss[1] += 1

    def _hx_elect(self):
        """outer="leader": every rank's (loss sum, count) since the last election, one small allreduce; the same
        worker elected on every rank (consensus.diloco.elected), and whether some rank has joined; the window
        starts again."""
        s = self._hx_settings
        table = torch.tensor(election_row(self._hx_loss, self._hx_comm.size, self._hx_comm.rank), dtype=torch.float64)
        table = self._hx_comm.allreduce_sum(table, f"horovod_ext.diloco.{self._hx_id}.losses.{s.generation}")
        self._hx_stats.add(**accounting.election_counts(self._hx_comm.size))
        best, joined = elected(table.tolist(), s.workers, self._hx_what, lenient=self._hx_lenient)
        self._hx_loss, self._hx_lenient = [0.0, 0], False
        return best, joined

    def _hx_leader_launch(self, run, names, deltas, best, joined):
        """outer="leader", on a worker's leader: the best worker's leader encodes its pseudo-gradient tensor by tensor
        (the plan's codec with its error feedback, or Horovod's compressor) into one buffer, and one allgather over
        the leaders, to which every other leader contributes nothing, carries it (consensus.diloco.
        leader_transport). One collective per exchange: Horovod 0.28.1 fails ("a tensor with the same name ...
        is currently being processed") when it fuses allgathers that some ranks contribute nothing to. While a rank
        has joined: the float32 values by one allreduce (Sum) with every other leader's zeros."""
        driver, s = run.driver, self._hx_settings
        be, sending = driver.be, self._hx_comm.rank == s.leaders[best]
        driver.begin(run.counters.step, run.counters.seed)  # the codec's draws: this exchange's step and seed
        kind, codec = leader_transport(driver.method, joined)
        items = [driver.item(i, name, d, d.numel(), 4) for i, (name, d) in enumerate(zip(names, deltas))]
        name = f"horovod_ext.diloco.{self._hx_id}.leader.{s.generation}.{names[0]}"
        if kind == "dense":
            flat = torch.cat([d.reshape(-1) for d in deltas])
            flat = flat if sending else torch.zeros_like(flat)
            if sending:
                self._hx_count_transfer(kind, flat.numel() * 4)
            return _LeaderTransfer(items, self._hx_backends[0].allreduce(flat, name, "sum"))
        payloads = []
        for item, d in zip(items, deltas):
            if sending and kind == "codec":
                payloads.append(codec.encode(be, item, codec.prepare(be, item, be.flat32(d)))[0])
            elif sending:
                compressed, item.work = codec.compress(d.reshape(-1))
                payloads.append(compressed)
        buffer = _packed(payloads) if sending else torch.empty(0, dtype=torch.uint8, device=deltas[0].device)
        if sending:
            self._hx_count_transfer(kind, buffer.numel())
        return _LeaderTransfer(items, self._hx_backends[0].allgather(buffer, name), kind)

    def _hx_count_transfer(self, kind, nbytes):
        """The elected leader's transfer of `nbytes` (consensus.diloco_accounting.transfer_wire_per_byte)."""
        wire = nbytes * accounting.transfer_wire_per_byte(kind, len(self._hx_settings.leaders))
        self._hx_stats.add(payload_bytes=nbytes, wire_bytes=wire)

    def _hx_leader_finish(self, run, transfer):
        """The best worker's pseudo-gradient, decoded on every leader."""
        kind, codec = transfer.kind, leader_transport(run.driver.method)[1]
        received = self._hx_backends[0].wait(transfer.future)
        if kind == "dense":
            sizes = [item.numel for item in transfer.items]
            return [v.reshape(item.grad.shape) for v, item in zip(torch.split(received, sizes), transfer.items)]
        out = []
        for item, chunk in zip(transfer.items, _unpacked(received, len(transfer.items))):
            if kind == "codec":
                value = codec.sent(run.driver.be, item, chunk)
            else:
                sample = codec.compress(item.grad.reshape(-1)[:1])  # the compressed dtype and the context
                value = codec.decompress(chunk.clone().view(sample[0].dtype), sample[1])
            out.append(value.reshape(item.grad.shape).float())
        return out

    def _hx_apply(self):
        """The in-flight fragment's outer update: Delta averaged over the workers (the leaders wait for the plan,
        then each leader broadcasts to its group), the outer step on the fragment's outer parameters and momentum,
        and the worker's fragment merged with them (merge_alpha); theta_m = theta with merge_alpha = 0."""
        s, record = self._hx_settings, self._hx_pending
        self._hx_pending = None
        fragment, indices = record["fragment"], self._hx_fragments[record["fragment"]]
        run = self._hx_runs[fragment]

        def across_leaders(values):
            if s.outer == "leader":
                return self._hx_leader_finish(run, record["items"])
            return finish_exchange(run.driver, record["items"], record["round"], lambda item: item.grad)

        def in_group(values):
            leader = s.group[0]
            for i, value in zip(indices, values):
                self._hx_comm.broadcast_(value, leader, self._hx_group_set,
                                         f"horovod_ext.diloco.{self._hx_id}.share.{s.generation}.{i}")
            return values  # counted by compression_stats (consensus.diloco_accounting.share_counts)

        delta = averaged_pseudo_gradient(s, record["deltas"], across_leaders, in_group)
        sent = self._hx_stats.total["payload_bytes"] + self._hx_stats.current["payload_bytes"] - \
            record["bytes_before"]
        self._hx_peak_bytes = max(self._hx_peak_bytes, sent)
        old = [self._hx_outer[i] for i in indices]
        outer, momentum = outer_update(old, [self._hx_momentum[i] for i in indices], delta, s.outer_lr,
                                       s.outer_momentum, s.nesterov)
        self._hx_update_norm = float(torch.sqrt(sum(((new - prev) ** 2).sum(dtype=torch.float64)
                                                    for new, prev in zip(outer, old))))
        for i, theta, b in zip(indices, outer, momentum):
            self._hx_outer[i], self._hx_momentum[i] = theta, b
            p = self._hx_params[i]
            p.copy_(merged(p.detach().float(), theta, s.merge_alpha))
        self._hx_rounds += 1

    # ------------------------------------------------------------------------------------------- observability
    def compression_stats(self):
        """Bytes this rank put on the wire (``total``: the start's broadcast, the rounds' exchanges across workers,
        with groups the averages inside this rank's worker; consensus.diloco_accounting.report) against
        data-parallel SGD's allreduce of the gradients over all ranks at every step; the parts apart (``exchange``,
        ``start``, with groups ``inner``: every step's gradients and the leader's broadcast of each round's average
        inside the worker); the outer rounds and the last outer update's norm; ``workers`` and whether this rank is
        its worker's ``leader``."""
        stats = self._hx_stats.as_dict()
        for run in self._hx_runs:
            stats.update(run.observations())
        s = self._hx_settings
        stats.update(optimizer=self._hx_what, ranks=self._hx_comm.size, inner_steps=s.inner_steps,
                     inner_steps_taken=self._hx_inner, outer_rounds=self._hx_rounds,
                     outer_update_norm=self._hx_update_norm, workers=s.workers, leader=s.is_leader,
                     fragments=[[self._hx_names[i] for i in f] for f in self._hx_fragments], overlap=s.overlap,
                     merge_alpha=s.merge_alpha, peak_exchange_payload_bytes=self._hx_peak_bytes,
                     in_flight=None if self._hx_pending is None else self._hx_pending["fragment"], outer=s.outer,
                     elected=self._hx_elected)
        start = accounting.start_counts(sum(p.numel() * p.element_size() for p in self._hx_params), self._hx_comm.size,
                                        self._hx_comm.rank) if self._hx_outer is not None else accounting.counts(0, 0)
        inner = share = None
        if self._hx_inner_backend is not None:
            inner = self._hx_inner_stats.as_dict()
            share = accounting.share_counts(s, [4 * sum(self._hx_params[i].numel() for i in f)
                                                for f in self._hx_fragments],
                                            accounting.exchanges_started(s.schedule, self._hx_inner))
        return accounting.report(stats, self._hx_comm.size, start, inner, share)

    @contextlib.contextmanager
    def evaluation_parameters(self):
        """Inside the block the model holds the outer parameters (the same on every rank), its own after."""
        if self._hx_outer is None:
            yield
            return
        with torch.no_grad():
            own = [p.detach().clone() for p in self._hx_params]
            for p, theta in zip(self._hx_params, self._hx_outer):
                p.copy_(theta)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, value in zip(self._hx_params, own):
                    p.copy_(value)

    # ------------------------------------------------------------------------------------------- checkpoints
    def _hx_ours(self):
        """DiLoCo's part of state_dict(): inner steps taken, outer parameters and momentum, each fragment's
        exchange (step counter, seed, statistics, this rank's error-feedback residuals), the same of the inner
        average, and the fragment exchange in flight: its pseudo-gradients and its exchange's state from before it
        started (a resumed run starts it again, and reaches the same bits)."""
        clone = lambda values: None if values is None else [None if v is None else v.clone()  # noqa: E731
                                                            for v in values]
        record = self._hx_pending
        runs = [run.state_dict(self._hx_comm.rank, self._hx_comm.size) for run in self._hx_runs]
        pending = None
        if record is not None:  # the statistics are the optimizer's (every fragment's run holds the same object)
            runs[record["fragment"]] = dict(record["before"], stats=self._hx_stats.state())
            pending = {"fragment": record["fragment"], "due": record["due"], "deltas": clone(record["saved"]),
                       "best": record.get("best"), "joined": record.get("joined")}
        return {"inner": self._hx_inner, "outer": clone(self._hx_outer), "momentum": clone(self._hx_momentum),
                "update_norm": self._hx_update_norm, "rounds": self._hx_rounds, "peak_bytes": self._hx_peak_bytes,
                "loss": list(self._hx_loss), "elected": self._hx_elected,
                "pending": pending, "runs": runs,
                "inner_run": self._hx_inner_run.state_dict(self._hx_comm.rank, self._hx_comm.size)}

    def _hx_take(self, ours, copy):
        """Take the state a checkpoint or rank 0 gives (copy: clone the tensors); the exchange in flight is
        started again at the next step from the record, with this rank's own pseudo-gradients where it has the
        same exchange in flight (elastic sync after a restore), else the record's."""
        device = self._hx_params[0].device if self._hx_params else None
        moved = lambda values: None if values is None else [  # noqa: E731
            None if v is None else (v.clone() if copy else v).to(device) for v in values]
        self._hx_inner, self._hx_update_norm = int(ours["inner"]), ours.get("update_norm")
        self._hx_outer, self._hx_momentum = moved(ours["outer"]), moved(ours["momentum"])
        if self._hx_momentum is None:
            self._hx_momentum = [None] * len(self._hx_params)
        self._hx_rounds, self._hx_peak_bytes = int(ours.get("rounds", 0)), int(ours.get("peak_bytes", 0))
        self._hx_elected = ours.get("elected")
        pending, own = ours.get("pending"), self._hx_pending
        if own is not None and own["items"]:
            self._hx_runs[own["fragment"]].forget_in_flight()
        self._hx_pending = None
        if pending is not None:
            same = own is not None and (own["fragment"], own["due"]) == (pending["fragment"], pending["due"])
            saved = own["saved"] if same else moved(pending["deltas"])
            self._hx_pending = {"fragment": int(pending["fragment"]), "due": int(pending["due"]), "items": None,
                                "deltas": None, "saved": saved, "before": None, "best": pending.get("best"),
                                "joined": pending.get("joined")}

    def _hx_load_ours(self, ours):
        self._hx_take(ours, copy=True)
        self._hx_loss = [float(v) for v in ours.get("loss", [0.0, 0])]  # this rank's own window
        for run, state in zip(self._hx_runs, ours["runs"], strict=True):
            run.load_state_dict(state, self._hx_comm.rank, self._hx_comm.size)
        if self._hx_pending is not None:
            self._hx_pending["before"] = ours["runs"][self._hx_pending["fragment"]]
        self._hx_inner_run.load_state_dict(ours["inner_run"], self._hx_comm.rank, self._hx_comm.size)

    def _hx_broadcast_state(self, root_rank):
        """DiLoCo's part of broadcast_optimizer_state: root_rank's inner step count, outer parameters and
        momentum, the exchange in flight and the exchanges' shared state on every rank (residuals stay each
        rank's own)."""
        ours = self._hx_ours()
        shared = {k: v for k, v in ours.items() if k not in ("runs", "inner_run")}
        shared["runs"] = [split_checkpoint(state)[0] for state in ours["runs"]]
        shared["inner_run"] = self._hx_inner_run.shared_state()
        shared = self._hx_comm.broadcast_object(shared, root_rank, f"horovod_ext.diloco.{self._hx_id}.state")
        self._hx_take(shared, copy=False)
        for run, state in zip(self._hx_runs, shared["runs"], strict=True):
            run.offer_shared(state)
        if self._hx_pending is not None:
            before = self._hx_runs[self._hx_pending["fragment"]].state_dict(self._hx_comm.rank, self._hx_comm.size)
            self._hx_pending["before"] = before
        self._hx_inner_run.offer_shared(shared["inner_run"])


def diloco_optimizer(collectives, optimizer, named_parameters, compression, inner_compression, **arguments):
    """`optimizer` wrapped by DiLoCo over an adapter's `collectives`, DiLoCo's arguments checked on every rank
    (compression and inner_compression given: the adapter's none where the user gave none)."""
    wrapped = wrap(DiLoCo, optimizer, collectives)
    wrapped._hx_setup(named_parameters, arguments, compression, inner_compression)
    return wrapped
