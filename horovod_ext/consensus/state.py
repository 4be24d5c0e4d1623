"""What a parameter-space optimizer keeps from one step to the next, in the framework's storage: the step counter,
this rank's loss window (LSGD's election reads it), EASGD's center, and where the sync's shared state is
checkpointed. The step (step.py) owns it and is the only one to change it; the adapters make it
(horovod_ext/torch/leader.py: Python values in the optimizer's state_dict(); horovod_ext/tensorflow/leader.py: the
module's tf.Variables, which a tf.train.Checkpoint holds) and read it for checkpoints and elastic resets.
"""
import abc


class ParameterState(abc.ABC):
    """Values are the framework's (an int or an int64 tensor for the step; tensors for the rest)."""

    @abc.abstractmethod
    def advance_step(self):
        """Count this step (from 1) and return its number (an int, or an int64 tensor in a graph)."""

    @abc.abstractmethod
    def loss_window(self):
        """This rank's (sum, count) of the losses reported since the last election: a float64 tensor [1, 2]."""

    @abc.abstractmethod
    def reset_loss_window(self):
        """Start a new window (after the election read it). Returns what a graph must run, or None."""

    @abc.abstractmethod
    def center(self):
        """EASGD's center variable: a list of tensors, one per parameter (zeros before it is initialized)."""

    @abc.abstractmethod
    def center_ready(self):
        """A truth: the center was initialized."""

    @abc.abstractmethod
    def set_center(self, values):
        """center = values (marks it initialized). Returns what a graph must run, or None."""

    @abc.abstractmethod
    def shared_state_read(self, owner):
        """Called on the host before owner.shared_state() is read: where a checkpoint restores it behind the
        owner's back (a TensorFlow variable), the owner takes it on here."""

    @abc.abstractmethod
    def shared_state_written(self, owner):
        """Called on the host after owner.shared_state() changed: where a checkpoint holds it in a variable
        (TensorFlow), it is stored there."""
