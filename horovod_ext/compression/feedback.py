"""Error feedback as one wrapper around any codec (Seide et al. 2014; Stich et al. 2018; BytePS's ErrorFeedback
decorator, GRACE's Memory):

    g_ef = g + r;   payload = C(g_ef);   r = g_ef - decode(C(g_ef))

A method holds its codec as ``with_feedback(spec, codec)``: the codec itself, or ``ErrorFeedback(codec)`` where the
compressor asks for error feedback. Both answer the same calls (plan.Codec's), so a method never asks which it holds:
``prepare`` gives what is encoded (g, or g + r), ``encode`` keeps r, ``sent_whole`` clears r when g + r is sent
dense, and ``state`` / ``load_state`` / ``reset_all`` carry the residuals through checkpoints and failed steps.
"""


def with_feedback(spec, codec):
    """codec wrapped in error feedback where the compressor's settings ask for it (``error_feedback=True``)."""
    return ErrorFeedback(codec) if getattr(spec, "error_feedback", False) else codec


def fused(be, store, names):
    """One buffer holding the states store[name] for `names`, in order (backend.fused_states), the store's entries
    made its pieces; or None where the backend's states cannot share storage."""
    fused = be.fused_states([store[name] for name in names])
    if fused is None:
        return None
    buffer, pieces = fused
    store.update(zip(names, pieces))
    return buffer


class ErrorFeedback:
    """The residual r per tensor and rank around a codec; every other attribute is the codec's own.

    r is held by the backend (torch: a tensor in state_dict(); TensorFlow: a tf.Variable). Where the codec can, its
    encode returns the remainder g_ef - sent itself, computed where it is exact (top-k: the kept values' rounding
    error, the rest untouched: sent + r == g_ef exactly). Otherwise r = g_ef - sent(payload), the float32 difference
    of g_ef and what the payload stands for (ternary: s * t). That difference is exact wherever nothing is sent
    (t = 0: r = g_ef) and wherever g_ef and s * t are within a factor of two (Sterbenz's lemma); elsewhere it is
    rounded once, to the nearest float32, as any float32 residual must be: s * t + r is then g_ef up to half a unit
    in the last place of r."""

    holds_residuals = True

    def __init__(self, codec):
        self.codec = codec
        self.residuals = {}  # tensor name -> the backend's state of r

    def __getattr__(self, name):  # the wrapped codec's payload size, decode, records and flags
        if name == "codec":  # not set yet (an object being copied)
            raise AttributeError(name)
        return getattr(self.codec, name)

    def _state(self, be, item):
        if item.name not in self.residuals:
            self.residuals[item.name] = be.residual(item.name, item.numel, item)
        return self.residuals[item.name]

    def accumulate(self, be, item, flat):
        """(g_ef, |g_ef|^2): g + r, into r's storage where the framework can (torch), else a new tensor."""
        return be.kernels.ef_accumulate(flat, be.read(self._state(be, item)))

    def prepare(self, be, item, flat):
        """g_ef = g + r, what the codec encodes (the codec may overwrite it: it is r's storage or a new tensor)."""
        return self.accumulate(be, item, flat)[0]

    def encode(self, be, item, g_ef, **options):
        """The codec's payload of g_ef; r = the remainder the codec returned, else g_ef - sent(payload)."""
        payload, remainder = self.codec.encode(be, item, g_ef, **options)
        if remainder is None:
            remainder = be.sub(g_ef, self.codec.sent(be, item, payload))
        self.keep(be, item, remainder)
        return payload, None

    def encode_bucket(self, be, items, flats):
        """A bucket's payloads in one call where the codec encodes buckets (Codec.encodes_buckets): its kernel adds
        each g into r's storage and leaves the remainder there (prepare() and encode() per tensor, the same bits)."""
        return self.codec.encode_bucket(be, items, flats, [be.read(self._state(be, item)) for item in items])

    def fused(self, be, items):
        """One buffer whose consecutive pieces are the items' residuals (feedback.fused), or None."""
        for item in items:
            self._state(be, item)
        return fused(be, self.residuals, [item.name for item in items])

    def keep(self, be, item, remainder):
        """r = remainder (what this step did not send of g_ef; sparse_reduce computes it after its selection)."""
        be.assign(self._state(be, item), remainder)

    def keep_difference(self, be, item, g_ef, sent):
        """r = g_ef - sent, in g_ef's storage (a method that sends an approximation of its own: PowerSGD's P Q^T)."""
        self.keep(be, item, be.sub(g_ef, sent, in_place=True))

    def sent_whole(self, be, item, g_ef):
        """g_ef is sent dense: r = 0 after. Returns g_ef apart from r's storage (torch's g_ef is r's own)."""
        g_ef = be.copy(g_ef)
        be.reset(self._state(be, item))
        return g_ef

    def reset_all(self, be):
        """r = 0 for every tensor (a failed step: no NaN survives in a residual)."""
        for state in self.residuals.values():
            be.reset(state)

    def state(self, be):
        return {name: be.export(state) for name, state in self.residuals.items()}

    def load_state(self, be, residuals):
        for name, values in residuals.items():
            if name not in self.residuals:
                self.residuals[name] = be.imported_residual(name, values)
            else:
                be.assign(self.residuals[name], be.imported(values))
