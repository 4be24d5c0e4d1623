"""The per-step counts of benchmarks/rounds_worker.py: collectives, dependent rounds and waits (its module docstring
says what each means). Apart from the worker, which wraps Horovod when imported, so that tests can check the
arithmetic."""


class StepCounter:
    """Collectives, depths and waits of the current step (see the module docstring)."""

    def __init__(self):
        self.depth_of = {}
        self.reset()

    def reset(self):
        """A step begins. A collective still in flight from an earlier step (GraVAC's readings) counts as depth 0
        when this step waits for it: it overlapped the step boundary and adds no round to this step."""
        self.depth_of.clear()
        self.collectives = self.waits = self.blocked = 0
        self.reached = 0  # the deepest collective this step has waited for
        self.rounds = 0

    def enqueued(self):
        self.collectives += 1
        depth = self.reached + 1
        self.rounds = max(self.rounds, depth)
        return depth

    def waited(self, depth, blocked):
        self.waits += 1
        self.blocked += int(blocked)
        self.reached = max(self.reached, depth)
