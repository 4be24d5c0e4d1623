"""Compression statistics, accumulated per step and since the start (framework-free).

Per step a transport records, for each tensor, the bytes this rank contributed (payload), the bytes Horovod's
dense allreduce would have sent of it, the bytes on the wire by the formulas in wire.py, and the seconds spent
compressing, decompressing and waiting on communication. step_seconds is the median wall-clock time between the
ends of the last (up to 256) consecutive steps: what a step costs on this job, evaluation pauses aside.
compute_seconds is the median, over the same steps, of each step's interval less the seconds that step spent
compressing, decompressing and waiting (all of which lie inside the interval, so it is >= 0 and <= the interval):
its forward and backward, which horovod_ext.perfmodel.project() keeps when it predicts the step at other scales.
"""
import collections
import copy
import statistics
import time

SPENT = ("compress_seconds", "decompress_seconds", "comm_seconds")
FIELDS = ("payload_bytes", "dense_bytes", "wire_bytes", "dense_wire_bytes", "elements", "compressed_elements",
          "compress_seconds", "decompress_seconds", "comm_seconds")


def _zero():
    return {f: 0 for f in FIELDS}


class CompressionStats:
    def __init__(self, compression_name, timed=True):
        """timed: whether the framework measures the seconds of SPENT (not TensorFlow, whose step runs as one
        graph): without them compute_seconds is unknown (None)."""
        self.compression = compression_name
        self.timed = timed
        self.steps = 0
        self.total = _zero()
        self.current = _zero()
        self.last = _zero()
        self.extra = {}
        self.intervals = collections.deque(maxlen=256)
        self.computes = collections.deque(maxlen=256)
        self._ended_at = None

    def add(self, **amounts):
        for key, value in amounts.items():
            self.current[key] += value

    def end_step(self):
        now = time.perf_counter()
        if self._ended_at is not None:
            interval = now - self._ended_at
            self.intervals.append(interval)
            self.computes.append(max(interval - sum(self.current[key] for key in SPENT), 0.0))
        self._ended_at = now
        self.last = self.current
        for key in FIELDS:
            self.total[key] += self.current[key]
        self.current = _zero()
        self.steps += 1

    def step_seconds(self):
        """The median wall-clock seconds of a step, from the intervals between step ends (None before two)."""
        return statistics.median(self.intervals) if self.intervals else None

    def compute_seconds(self):
        """The median seconds of a step spent neither compressing nor communicating (None before two steps)."""
        return statistics.median(self.computes) if self.computes and self.timed else None

    @staticmethod
    def _summary(d):
        out = dict(d)
        out["bits_per_element"] = 8.0 * d["payload_bytes"] / d["elements"] if d["elements"] else 0.0
        out["ratio"] = d["dense_bytes"] / d["payload_bytes"] if d["payload_bytes"] else 0.0
        out["wire_ratio"] = d["dense_wire_bytes"] / d["wire_bytes"] if d["wire_bytes"] else 0.0
        return out

    def as_dict(self):
        return {"compression": self.compression, "steps": self.steps, **self.extra,
                "step_seconds": self.step_seconds(), "compute_seconds": self.compute_seconds(),
                "total": self._summary(self.total), "last_step": self._summary(self.last)}

    def state(self):
        return {"steps": self.steps, "total": copy.deepcopy(self.total)}

    def load_state(self, state):
        self.steps = int(state["steps"])
        self.total.update(state["total"])
